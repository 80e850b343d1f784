package cowfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Numbered failpoints of the commit protocol, in the order a commit
// passes them. failpointHook is nil outside tests; the crash tests set it
// in a re-executed test binary to SIGKILL the process at one of them.
const (
	fpValidated      = iota + 1 // conflicts checked, previous bytes saved
	fpWALTemp                   // wal.tmp written and fsynced
	fpWALRenamed                // wal in place (the commit point), directory not yet fsynced
	fpWALSynced                 // wal durable
	fpApplyRemoved              // one entry moved aside and checked (hit once per removal)
	fpApplyTemp                 // one temp file written (hit once per write)
	fpApplyRenamed              // one file or symlink published (hit once per write or symlink)
	fpApplied                   // every change applied and durable
	fpAfterWritten              // after-images written
	fpDone                      // transaction moved into the undo journal
	fpApplyMkdir                // a new directory made under its temp name with its mode, not renamed
	fpApplySynced               // every new file written and durable, none published
	fpApplyExchanged            // one file exchanged with its target, the displaced one not yet checked
	fpCleaned                   // the entries moved aside removed, after-images not written
	fpApplyChecked              // one target checked once more, right before it is exchanged
	numFailpoints    = fpApplyChecked
)

// Failpoints of staging, numbered apart from the commit protocol's.
const (
	fpStageBlob      = 101 // the staged bytes are stored, the log record is not appended
	fpStageAppended  = 102 // the log record is appended and fsynced (also ends a batch)
	fpBatchPacked    = 103 // a batch's pack file is durable, no record appended
	fpBatchTorn      = 104 // all but the last record of a batch written, not fsynced
	fpStageLogSynced = 105 // the log record is durable, its seal not yet updated
	fpBatchStreamed  = 106 // a streamed op's temp blob is durable, not yet named
)

var failpointHook func(fp int)

func failpoint(fp int) {
	if failpointHook != nil {
		failpointHook(fp)
	}
}

// FailpointEnv names the environment variable that makes a process using
// cowfs kill itself (SIGKILL) at a named step of a commit or a staging
// call, so that crash tests outside the package (a CLI, another
// language's harness) can stop it anywhere: "NAME" or "NAME:N" for the
// N-th time the step is reached (1 by default). The names are those of
// FailpointNames. An unknown name stops the process at start-up rather
// than let a crash test pass without crashing.
const FailpointEnv = "PULSE_COWFS_FAILPOINT"

// FailpointNames lists the steps FailpointEnv can name, in protocol
// order, with the failpoint number the package documentation uses.
var FailpointNames = []struct {
	Name   string
	Number int
}{
	{"validated", fpValidated}, {"wal-temp", fpWALTemp}, {"wal-renamed", fpWALRenamed}, {"wal-synced", fpWALSynced},
	{"apply-removed", fpApplyRemoved}, {"apply-mkdir", fpApplyMkdir}, {"apply-temp", fpApplyTemp},
	{"apply-synced", fpApplySynced}, {"apply-checked", fpApplyChecked}, {"apply-exchanged", fpApplyExchanged},
	{"apply-renamed", fpApplyRenamed}, {"applied", fpApplied}, {"cleaned", fpCleaned},
	{"after-written", fpAfterWritten}, {"done", fpDone},
	{"stage-blob", fpStageBlob}, {"stage-appended", fpStageAppended}, {"batch-packed", fpBatchPacked}, {"batch-torn", fpBatchTorn},
	{"stage-log-synced", fpStageLogSynced}, {"batch-streamed", fpBatchStreamed},
}

func init() {
	v := os.Getenv(FailpointEnv)
	if v == "" {
		return
	}
	name, hitStr, _ := strings.Cut(v, ":")
	hit := 1
	if hitStr != "" {
		n, err := strconv.Atoi(hitStr)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "cowfs: %s=%q: bad hit count\n", FailpointEnv, v)
			os.Exit(2)
		}
		hit = n
	}
	fp := 0
	for _, n := range FailpointNames {
		if n.Name == name {
			fp = n.Number
		}
	}
	if fp == 0 {
		fmt.Fprintf(os.Stderr, "cowfs: %s=%q: no such failpoint\n", FailpointEnv, v)
		os.Exit(2)
	}
	var seen atomic.Int64
	failpointHook = func(n int) {
		if n == fp && seen.Add(1) == int64(hit) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}

// failpointName returns the FailpointEnv name of failpoint fp.
func failpointName(fp int) string {
	for _, n := range FailpointNames {
		if n.Number == fp {
			return n.Name
		}
	}
	return strconv.Itoa(fp)
}

// walFile is a decoded WAL: everything needed to roll a commit forward
// without the stage log.
type walFile struct {
	ID      string
	Desc    string
	Created int64
	Undoes  string
	Ops     []walOp
}

type walOp struct {
	change
	// Prev is true when the previous content was saved as prev/<index>.
	Prev bool
}

type walRec struct {
	T       string  `json:"t"` // header, op, end
	V       int     `json:"v,omitempty"`
	Tx      string  `json:"tx,omitempty"`
	Desc    string  `json:"desc,omitempty"`
	Created int64   `json:"created,omitempty"`
	Undoes  string  `json:"undoes,omitempty"`
	N       int     `json:"n,omitempty"`
	I       int     `json:"i,omitempty"`
	Change  *change `json:"change,omitempty"`
	Prev    bool    `json:"prev,omitempty"`
}

const walVersion = 1

func encodeWAL(w *walFile) ([]byte, error) {
	var buf []byte
	add := func(r walRec) error {
		p, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf = appendFrame(buf, p)
		return nil
	}
	if err := add(walRec{T: "header", V: walVersion, Tx: w.ID, Desc: w.Desc, Created: w.Created, Undoes: w.Undoes, N: len(w.Ops)}); err != nil {
		return nil, err
	}
	for i := range w.Ops {
		c := w.Ops[i].change
		if err := add(walRec{T: "op", I: i, Change: &c, Prev: w.Ops[i].Prev}); err != nil {
			return nil, err
		}
	}
	if err := add(walRec{T: "end", N: len(w.Ops)}); err != nil {
		return nil, err
	}
	return buf, nil
}

// decodeWAL parses and checks a WAL. It trusts nothing: every frame must
// be whole and pass its checksum, the op count must match the header and
// the end record, and every path must be clean, relative and outside
// .pulse. Any fault is an error; a WAL is never partially applied.
func decodeWAL(b []byte) (*walFile, error) {
	frames, _, err := decodeFrames(b)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	if len(frames) < 2 {
		return nil, fmt.Errorf("wal: %w: %d records", errCorrupt, len(frames))
	}
	recs := make([]walRec, len(frames))
	for i, p := range frames {
		if err := json.Unmarshal(p, &recs[i]); err != nil {
			return nil, fmt.Errorf("wal: %w: record %d: %v", errCorrupt, i, err)
		}
	}
	h := recs[0]
	if h.T != "header" || h.V != walVersion || !validID(h.Tx) {
		return nil, fmt.Errorf("wal: %w: bad header", errCorrupt)
	}
	if h.Undoes != "" {
		if _, _, ok := parseDone(h.Undoes); !ok {
			return nil, fmt.Errorf("wal: %w: bad undo target %q", errCorrupt, h.Undoes)
		}
	}
	if h.N != len(recs)-2 {
		return nil, fmt.Errorf("wal: %w: header says %d ops, found %d records", errCorrupt, h.N, len(recs))
	}
	end := recs[len(recs)-1]
	if end.T != "end" || end.N != h.N {
		return nil, fmt.Errorf("wal: %w: missing or bad end record", errCorrupt)
	}
	w := &walFile{ID: h.Tx, Desc: h.Desc, Created: h.Created, Undoes: h.Undoes, Ops: make([]walOp, 0, h.N)}
	seen := make(map[string]bool, h.N)
	for i, r := range recs[1 : len(recs)-1] {
		if r.T != "op" || r.I != i || r.Change == nil {
			return nil, fmt.Errorf("wal: %w: bad op record %d", errCorrupt, i)
		}
		if err := checkChange(r.Change); err != nil {
			return nil, fmt.Errorf("wal: op %d: %w", i, err)
		}
		if seen[r.Change.Path] {
			return nil, fmt.Errorf("wal: %w: %q appears twice", errCorrupt, r.Change.Path)
		}
		seen[r.Change.Path] = true
		if r.Prev && r.Change.Before.Type != typeFile {
			return nil, fmt.Errorf("wal: %w: op %d saves previous bytes of a %q", errCorrupt, i, r.Change.Before.Type)
		}
		w.Ops = append(w.Ops, walOp{change: *r.Change, Prev: r.Prev})
	}
	if err := checkShape(w.Ops); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	return w, nil
}

// checkShape refuses a set of changes that creates something beneath a
// path it makes a file, symlink or deletion. Staging never produces one
// (the parents of a created path are staged as directories), but applied
// in order it would create the entry through the new symlink, somewhere
// else than its path says, and a link's ".." would climb from there.
func checkShape(ops []walOp) error {
	kind := make(map[string]ChangeKind, len(ops))
	for i := range ops {
		kind[ops[i].Path] = ops[i].Kind
	}
	for i := range ops {
		if ops[i].Kind == KindDelete {
			continue
		}
		for _, a := range ancestors(ops[i].Path) {
			if k, ok := kind[a]; ok && k != KindMkdir {
				return fmt.Errorf("%w: %q is created beneath a %s of %q", errCorrupt, ops[i].Path, k, a)
			}
		}
	}
	return nil
}

// checkLinks applies the symlink target rule (checkLinkTarget) again to
// every link a commit would write: the stage log and the WAL are files
// anyone with access to .pulse/cow can edit, so what was checked when a
// link was staged is not trusted later. The one exception is an undo
// restoring the link its commit replaced, whatever that link's target:
// the workspace held it before, and undo must give it back. When the
// undone entry is gone (a crash after the undo dropped it), such a link
// is accepted only where it is already in place, so nothing is written.
func (f *FS) checkLinks(w *walFile, recovering bool) error {
	var restorable map[string]string
	for i := range w.Ops {
		op := &w.Ops[i]
		if op.Kind != KindSymlink {
			continue
		}
		err := checkLinkTarget(op.Path, op.Target)
		if err == nil || w.Undoes == "" {
			if err != nil {
				return fmt.Errorf("cowfs: %q: %w", op.Path, err)
			}
			continue
		}
		if restorable == nil {
			restorable = f.replacedLinks(w.Undoes)
		}
		if t, ok := restorable[op.Path]; ok && t == op.Target {
			continue
		}
		if recovering {
			if cur, serr := f.ws.snap(op.Path, nil); serr == nil && matchesAfter(op, cur) {
				continue
			}
		}
		return fmt.Errorf("cowfs: %q: %w (and undo of %s did not replace such a link)", op.Path, err, w.Undoes)
	}
	return nil
}

// replacedLinks returns the targets of the symlinks the done entry name
// replaced or removed, by path; empty if the entry is gone or damaged.
func (f *FS) replacedLinks(name string) map[string]string {
	out := map[string]string{}
	b, err := f.state.ReadFile("done/" + name + "/wal")
	if err != nil {
		return out
	}
	w, err := decodeWAL(b)
	if err != nil {
		return out
	}
	for i := range w.Ops {
		if w.Ops[i].Before.Type == typeSymlink {
			out[w.Ops[i].Path] = w.Ops[i].Before.Target
		}
	}
	return out
}

// removesFirst reports whether applying op removes the entry at its path
// before anything is created there.
func removesFirst(op *walOp) bool {
	switch {
	case op.Kind == KindDelete:
		return true
	case op.Kind == KindMkdir:
		return op.Before.Type == typeFile || op.Before.Type == typeSymlink
	default:
		return op.Before.Type == typeDir
	}
}

func matchesAfter(op *walOp, cur snapshot) bool {
	switch op.Kind {
	case KindDelete:
		return cur.Type == typeAbsent
	case KindWrite:
		return cur.Type == typeFile && cur.SHA == op.Blob && cur.Mode == op.Mode
	case KindSymlink:
		return cur.Type == typeSymlink && cur.Target == op.Target
	case KindMkdir:
		// An implicit directory that existed keeps its mode; one the
		// commit creates must have the staged mode to count as done.
		return cur.Type == typeDir && (op.Implicit && op.Before.Type == typeDir || cur.Mode == op.Mode)
	}
	return false
}

// Commit applies the transaction to the workspace, or refuses with an
// error wrapping ErrConflict and writes nothing. The protocol (see the
// package documentation) holds the workspace lock throughout, so commits
// of two processes never interleave, and is safe against a crash at any
// point: the next Open rolls it forward. Commit returns the paths changed.
func (t *Tx) Commit(ctx context.Context) ([]string, error) {
	unlock, err := t.fs.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	paths, err := t.commitLocked(ctx)
	if err == nil {
		t.fs.account(t.id, 0, false)
	}
	return paths, err
}

func (t *Tx) commitLocked(ctx context.Context) ([]string, error) {
	if err := t.refreshLocked(true); err != nil {
		return nil, err
	}
	f := t.fs
	t.mu.Lock()
	w := &walFile{ID: t.id, Desc: t.desc, Created: t.created.UnixNano(), Undoes: t.undoes}
	for _, c := range t.changes {
		w.Ops = append(w.Ops, walOp{change: *c})
	}
	t.mu.Unlock()
	sort.Slice(w.Ops, func(i, j int) bool { return w.Ops[i].Path < w.Ops[j].Path })
	if err := checkShape(w.Ops); err != nil {
		return nil, fmt.Errorf("cowfs: commit %s: staged changes: %w", t.id, err)
	}
	if err := f.checkLinks(w, false); err != nil {
		return nil, fmt.Errorf("cowfs: commit %s refused: %w", t.id, err)
	}

	dir := t.dir()
	f.state.RemoveAll(dir + "/prev")
	if err := f.state.Mkdir(dir+"/prev", 0o700); err != nil {
		return nil, fmt.Errorf("cowfs: commit: %w", err)
	}
	fail := func(err error) ([]string, error) {
		f.state.RemoveAll(dir + "/prev")
		return nil, err
	}
	f.state.Remove(dir + "/failed")
	for i := range w.Ops {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		op := &w.Ops[i]
		// The before bytes are kept (for undo and rollback) when the
		// file is replaced, as a link to the replaced inode: nothing is
		// copied here, only hashed.
		op.Prev = op.Before.Type == typeFile
		cur, err := f.ws.snap(op.Path, nil)
		if err != nil {
			return fail(fmt.Errorf("cowfs: commit: %q: %w", op.Path, err))
		}
		if op.Implicit && cur.Type == typeDir {
			// Someone made the directory meanwhile; writing into it is
			// fine, and undo will leave it alone.
			op.Before = cur
			continue
		}
		if reason := compare(op.Before, cur); reason != "" {
			return fail(conflict(op.Path, reason))
		}
	}
	if err := f.checkStructure(w); err != nil {
		return fail(err)
	}
	// The staged bytes must all be there and whole before the commit
	// point: past it, a missing or damaged blob would leave the commit
	// half applied.
	if err := f.checkBlobs(dir, w.Ops); err != nil {
		return fail(fmt.Errorf("cowfs: commit %s refused: %w", t.id, err))
	}
	if err := f.checkSpace(w); err != nil {
		return fail(fmt.Errorf("cowfs: commit %s refused: %w", t.id, err))
	}
	if err := f.syncState(dir + "/prev"); err != nil {
		return fail(err)
	}
	failpoint(fpValidated)

	b, err := encodeWAL(w)
	if err != nil {
		return fail(err)
	}
	if err := f.writeFileSync(dir+"/wal.tmp", b); err != nil {
		return fail(fmt.Errorf("cowfs: commit: %w", err))
	}
	failpoint(fpWALTemp)
	if err := f.state.Rename(dir+"/wal.tmp", dir+"/wal"); err != nil {
		return fail(fmt.Errorf("cowfs: commit: %w", err))
	}
	failpoint(fpWALRenamed)
	// From here on the commit happens. If applying fails (a full disk,
	// damaged bytes, a change racing in), everything is rolled back and
	// the transaction is pending again; if even that fails, the WAL stays
	// for the next Open to roll forward.
	interrupted := func(err error) ([]string, error) {
		return nil, fmt.Errorf("cowfs: commit %s interrupted (Open rolls it forward): %w", t.id, err)
	}
	if err := f.syncState(dir); err != nil {
		return interrupted(err)
	}
	failpoint(fpWALSynced)
	a := f.newApplier(dir, w, false)
	afters, err := a.apply()
	if err != nil {
		if rerr := f.abandon(a, err); rerr != nil {
			return interrupted(errors.Join(err, rerr))
		}
		return nil, fmt.Errorf("cowfs: commit %s rolled back, the transaction is pending: %w", t.id, err)
	}
	if err := a.cleanup(); err != nil {
		return interrupted(err)
	}
	if err := f.finish(dir, w, afters); err != nil {
		var ae *afterError
		if errors.As(err, &ae) {
			if rerr := f.abandon(a, err); rerr == nil {
				return nil, fmt.Errorf("cowfs: commit %s rolled back, the transaction is pending: %w", t.id, err)
			}
		}
		return interrupted(err)
	}
	paths := make([]string, len(w.Ops))
	for i := range w.Ops {
		paths[i] = w.Ops[i].Path
	}
	return paths, nil
}

// checkStructure verifies, before the WAL is written, that every change
// can be applied: the ancestors of what is created are real directories
// (never symlinks, so nothing is written through one) or are created by
// the transaction, and a directory that is removed holds nothing the
// transaction does not remove too.
func (f *FS) checkStructure(w *walFile) error {
	at := make(map[string]*walOp, len(w.Ops))
	for i := range w.Ops {
		at[w.Ops[i].Path] = &w.Ops[i]
	}
	checked := map[string]bool{}
	for i := range w.Ops {
		op := &w.Ops[i]
		for _, a := range ancestors(op.Path) {
			if at[a] != nil || checked[a] {
				continue
			}
			fi, err := f.ws.root.Lstat(a)
			switch {
			case isNotExist(err):
				return conflict(a, ReasonDeleted)
			case err != nil:
				return fmt.Errorf("cowfs: commit: %q: %w", a, err)
			case !fi.IsDir():
				return conflict(a, ReasonReplaced)
			}
			checked[a] = true
		}
		if op.Before.Type == typeDir && op.Kind != KindMkdir {
			d, err := f.ws.root.Open(op.Path)
			if err != nil {
				return fmt.Errorf("cowfs: commit: %q: %w", op.Path, err)
			}
			names, err := d.Readdirnames(-1)
			d.Close()
			if err != nil {
				return fmt.Errorf("cowfs: commit: %q: %w", op.Path, err)
			}
			for _, n := range names {
				c := at[path.Join(op.Path, n)]
				if c == nil || c.Kind != KindDelete {
					return conflict(path.Join(op.Path, n), ReasonCreated)
				}
			}
		}
	}
	return nil
}

// afterError: the after-images could not be written (a full disk, say);
// the commit is applied but not marked done, and can be rolled back.
type afterError struct{ err error }

func (e *afterError) Error() string { return "write after-images: " + e.err.Error() }
func (e *afterError) Unwrap() error { return e.err }

// finish records the after-images and moves the transaction into the
// undo journal (or, for an undo, drops the entry it reverted), then trims
// the journal to the undo depth.
func (f *FS) finish(dir string, w *walFile, afters []snapshot) error {
	var buf []byte
	for _, a := range afters {
		p, err := json.Marshal(a)
		if err != nil {
			return err
		}
		buf = appendFrame(buf, p)
	}
	if len(buf) == 0 {
		buf = appendFrame(buf, []byte("{}"))
	}
	if err := f.replaceFileSync(dir+"/after", buf); err != nil {
		// Nothing is marked done yet: the caller can still roll back.
		return &afterError{err}
	}
	failpoint(fpAfterWritten)
	if w.Undoes != "" {
		if err := f.rebaseAfter(w, afters); err != nil {
			return err
		}
		if _, err := f.state.Lstat("done/" + w.Undoes); err == nil {
			if err := f.removeState("done/" + w.Undoes); err != nil {
				return err
			}
		}
		if err := f.removeState(dir); err != nil {
			return err
		}
		failpoint(fpDone)
		return nil
	}
	entries, err := f.doneEntries()
	if err != nil {
		return err
	}
	seq := uint64(time.Now().UnixNano())
	if n := len(entries); n > 0 {
		if last, _, _ := parseDone(entries[n-1]); last >= seq {
			seq = last + 1
		}
	}
	name := fmt.Sprintf("%020d-%s", seq, w.ID)
	if err := f.state.Rename(dir, "done/"+name); err != nil {
		return err
	}
	if err := f.syncState("tx"); err != nil {
		return err
	}
	if err := f.syncState("done"); err != nil {
		return err
	}
	failpoint(fpDone)
	// The commit is complete; a journal that cannot be trimmed now is
	// trimmed by the next commit or Open.
	if err := f.prune(); err != nil {
		f.log.Warn("cowfs: undo journal not trimmed", "err", err)
	}
	return nil
}

// rebaseAfter keeps the undo journal checkable after an Undo. The entry
// before the undone one recorded the identity (inode, mtime) of what it
// wrote; the undo restored the same bytes under new inodes, so without
// this the next Undo would see them as replaced. Where the undo's result
// holds the same content as that entry's after-image, the after-image
// takes the undo's identity. Rerunning it after a crash is harmless.
func (f *FS) rebaseAfter(w *walFile, afters []snapshot) error {
	entries, err := f.doneEntries()
	if err != nil {
		return err
	}
	prev := ""
	for _, e := range entries {
		if e < w.Undoes {
			prev = e
		}
	}
	if prev == "" {
		return nil
	}
	wb, err := f.state.ReadFile("done/" + prev + "/wal")
	if err != nil {
		return err
	}
	pw, err := decodeWAL(wb)
	if err != nil {
		return nil // a damaged entry is refused by Undo anyway
	}
	ab, err := f.state.ReadFile("done/" + prev + "/after")
	if err != nil {
		return nil
	}
	pa, err := decodeAfter(ab, len(pw.Ops))
	if err != nil {
		return nil
	}
	at := make(map[string]int, len(pw.Ops))
	for i := range pw.Ops {
		at[pw.Ops[i].Path] = i
	}
	changed := false
	for i := range w.Ops {
		j, ok := at[w.Ops[i].Path]
		if ok && sameContent(pa[j], afters[i]) && pa[j] != afters[i] {
			pa[j] = afters[i]
			changed = true
		}
	}
	if !changed {
		return nil
	}
	var buf []byte
	for _, a := range pa {
		p, err := json.Marshal(a)
		if err != nil {
			return err
		}
		buf = appendFrame(buf, p)
	}
	return f.replaceFileSync("done/"+prev+"/after", buf)
}

// sameContent compares what a reader sees, not identity.
func sameContent(a, b snapshot) bool {
	if a.Type != b.Type || a.Mode != b.Mode {
		return false
	}
	switch a.Type {
	case typeFile:
		return a.Size == b.Size && a.SHA == b.SHA
	case typeSymlink:
		return a.Target == b.Target
	}
	return true
}

func (f *FS) prune() error {
	entries, err := f.doneEntries()
	if err != nil {
		return err
	}
	for len(entries) > f.opts.undoDepth {
		if err := f.removeState("done/" + entries[0]); err != nil {
			return err
		}
		entries = entries[1:]
	}
	return nil
}

func decodeAfter(b []byte, n int) ([]snapshot, error) {
	frames, _, err := decodeFrames(b)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	if len(frames) != n {
		return nil, fmt.Errorf("%w: %d after-images for %d changes", errCorrupt, len(frames), n)
	}
	out := make([]snapshot, n)
	for i, p := range frames {
		if err := json.Unmarshal(p, &out[i]); err != nil {
			return nil, fmt.Errorf("%w: %v", errCorrupt, err)
		}
	}
	return out, nil
}

// recover runs at Open, under the lock: it empties the trash, drops
// half-built transactions and aborted commit attempts, rolls forward every
// commit whose WAL is in place, and quarantines the ones it cannot.
func (f *FS) recover(ctx context.Context) error {
	unlock, err := f.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if names, err := f.readDirNames("trash"); err == nil {
		for _, n := range names {
			f.state.RemoveAll("trash/" + n)
		}
	}
	if d, err := f.state.Open("tx"); err == nil {
		names, _ := d.Readdirnames(-1)
		d.Close()
		for _, n := range names {
			if len(n) > 5 && n[:5] == ".new-" {
				f.state.RemoveAll("tx/" + n)
			}
		}
	}
	ids, err := f.txIDs()
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		dir := "tx/" + id
		if st, reason := f.txState(id); st == StateQuarantined {
			errs = append(errs, fmt.Errorf("%w: transaction %s is quarantined: %s", ErrRecovery, id, reason))
			continue
		} else if st == StateOpen {
			// A commit that died before its WAL was in place never began.
			f.state.Remove(dir + "/wal.tmp")
			f.state.RemoveAll(dir + "/prev")
			continue
		}
		if err := f.rollForward(dir, id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := f.prune(); err != nil {
		errs = append(errs, err)
	}
	if err := f.recount(); err != nil {
		return err
	}
	f.mu.Lock()
	f.recoveryErr = errors.Join(errs...)
	f.mu.Unlock()
	return nil
}

func (f *FS) rollForward(dir, id string) error {
	b, err := f.state.ReadFile(dir + "/wal")
	if err != nil {
		return f.quarantine(id, fmt.Sprintf("unreadable WAL: %v", err))
	}
	w, err := decodeWAL(b)
	if err != nil {
		return f.quarantine(id, err.Error())
	}
	if w.ID != id {
		return f.quarantine(id, fmt.Sprintf("WAL names transaction %s", w.ID))
	}
	if err := f.checkLinks(w, true); err != nil {
		return f.quarantine(id, err.Error())
	}
	for i := range w.Ops {
		op := &w.Ops[i]
		if op.Kind != KindWrite {
			continue
		}
		if cur, err := f.ws.snap(op.Path, nil); err == nil && matchesAfter(op, cur) {
			continue // already written; its blob is not needed
		}
		if err := f.checkBlob(dir, &op.change); err != nil {
			f.newApplier(dir, w, true).dropTemps()
			return f.quarantine(id, err.Error())
		}
	}
	a := f.newApplier(dir, w, true)
	afters, err := a.apply()
	if err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) {
			a.dropTemps()
			return f.quarantine(id, ce.Error())
		}
		// It cannot be finished (a full disk, say): take it back, so the
		// workspace is whole and the transaction pending again.
		if rerr := f.abandon(a, err); rerr != nil {
			return fmt.Errorf("%w: transaction %s: roll forward: %w", ErrRecovery, id, errors.Join(err, rerr))
		}
		return fmt.Errorf("%w: transaction %s could not be rolled forward; it was rolled back and is pending: %w", ErrRecovery, id, err)
	}
	if err := a.cleanup(); err != nil {
		return fmt.Errorf("%w: transaction %s: roll forward: %w", ErrRecovery, id, err)
	}
	if err := f.finish(dir, w, afters); err != nil {
		var ae *afterError
		if errors.As(err, &ae) && f.abandon(a, err) == nil {
			return fmt.Errorf("%w: transaction %s could not be rolled forward; it was rolled back and is pending: %w", ErrRecovery, id, err)
		}
		return fmt.Errorf("%w: transaction %s: roll forward: %w", ErrRecovery, id, err)
	}
	f.log.Info("cowfs: rolled an interrupted commit forward", "tx", id, "changes", len(w.Ops))
	return nil
}

func (f *FS) quarantine(id, reason string) error {
	f.log.Error("cowfs: quarantined an interrupted commit", "tx", id, "reason", reason)
	if err := f.replaceFileSync("tx/"+id+"/quarantine", []byte(reason+"\n")); err != nil {
		f.log.Error("cowfs: cannot write quarantine marker", "tx", id, "err", err)
	}
	return fmt.Errorf("%w: transaction %s quarantined: %s", ErrRecovery, id, reason)
}

// Undo reverts the most recently committed transaction still in the undo
// journal, with the same protocol and conflict check as Commit: every
// path must still be exactly as that commit left it. It returns what was
// undone; ErrNotFound when the journal is empty.
func (f *FS) Undo(ctx context.Context) (*TxInfo, error) {
	unlock, err := f.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	entries, err := f.doneEntries()
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%w: nothing to undo", ErrNotFound)
	}
	name := entries[len(entries)-1]
	info, err := f.doneInfo(name)
	if err != nil {
		return nil, fmt.Errorf("%w: undo entry %s: %w", ErrRecovery, name, err)
	}
	wb, err := f.state.ReadFile("done/" + name + "/wal")
	if err != nil {
		return nil, err
	}
	w, err := decodeWAL(wb)
	if err != nil {
		return nil, fmt.Errorf("%w: undo entry %s: %w", ErrRecovery, name, err)
	}
	ab, err := f.state.ReadFile("done/" + name + "/after")
	if err != nil {
		return nil, fmt.Errorf("%w: undo entry %s: %w", ErrRecovery, name, err)
	}
	afters, err := decodeAfter(ab, len(w.Ops))
	if err != nil {
		return nil, fmt.Errorf("%w: undo entry %s: %w", ErrRecovery, name, err)
	}
	t := &Tx{fs: f, id: newID(), desc: "undo " + info.ID + ": " + w.Desc, created: time.Now().UTC(),
		undoes: name, changes: map[string]*change{}}
	var recs []stageRec
	blobs := map[string]string{}
	for i := range w.Ops {
		op, a := &w.Ops[i], afters[i]
		b := op.Before
		var c *change
		switch b.Type {
		case typeAbsent:
			if a.Type != typeAbsent {
				c = &change{Path: op.Path, Kind: KindDelete}
			}
		case typeFile:
			if !op.Prev {
				return nil, fmt.Errorf("%w: undo entry %s: previous bytes of %q were not saved", ErrRecovery, name, op.Path)
			}
			c = &change{Path: op.Path, Kind: KindWrite, Mode: b.Mode, Blob: b.SHA, Size: b.Size}
			blobs[b.SHA] = "done/" + name + "/prev/" + strconv.Itoa(i)
		case typeSymlink:
			c = &change{Path: op.Path, Kind: KindSymlink, Target: b.Target}
		case typeDir:
			if op.Implicit {
				continue // it existed before; the commit did not touch it
			}
			c = &change{Path: op.Path, Kind: KindMkdir, Mode: b.Mode}
		}
		if c == nil {
			continue
		}
		c.Before = a
		recs = append(recs, stageRec{Op: "set", Change: c})
	}
	if err := f.createTx(t, recs, blobs); err != nil {
		return nil, err
	}
	_, err = t.commitLocked(ctx)
	f.account(t.id, 0, false)
	if err != nil {
		if st, _ := f.txState(t.id); st == StateOpen {
			f.removeState(t.dir())
		}
		return nil, err
	}
	return &info, nil
}
