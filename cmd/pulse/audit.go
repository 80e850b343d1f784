package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/pathguard"
)

func init() {
	register(command{
		name:    "audit",
		summary: "check the audit log's hash chain, read its events, export them for a SIEM",
		usage: []string{
			"pulse audit verify [FILE] [--anchor SEQ:HASH]",
			"pulse audit tail [FILE] [-f] [-n N]",
			"pulse audit export --format ocsf|ecs [FILE]",
			"pulse audit keygen [FILE]",
		},
		help: `FILE defaults to the audit log of the workspace (--workspace, default the
current directory): WORKSPACE/.pulse/audit.jsonl. verify exits 0 when the chain is intact and 1 when it is tampered, malformed or
unreadable, naming the first bad seq; it prints an anchor to pass to a later
verify, which then also catches lines cut from the end. tail prints events as
lines (durations in milliseconds); -f follows the log across rotation. export
prints the events as OCSF or ECS JSON lines. keygen writes an HMAC key for the
chain (default file: ~/.config/pulse/audit.key).`,
		subcommands: []string{"verify", "tail", "export", "keygen"},
		run:         runAudit,
	})
}

// tailPoll is how often `audit tail -f` looks for new lines.
var tailPoll = 250 * time.Millisecond

// runAudit implements `pulse audit SUBCOMMAND`. Exit codes: 0 intact (or
// tail ended normally), 1 tampered, malformed or unreadable, 2 usage.
func runAudit(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 {
		return usageError(env, newFlagSet(env, "audit"), "no subcommand given")
	}
	sub := args[0]
	if isHelp(sub) {
		return commandHelp(env, "audit")
	}
	if sub != "verify" && sub != "tail" && sub != "export" && sub != "keygen" {
		return usageError(env, newFlagSet(env, "audit"), fmt.Sprintf("unknown subcommand %q", sub))
	}
	fset := newFlagSet(env, "audit "+sub)
	follow, lines, anchor, format := new(bool), new(int), new(string), new(string)
	if sub == "export" {
		fset.StringVar(format, "format", "", "ocsf or ecs")
	}
	if sub == "verify" {
		fset.StringVar(anchor, "anchor", "", "SEQ:HASH printed by an earlier verify; fail if the log no longer holds that event (catches lines cut from the end)")
	}
	if sub == "tail" {
		fset.BoolVar(follow, "f", false, "keep reading as events are appended (across rotation)")
		fset.IntVar(lines, "n", 10, "show the last N events first (0: none, -1: all)")
	}
	workspace := new(string)
	if sub != "keygen" {
		fset.StringVar(workspace, "workspace", ".", "the workspace whose audit log (.pulse/audit.jsonl) is read when no FILE is given")
	}
	// Flags may come before or after FILE.
	pos, code, done := parseInterleaved(env, fset, args[1:])
	if done {
		return code
	}
	if sub == "keygen" && len(pos) <= 1 {
		return auditKeygen(env, pos)
	}
	if len(pos) == 0 {
		def := filepath.Join(*workspace, pathguard.ReservedDir, "audit.jsonl")
		if _, err := os.Lstat(def); err != nil {
			return usageError(env, fset, fmt.Sprintf("no FILE given and no audit log at %s", def))
		}
		pos = []string{def}
	}
	if len(pos) != 1 {
		return usageError(env, fset, "wants one FILE")
	}
	if sub == "export" {
		return auditExport(ctx, env, pos[0], *format)
	}
	if sub == "verify" {
		var opts []audit.VerifyOption
		if *anchor != "" {
			seqStr, hash, ok := strings.Cut(*anchor, ":")
			seq, err := strconv.ParseUint(seqStr, 10, 64)
			if !ok || err != nil || seq == 0 || len(hash) != 64 {
				fmt.Fprintf(env.stderr, "pulse audit verify: -anchor wants SEQ:HASH (a 64-digit hex hash), got %q\n", *anchor)
				return exitUsage
			}
			opts = append(opts, audit.ExpectAnchor(seq, hash))
		}
		return auditVerify(ctx, env, pos[0], opts...)
	}
	return auditTail(ctx, env, pos[0], *lines, *follow)
}

func auditVerify(ctx context.Context, env *cliEnv, path string, opts ...audit.VerifyOption) int {
	key, err := audit.LoadKey(env.getenv)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse audit verify: %v\n", err)
		return exitFailure
	}
	if key != nil {
		opts = append(opts, audit.VerifyKey(key))
	}
	rep, err := audit.Verify(ctx, path, opts...)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse audit verify: %v\n", err)
		if rep.BadSeq > 0 {
			fmt.Fprintf(env.stderr, "first bad seq: %d (%d events intact before it)\n", rep.BadSeq, rep.Events)
		}
		if errors.Is(err, audit.ErrKeyRequired) {
			fmt.Fprintf(env.stderr, "the key is found in $%s, $%s or %s\n", audit.KeyFileEnv, audit.KeyEnv, audit.DefaultKeyFile(env.getenv))
		}
		return exitFailure
	}
	fmt.Fprintf(env.stdout, "%s: intact: %d events, seq %d..%d, %d file(s)\n", path, rep.Events, rep.FirstSeq, rep.LastSeq, len(rep.Files))
	switch {
	case rep.KeyID != "" && rep.UnkeyedEvents > 0:
		fmt.Fprintf(env.stdout, "keyed with key %s from seq %d (the %d events before it are not keyed)\n", rep.KeyID, rep.FirstSeq+uint64(rep.UnkeyedEvents), rep.UnkeyedEvents)
	case rep.KeyID != "":
		fmt.Fprintf(env.stdout, "keyed with key %s\n", rep.KeyID)
	default:
		fmt.Fprintln(env.stdout, "not keyed: whoever can write the file could rewrite it undetected (pulse audit keygen makes a key)")
	}
	if rep.Head {
		fmt.Fprintf(env.stdout, "head record: seq %d; a cut tail would show\n", rep.HeadSeq)
	} else {
		fmt.Fprintln(env.stdout, "no head record (a log written before head records): lines cut from the end would not show")
	}
	fmt.Fprintf(env.stdout, "anchor: %d:%s\n", rep.LastSeq, rep.LastHash)
	return exitOK
}

// auditKeygen writes a new chain key where LoadKey finds it.
func auditKeygen(env *cliEnv, pos []string) int {
	path := audit.DefaultKeyFile(env.getenv)
	if len(pos) == 1 {
		path = pos[0]
	} else if p := env.getenv(audit.KeyFileEnv); p != "" {
		path = p
	}
	if path == "" {
		fmt.Fprintln(env.stderr, "pulse audit keygen: no HOME or XDG_CONFIG_HOME; name the key file")
		return exitUsage
	}
	k, err := audit.KeyGen(path)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse audit keygen: %v\n", err)
		return exitFailure
	}
	fmt.Fprintf(env.stdout, "wrote audit key %s to %s (mode 0600); keep it outside every workspace\n", k.ID(), path)
	if len(pos) == 1 && env.getenv(audit.KeyFileEnv) != path && audit.DefaultKeyFile(env.getenv) != path {
		fmt.Fprintf(env.stdout, "set %s=%s where pulse runs to use it\n", audit.KeyFileEnv, path)
	}
	return exitOK
}

// auditTail prints the last n events of the live file and, with follow,
// every event appended after them until ctx ends. When the file is
// rotated it reads on through the rotated files it has not seen (several
// rotations may happen between two polls) and then the new live file,
// printing each seq once.
func auditTail(ctx context.Context, env *cliEnv, path string, n int, follow bool) int {
	fail := func(err error) int {
		fmt.Fprintf(env.stderr, "pulse audit tail: %v\n", err)
		return exitFailure
	}
	out := bufio.NewWriter(env.stdout)
	defer out.Flush()
	t := &tailer{out: out}
	f, err := os.Open(path)
	if err != nil {
		return fail(err)
	}
	defer func() { t.close() }()
	t.open(f)

	var first [][]byte
	var firstNo []int
	if err := t.read(func(no int, line []byte) {
		if n == 0 {
			t.seen(line)
			return
		}
		first, firstNo = append(first, line), append(firstNo, no)
		if n > 0 && len(first) > n {
			t.seen(first[0])
			first, firstNo = first[1:], firstNo[1:]
		}
	}); err != nil {
		return fail(err)
	}
	for i, l := range first {
		t.print(firstNo[i], l)
	}
	if !follow {
		if len(t.partial) > 0 {
			fmt.Fprintf(out, "! line %d: incomplete (no newline yet): %q\n", t.lineNo+1, truncate(string(t.partial), 200))
		}
		return exitOK
	}
	out.Flush()
	tick := time.NewTicker(tailPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return exitOK
		case <-tick.C:
		}
		if err := t.read(t.print); err != nil {
			return fail(err)
		}
		st, err := os.Stat(path)
		if err != nil || os.SameFile(st, t.info()) {
			out.Flush()
			continue
		}
		// Rotated: once renamed, nobody appends to the old file, so
		// reading it to the end now gets all of it.
		if err := t.read(t.print); err != nil {
			return fail(err)
		}
		// The files as they stand under the append lock, with the live
		// one open: listing them and then opening the live file by name
		// would skip the segment of a rotation in between.
		snap, err := audit.OpenSnapshot(ctx, path)
		if err != nil {
			if ctx.Err() != nil {
				return exitOK
			}
			return fail(err)
		}
		for _, name := range snap.Rotated() {
			if !rotatedAfter(name, t.lastSeq) {
				continue
			}
			nf, err := os.Open(name)
			if err != nil {
				continue // removed meanwhile
			}
			if cur, err := nf.Stat(); err == nil && os.SameFile(cur, t.info()) {
				nf.Close()
				continue
			}
			t.close()
			t.open(nf)
			if err := t.read(t.print); err != nil {
				snap.Close()
				return fail(err)
			}
		}
		live, _ := snap.Live()
		if live == nil {
			snap.Close()
		} else if cur, err := live.Stat(); err == nil && os.SameFile(cur, t.info()) {
			snap.Close()
		} else {
			t.close()
			t.open(live)
			t.owner = snap // closes live
			fmt.Fprintf(out, "-- %s was rotated; following the new file\n", path)
			if err := t.read(t.print); err != nil {
				return fail(err)
			}
		}
		out.Flush()
	}
}

// rotatedAfter reports whether a rotated file's name says it ends after seq.
func rotatedAfter(name string, seq uint64) bool {
	i := strings.LastIndexByte(name, '.')
	last, err := strconv.ParseUint(name[i+1:], 10, 64)
	return err == nil && last > seq
}

// tailer reads one file of the log at a time, keeping a partial last line
// for the next read and the highest seq printed so far.
type tailer struct {
	out     io.Writer
	f       *os.File
	owner   io.Closer // closes f when set
	fi      os.FileInfo
	br      *bufio.Reader
	partial []byte
	lineNo  int
	lastSeq uint64
}

func (t *tailer) open(f *os.File) {
	t.f, t.owner, t.br, t.lineNo, t.partial = f, nil, bufio.NewReader(f), 0, nil
	t.fi, _ = f.Stat()
}

func (t *tailer) info() os.FileInfo { return t.fi }

func (t *tailer) close() {
	switch {
	case t.owner != nil:
		t.owner.Close()
	case t.f != nil:
		t.f.Close()
	}
	t.f, t.owner = nil, nil
}

func (t *tailer) read(emit func(no int, line []byte)) error {
	for {
		chunk, err := t.br.ReadBytes('\n')
		t.partial = append(t.partial, chunk...)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		t.lineNo++
		line := bytes.TrimSuffix(t.partial, []byte("\n"))
		t.partial = nil
		emit(t.lineNo, line)
	}
}

// seen notes a line's seq without printing it.
func (t *tailer) seen(line []byte) {
	if e, err := audit.ParseLine(line); err == nil && e.Seq > t.lastSeq {
		t.lastSeq = e.Seq
	}
}

func (t *tailer) print(no int, line []byte) {
	if e, err := audit.ParseLine(line); err == nil {
		if e.Seq <= t.lastSeq {
			return
		}
		t.lastSeq = e.Seq
	}
	printEvent(t.out, no, line)
}

// printEvent writes one event on one line for a person to read; a line
// that is not an event is shown quoted, marked with "!".
func printEvent(w io.Writer, no int, line []byte) {
	e, err := audit.ParseLine(line)
	if err != nil {
		var target error = err
		if errors.Is(err, audit.ErrMalformed) {
			target = audit.ErrMalformed
		}
		fmt.Fprintf(w, "! line %d: %v: %q\n", no, target, truncate(string(line), 200))
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s #%d %s", e.Time.UTC().Format("2006-01-02T15:04:05.000Z"), e.Seq, clean(e.Action))
	if e.Decision != "" {
		b.WriteString(" " + clean(e.Decision))
	}
	if e.Target != "" {
		b.WriteString(" " + strconv.Quote(truncate(e.Target, 200)))
	}
	if e.ExitCode != nil {
		fmt.Fprintf(&b, " exit=%d", *e.ExitCode)
	}
	if e.DurationMS != 0 {
		fmt.Fprintf(&b, " %.1fms", e.DurationMS)
	}
	for _, kv := range [][2]string{
		{"isolation", e.IsolationLevel}, {"backend", e.Backend}, {"container", e.ContainerID},
		{"dest", e.Destination}, {"proto", e.Protocol}, {"enforcement", e.EnforcementLevel},
		{"session", e.SessionID}, {"exec", e.ExecutionID}, {"reason", e.Reason},
	} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s=%s", kv[0], clean(kv[1]))
		}
	}
	if e.Port != 0 {
		fmt.Fprintf(&b, " port=%d", e.Port)
	}
	if e.Detail != "" {
		b.WriteString(" — " + clean(truncate(e.Detail, 300)))
	}
	b.WriteByte('\n')
	io.WriteString(w, b.String())
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// clean escapes control characters, so that a logged command cannot move
// the reader's cursor or rewrite their terminal.
func clean(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 }

// auditExport writes every event of the log (rotated files first) as one
// OCSF or ECS JSON object a line. The chain is verified first: a broken
// chain is reported on stderr and the export still runs (exit 1), since
// a SIEM wants even a damaged log's events.
func auditExport(ctx context.Context, env *cliEnv, path, format string) int {
	var conv func(audit.Event, string) map[string]any
	switch format {
	case "ocsf":
		conv = audit.OCSF
	case "ecs":
		conv = audit.ECS
	default:
		fmt.Fprintf(env.stderr, "pulse audit export: --format must be ocsf or ecs, got %q\n", format)
		return exitUsage
	}
	code := exitOK
	key, err := audit.LoadKey(env.getenv)
	var vopts []audit.VerifyOption
	if err == nil && key != nil {
		vopts = append(vopts, audit.VerifyKey(key))
	}
	// One snapshot, verified and exported: a writer appending and
	// rotating meanwhile neither hides events from the export nor adds
	// ones the verification did not see.
	snap, err := audit.OpenSnapshot(ctx, path, vopts...)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse audit export: %v\n", err)
		return exitFailure
	}
	defer snap.Close()
	if _, err := snap.Verify(ctx); err != nil {
		fmt.Fprintf(env.stderr, "pulse audit export: warning: %v\n", err)
		code = exitFailure
	}
	files := snap.Files()
	if len(files) == 0 {
		fmt.Fprintf(env.stderr, "pulse audit export: %s: no log files\n", path)
		return exitFailure
	}
	out := bufio.NewWriter(env.stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	live, liveSize := snap.Live()
	for _, name := range files {
		var r io.Reader
		var f *os.File
		if name == path && live != nil {
			// Only the bytes the snapshot holds: the rest was appended
			// after it, and its last line may still be being written.
			r = io.NewSectionReader(live, 0, liveSize)
		} else {
			if f, err = os.Open(name); err != nil {
				fmt.Fprintf(env.stderr, "pulse audit export: %v\n", err)
				return exitFailure
			}
			r = f
		}
		br := bufio.NewReaderSize(r, 64<<10)
		for no := 1; ; no++ {
			line, err := br.ReadBytes('\n')
			if len(bytes.TrimSpace(line)) > 0 {
				e, perr := audit.ParseLine(line)
				if perr != nil {
					fmt.Fprintf(env.stderr, "pulse audit export: %s:%d: skipped: %v\n", name, no, perr)
					code = exitFailure
				} else if err := enc.Encode(conv(e, version())); err != nil {
					if f != nil {
						f.Close()
					}
					fmt.Fprintf(env.stderr, "pulse audit export: %v\n", err)
					return exitFailure
				}
			}
			if err != nil {
				break
			}
		}
		if f != nil {
			f.Close()
		}
	}
	return code
}

// version is the module version of this binary, for the export's
// product version.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "devel"
}
