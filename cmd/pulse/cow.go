package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
)

func init() {
	register(command{
		name:    "cow",
		summary: "review staged changes: list, diff, commit, discard or reject parts of a transaction or the whole pending stack, squash, undo a commit",
		usage: []string{
			"pulse cow list [--json] [--workspace DIR]",
			"pulse cow diff [ID] [--lane LANE] [--json] [--workspace DIR]",
			"pulse cow commit ID|--all [--lane LANE] [--json] [--workspace DIR]",
			"pulse cow discard ID|--all [--lane LANE] [--json] [--workspace DIR]",
			"pulse cow reject ID PATH... [--json] [--workspace DIR]",
			"pulse cow squash [--lane LANE] [--json] [--workspace DIR]",
			"pulse cow undo [--json] [--workspace DIR]",
			"pulse cow lanes [--json] [--workspace DIR]",
		},
		help: `Exit code 1: a conflict (the file changed since it was staged; nothing is
overwritten), an unknown id, or no staged state in the workspace.
The pending transactions form a stack, oldest first: each command ran on the
ones before it. diff without an ID shows the whole stack against the
workspace; diff ID shows that transaction against the stack below it.
commit --all applies the stack in order as one commit; discard --all drops it;
committing or discarding one transaction alone is refused while another
pending transaction changes the same paths. squash merges the stack into one.
A forked sandbox (SDK: Sandbox.Fork) has a lane of its own: its stack is the
transactions it inherited plus its own. Without --lane the stack commands work
on the default lane (every sandbox made by sandbox.New); --lane LANE on a
fork's stack; list shows each transaction's lane; lanes lists the forks.
--json: list prints an array of {id, lane, description, state, created,
committed, changes, bytes}; lanes an array of {id, parent, forked}; diff {id, changes, diff} (without an ID {stack, diff});
commit {id, committed} (--all {committed_transactions, committed}); discard
{id, discarded} (--all {discarded}); squash {id, squashed}; a failure
{error, exit_code} and, for a conflict, conflict: {path, reason}.`,
		subcommands: []string{"list", "diff", "commit", "discard", "reject", "squash", "undo", "lanes"},
		run:         runCow,
	})
}

// runCow implements `pulse cow SUBCOMMAND`. Exit codes: 0 ok, 1 conflict
// or other failure, 2 usage.
func runCow(ctx context.Context, env *cliEnv, args []string) int {
	a, code, done := parseCowArgs(env, args)
	if done {
		return code
	}
	ws := a.workspace
	if ws == "" {
		wd, err := os.Getwd()
		if err != nil {
			fmt.Fprintf(forTerminal(env.stderr), "pulse cow: %v\n", err)
			return exitFailure
		}
		ws = wd
	}
	// A review command looks; it does not make state where there is
	// none (cowfs.Open would create .pulse/cow in any directory named).
	if _, err := os.Stat(filepath.Join(ws, cowfs.StateDir)); errors.Is(err, fs.ErrNotExist) {
		if a.sub == "list" {
			if a.json {
				fmt.Fprintln(env.stdout, "[]")
			} else {
				fmt.Fprintf(env.stderr, "pulse cow: no transactions in %s (nothing was staged there yet)\n", ws)
			}
			return exitOK
		}
		fmt.Fprintf(env.stderr, "pulse cow: %s has no staged transactions (no %s); is --workspace right?\n", ws, cowfs.StateDir)
		return exitFailure
	}
	c := cowCLI{env: env, json: a.json}
	if a.sub == "list" || a.sub == "diff" || a.sub == "lanes" {
		return c.look(ctx, ws, a)
	}
	return c.decide(ctx, ws, a)
}

// cowArgs is a `pulse cow` command line, checked.
type cowArgs struct {
	sub       string
	json, all bool
	workspace string
	lane      string
	pos       []string // the transaction ID, and reject's PATHs
}

// parseCowArgs parses and checks args; done says the command ends with
// code (help, or a usage error already printed).
func parseCowArgs(env *cliEnv, args []string) (a cowArgs, code int, done bool) {
	if len(args) == 0 {
		return a, usageError(env, newFlagSet(env, "cow"), "no subcommand given"), true
	}
	a.sub = args[0]
	if isHelp(a.sub) {
		return a, commandHelp(env, "cow"), true
	}
	sub := a.sub
	wantID := map[string]bool{"diff": true, "commit": true, "discard": true}
	if !wantID[sub] && sub != "list" && sub != "undo" && sub != "reject" && sub != "squash" && sub != "lanes" {
		return a, usageError(env, newFlagSet(env, "cow"), fmt.Sprintf("unknown subcommand %q", sub)), true
	}
	fset := newFlagSet(env, "cow "+sub)
	fset.BoolVar(&a.json, "json", false, "print JSON")
	fset.StringVar(&a.workspace, "workspace", "", "workspace directory (default: the current directory)")
	fset.BoolVar(&a.all, "all", false, "commit or discard the whole pending stack, in order")
	fset.StringVar(&a.lane, "lane", "", "the lane (a forked sandbox's) whose stack diff, commit --all, discard --all and squash work on")
	// Flags may come before or after the id.
	pos, code, done := parseInterleaved(env, fset, args[1:])
	if done {
		return a, code, true
	}
	a.pos = pos
	problem := ""
	switch {
	case sub == "reject" && len(pos) < 2:
		problem = "wants a transaction ID and the PATHs to reject"
	case a.all && (sub != "commit" && sub != "discard"):
		problem = "--all is for commit and discard"
	case a.lane != "" && sub != "diff" && sub != "squash" && !a.all:
		problem = "--lane is for diff, squash, commit --all and discard --all"
	case a.all && len(pos) != 0:
		problem = "wants a transaction ID or --all, not both"
	case wantID[sub] && !a.all && len(pos) != 1 && !(sub == "diff" && len(pos) == 0):
		problem = "wants one transaction ID"
	case !wantID[sub] && sub != "reject" && len(pos) != 0:
		problem = fmt.Sprintf("unexpected argument %q", pos[0])
	}
	if problem != "" {
		return a, usageError(env, fset, problem), true
	}
	return a, 0, false
}

// look runs list, diff and lanes: looking changes nothing and is not
// audited.
func (c cowCLI) look(ctx context.Context, ws string, a cowArgs) int {
	var f *cowfs.FS
	// In the daemon, a sandbox held for the workspace already has its
	// store open (the default lane's); a look opens none of its own.
	if sb, release := c.held(ws, a); sb != nil {
		defer release()
		f = sb.ReviewAs(sandbox.ViaCLI, "").FS()
	} else {
		var err error
		if f, err = cowfs.Open(ctx, ws, cowfs.WithLane(a.lane)); err != nil {
			fmt.Fprintf(forTerminal(c.env.stderr), "pulse cow: %v\n", err)
			return exitFailure
		}
		defer f.Close()
	}
	if rerr := f.RecoveryErr(); rerr != nil {
		fmt.Fprintf(forTerminal(c.env.stderr), "pulse cow: warning: %v\n", rerr)
	}
	switch a.sub {
	case "list":
		return c.list(ctx, f)
	case "lanes":
		return c.lanes(ctx, f)
	}
	if handled, code := c.stackDiff(ctx, f, a.pos); handled {
		return code
	}
	tx, err := f.Tx(ctx, a.pos[0])
	if err != nil {
		return c.fail(err)
	}
	d, err := tx.Diff(ctx)
	if err != nil {
		return c.fail(err)
	}
	changes := tx.Changes()
	hostRun := runsOnHost(changes)
	out := map[string]any{"id": tx.ID(), "changes": changes, "diff": d}
	if len(hostRun) > 0 {
		out["runs_on_host"] = hostRun
	}
	return c.print(out, hostRunWarning(hostRun)+modeChangeWarning(changes)+d)
}

// decide runs commit, discard, reject, squash and undo, through the
// facade's one audited review path.
func (c cowCLI) decide(ctx context.Context, ws string, a cowArgs) int {
	r, done, err := c.review(ctx, ws, a)
	if err != nil {
		fmt.Fprintf(forTerminal(c.env.stderr), "pulse cow: %v\n", err)
		return exitFailure
	}
	defer done()
	if rerr := r.FS().RecoveryErr(); rerr != nil {
		fmt.Fprintf(forTerminal(c.env.stderr), "pulse cow: warning: %v\n", rerr)
	}
	switch {
	case a.sub == "commit" && a.all:
		paths, ids, err := r.CommitAll(ctx)
		if err != nil {
			return c.fail(err)
		}
		return c.print(map[string]any{"committed_transactions": nonNil(ids), "committed": nonNil(paths)},
			fmt.Sprintf("committed the pending stack (%d transaction(s)): %d change(s)\n%s", len(ids), len(paths), lines(paths)))
	case a.sub == "discard" && a.all:
		ids, err := r.DiscardAll(ctx)
		if err != nil {
			return c.fail(err)
		}
		return c.print(map[string]any{"discarded": nonNil(ids)}, fmt.Sprintf("discarded %d transaction(s)\n%s", len(ids), lines(ids)))
	case a.sub == "squash":
		id, gone, err := r.Squash(ctx)
		if err != nil {
			return c.fail(err)
		}
		return c.print(map[string]any{"id": id, "squashed": nonNil(gone)},
			fmt.Sprintf("squashed %d transaction(s) into %s\n", len(gone), id))
	}
	pos := a.pos
	switch a.sub {
	case "undo":
		info, err := r.Undo(ctx)
		if err != nil {
			return c.fail(err)
		}
		return c.print(info, fmt.Sprintf("undid %s (%s)\n", info.ID, info.Description))
	case "commit":
		prog := newProgress(c.env)
		prog.set("committing " + pos[0])
		paths, err := r.Commit(ctx, pos[0])
		prog.close()
		if err != nil {
			return c.fail(err)
		}
		if paths == nil {
			paths = []string{}
		}
		return c.print(map[string]any{"id": pos[0], "committed": paths},
			fmt.Sprintf("committed %s: %d change(s)\n%s", pos[0], len(paths), lines(paths)))
	case "reject":
		gone, err := r.Reject(ctx, pos[0], pos[1:])
		if err != nil {
			return c.fail(err)
		}
		return c.print(map[string]any{"id": pos[0], "rejected": gone},
			fmt.Sprintf("rejected from %s: %d change(s)\n%s", pos[0], len(gone), lines(gone)))
	default: // discard
		if err := r.Discard(ctx, pos[0]); err != nil {
			return c.fail(err)
		}
		return c.print(map[string]any{"id": pos[0], "discarded": true}, "discarded "+pos[0]+"\n")
	}
}

// held returns, in the daemon, a sandbox held for workspace ws when a
// is for the default lane (a held sandbox's store is that lane's); nil
// otherwise.
func (c cowCLI) held(ws string, a cowArgs) (*sandbox.Sandbox, func()) {
	if c.env.hold == nil || a.lane != "" {
		return nil, nil
	}
	sb, release := c.env.hold.lookup(workspaceID(ws))
	if sb == nil {
		return nil, nil
	}
	return sb, func() { _ = release() }
}

// review returns the review path of a decision. In the daemon, while
// it holds a sandbox for the workspace, it is that sandbox's, so the
// decision is made through the store, audit writer and locks the
// workspace's commands, MCP sessions and review page use, as one writer
// of the audit chain. Otherwise, and for a fork's lane, the staged state
// and audit log are opened for this command alone: none is opened for
// it (a decision needs no backend, and choosing one, Docker perhaps,
// would cost the command more than it does).
func (c cowCLI) review(ctx context.Context, ws string, a cowArgs) (*sandbox.Review, func(), error) {
	if sb, release := c.held(ws, a); sb != nil {
		return sb.ReviewAs(sandbox.ViaCLI, ""), release, nil
	}
	r, err := sandbox.OpenReview(ctx, ws, sandbox.ReviewVia(sandbox.ViaCLI), reviewEnv(c.env), sandbox.ReviewLane(a.lane))
	if err != nil {
		return nil, nil, err
	}
	return r, func() { _ = r.Close() }, nil
}

// reviewEnv makes the review find the audit key through the command's
// environment.
func reviewEnv(env *cliEnv) sandbox.ReviewOption { return sandbox.ReviewGetenv(env.getenv) }

type cowCLI struct {
	env  *cliEnv
	json bool
}

func lines(ss []string) string {
	if len(ss) == 0 {
		return ""
	}
	return strings.Join(ss, "\n") + "\n"
}

func (c cowCLI) print(v any, text string) int {
	if c.json {
		enc := json.NewEncoder(c.env.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			fmt.Fprintf(c.env.stderr, "pulse cow: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	io.WriteString(forTerminal(c.env.stdout), text)
	return exitOK
}

// fail reports err; with --json the error (and, for a conflict, its path
// and reason) is printed as JSON on stdout as well.
func (c cowCLI) fail(err error) int {
	fmt.Fprintf(forTerminal(c.env.stderr), "pulse cow: %v\n", err)
	if c.json {
		out := map[string]any{"error": err.Error()}
		var ce *cowfs.ConflictError
		if errors.As(err, &ce) {
			out["conflict"] = ce
		}
		json.NewEncoder(c.env.stdout).Encode(out)
	}
	return exitFailure
}

func (c cowCLI) list(ctx context.Context, f *cowfs.FS) int {
	infos, err := f.List(ctx)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		if infos == nil {
			infos = []cowfs.TxInfo{}
		}
		return c.print(infos, "")
	}
	tw := tabwriter.NewWriter(forTerminal(c.env.stdout), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tCHANGES\tBYTES\tCREATED\tDESCRIPTION")
	for _, i := range infos {
		desc := i.Description
		if i.Lane != cowfs.DefaultLane {
			desc += " [lane " + i.Lane + "]"
		}
		if i.Reason != "" {
			desc += " [" + i.Reason + "]"
		}
		if i.State == cowfs.StateOpen {
			if tx, err := f.Tx(ctx, i.ID); err == nil && len(runsOnHost(tx.Changes())) > 0 {
				desc += " [runs on the host: read it with pulse cow diff]"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", i.ID, i.State, i.Changes+i.Whiteouts, i.Bytes,
			i.Created.Local().Format(time.DateTime), desc)
	}
	tw.Flush()
	return exitOK
}

// lanes lists the forked lanes.
func (c cowCLI) lanes(ctx context.Context, f *cowfs.FS) int {
	ls, err := f.Lanes(ctx)
	if err != nil {
		return c.fail(err)
	}
	if c.json {
		if ls == nil {
			ls = []cowfs.LaneInfo{}
		}
		return c.print(ls, "")
	}
	tw := tabwriter.NewWriter(forTerminal(c.env.stdout), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tPARENT\tFORKED")
	for _, l := range ls {
		parent, forked := l.Parent, l.Forked.Local().Format(time.DateTime)
		if parent == cowfs.DefaultLane {
			parent = "default"
		}
		if l.Err != "" {
			parent, forked = "?", "damaged: "+l.Err
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", l.ID, parent, forked)
	}
	tw.Flush()
	return exitOK
}

// runsOnHost lists the changes git on the host would take as instructions
// (hooks, config; see policy.RunsOnHost). Directories made only to hold
// another path are left out: their contents are listed themselves.
func runsOnHost(changes []cowfs.Change) []string {
	var out []string
	for _, ch := range changes {
		if !ch.Implicit && policy.RunsOnHost(ch.Path) {
			out = append(out, ch.Path)
		}
	}
	return out
}

// hostRunWarning is the banner `pulse cow diff` and `pulse exec` print
// above a diff that changes what git runs on the host, so that a person
// reads those paths before committing ("" when there are none).
func hostRunWarning(paths []string) string {
	if len(paths) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("WARNING: this transaction changes what git runs on the host: the next git command here\n" +
		"would run what the sandboxed command wrote. Auto-commit never applies these; read them first.\n")
	for _, p := range paths {
		fmt.Fprintf(&b, "  %s  (runs on the host)\n", p)
	}
	b.WriteString("\n")
	return b.String()
}

// modeChangeWarning is the banner `pulse cow diff` prints above a diff
// that changes the permission bits of files or directories the workspace
// has: a chmod is one line in a long diff, and a widened one (a file or
// directory others may write) is how another local user gets in ("" when
// there is none).
func modeChangeWarning(changes []cowfs.Change) string {
	var b strings.Builder
	for _, ch := range changes {
		if !ch.ModeChanged {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("MODE CHANGE: this transaction changes the permission bits of what the workspace has:\n")
		}
		old, nw := fsmode.ToUnix(ch.OldMode), fsmode.ToUnix(ch.Mode)
		fmt.Fprintf(&b, "  %s  %04o -> %04o", ch.Path, old, nw)
		if w := nw &^ old & 0o022; w != 0 {
			b.WriteString("  (now writable by " + writers(w) + ")")
		}
		b.WriteString("\n")
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}

// writers names who the write bits w (0o020, 0o002) let write.
func writers(w uint32) string {
	switch w & 0o022 {
	case 0o022:
		return "group and others"
	case 0o020:
		return "group"
	}
	return "others"
}

func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

// stackDiff shows the whole pending stack (no id) or a pending
// transaction against the stack below it. handled is false for a
// transaction not in the stack (a quarantined one), shown on its own.
func (c cowCLI) stackDiff(ctx context.Context, f *cowfs.FS, pos []string) (bool, int) {
	st, err := f.Stack(ctx)
	if err != nil {
		return true, c.fail(err)
	}
	for _, d := range st.Damaged {
		fmt.Fprintf(forTerminal(c.env.stderr), "pulse cow: warning: transaction %s is left out of the stack: %v\n", d.ID, d.Err)
	}
	if len(pos) == 0 {
		d, err := st.Diff()
		if err != nil {
			return true, c.fail(err)
		}
		ids := make([]string, 0, len(st.Txs))
		var changes []cowfs.Change
		for _, t := range st.Txs {
			ids = append(ids, t.ID)
			if tx, err := f.Tx(ctx, t.ID); err == nil {
				changes = append(changes, tx.Changes()...)
			}
		}
		hostRun := runsOnHost(changes)
		out := map[string]any{"stack": ids, "diff": d}
		if len(hostRun) > 0 {
			out["runs_on_host"] = hostRun
		}
		return true, c.print(out, hostRunWarning(hostRun)+modeChangeWarning(changes)+d)
	}
	// A transaction of any lane, against the stack below it in its lane.
	if d, err := st.TxDiff(pos[0]); err == nil {
		tx, err := f.Tx(ctx, pos[0])
		if err != nil {
			return true, c.fail(err)
		}
		changes := tx.Changes()
		hostRun := runsOnHost(changes)
		out := map[string]any{"id": pos[0], "changes": changes, "diff": d, "relative_to": "the pending stack below it"}
		if len(hostRun) > 0 {
			out["runs_on_host"] = hostRun
		}
		return true, c.print(out, hostRunWarning(hostRun)+modeChangeWarning(changes)+d)
	}
	return false, 0
}
