package cowfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ChangeKind is what a staged change does to its path.
type ChangeKind string

// The change kinds.
const (
	KindWrite   ChangeKind = "write"   // a regular file with the staged bytes and mode
	KindDelete  ChangeKind = "delete"  // remove the file, symlink or (emptied) directory
	KindMkdir   ChangeKind = "mkdir"   // a directory with the staged mode
	KindSymlink ChangeKind = "symlink" // a symlink to Target
)

// Change is one staged change, as Tx.Changes reports it.
type Change struct {
	Path string     `json:"path"`
	Kind ChangeKind `json:"kind"`
	// Mode is the permission (and setuid, setgid, sticky) bits a write or
	// mkdir sets.
	Mode   fs.FileMode `json:"mode"`
	Size   int64       `json:"size"`
	Target string      `json:"target,omitempty"`
	// New is true when the path did not exist when it was first staged.
	New bool `json:"new"`
	// Implicit marks a directory staged only because a path beneath it
	// was written; at commit it may already exist.
	Implicit bool `json:"implicit,omitempty"`
}

// change is a staged change as the stage log and the WAL record it.
type change struct {
	Path string     `json:"path"`
	Kind ChangeKind `json:"kind"`
	Mode uint32     `json:"mode,omitempty"`
	Blob string     `json:"blob,omitempty"`
	// Pack, when set, names the batch file under blobs/ that holds the
	// bytes at Off; otherwise they are in blobs/<Blob>.
	Pack     string `json:"pack,omitempty"`
	Off      int64  `json:"off,omitempty"`
	Size     int64  `json:"size,omitempty"`
	Target   string `json:"target,omitempty"`
	Implicit bool   `json:"implicit,omitempty"`
	// Before is the entry at Path when it was first staged.
	Before snapshot `json:"before"`
}

// stageRec is one record of a transaction's stage log.
type stageRec struct {
	Op      string `json:"op"` // begin, batch, set, unstage
	ID      string `json:"id,omitempty"`
	Desc    string `json:"desc,omitempty"`
	Created int64  `json:"created,omitempty"`
	Undoes  string `json:"undoes,omitempty"`
	// Sealed (begin) says the log has a seal (tx/<id>/seal).
	Sealed bool    `json:"sealed,omitempty"`
	Path   string  `json:"path,omitempty"`
	Change *change `json:"change,omitempty"`
	// N is the number of set and unstage records a batch record heads.
	N int `json:"n,omitempty"`
	// Squashes, on a begin record, lists the transactions this one
	// replaces (see stack.go).
	Squashes []string `json:"squashes,omitempty"`
}

// Tx is a copy-on-write transaction: changes staged under .pulse/cow and
// applied to the workspace only by Commit. A Tx value may be used from
// several goroutines; the same transaction may be opened by several
// processes, each seeing the others' staged changes on its next call.
type Tx struct {
	fs *FS
	id string

	mu      sync.Mutex
	desc    string
	created time.Time
	undoes  string
	changes map[string]*change
	bytes   int64
	offset  int64 // end of the stage log as last read
	loaded  bool
	// whiteouts and squashes belong to the pending stack (stack.go).
	whiteouts map[string]bool
	squashes  []string
	sealed    bool   // the log has a seal
	sealSeq   uint64 // sequence number of the seal's newer slot

	// pend is the batch Stage is planning: the changes its accepted ops
	// set (nil: unstaged), which the planning helpers see through cur but
	// Changes does not until the batch is durable. Only the holder of the
	// workspace lock touches it; pendBytes and pendCount are the staged
	// bytes and change count with it.
	pend      map[string]*change
	pendBytes int64
	pendCount int
}

// ID returns the transaction id (16 hex digits).
func (t *Tx) ID() string { return t.id }

// Description returns the description given to Begin.
func (t *Tx) Description() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.desc
}

func (t *Tx) dir() string { return "tx/" + t.id }

func (t *Tx) info() TxInfo {
	return TxInfo{ID: t.id, Description: t.desc, State: StateOpen, Created: t.created,
		Changes: len(t.changes), Bytes: t.bytes}
}

// apply replays one stage record into memory.
func (t *Tx) apply(r stageRec) {
	switch r.Op {
	case "begin":
		t.desc, t.created, t.undoes, t.sealed = r.Desc, time.Unix(0, r.Created).UTC(), r.Undoes, r.Sealed
		t.squashes = r.Squashes
	case "whiteout":
		t.applyWhiteout(r.Path)
	case "set":
		delete(t.whiteouts, r.Change.Path)
		if old := t.changes[r.Change.Path]; old != nil {
			t.bytes -= old.Size
		}
		c := *r.Change
		t.changes[c.Path] = &c
		t.bytes += c.Size
	case "unstage":
		if old := t.changes[r.Path]; old != nil {
			t.bytes -= old.Size
			delete(t.changes, r.Path)
		}
	}
}

func decodeStageRec(p []byte) (stageRec, error) {
	var r stageRec
	if err := json.Unmarshal(p, &r); err != nil {
		return r, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	switch r.Op {
	case "begin":
	case "batch":
		if r.N < 1 {
			return r, fmt.Errorf("%w: batch of %d records", errCorrupt, r.N)
		}
	case "set":
		if r.Change == nil {
			return r, fmt.Errorf("%w: set record without change", errCorrupt)
		}
		if err := checkChange(r.Change); err != nil {
			return r, err
		}
	case "unstage", "whiteout":
		if !isCleanRel(r.Path) {
			return r, fmt.Errorf("%w: bad path %q", errCorrupt, r.Path)
		}
	default:
		return r, fmt.Errorf("%w: unknown op %q", errCorrupt, r.Op)
	}
	return r, nil
}

// load reads the whole stage log without the lock and without repairing
// it (for List).
func (t *Tx) load() error {
	b, err := t.fs.state.ReadFile(t.dir() + "/stage.log")
	if err != nil {
		return err
	}
	recs, good, _, err := replayLog(b, true)
	if err != nil {
		return err
	}
	for _, r := range recs {
		t.apply(r)
	}
	if t.sealed {
		return t.checkSeal(int64(good))
	}
	return nil
}

// replayLog decodes stage log bytes b, which start at a record boundary
// (atStart: the start of the log, which must be the begin record). It
// returns the records of the whole frames and whole batches, and good,
// the offset just past the last of them. tail is true when b goes on
// past good with a torn frame or a batch missing records: what an append
// that never returned left, which the holder of the lock cuts away. Any
// other damage is an error wrapping errCorrupt.
func replayLog(b []byte, atStart bool) (recs []stageRec, good int, tail bool, err error) {
	frames, _, ferr := decodeFrames(b)
	if ferr != nil {
		if !errors.Is(ferr, io.ErrUnexpectedEOF) {
			return nil, 0, false, ferr
		}
		tail = true
	}
	for i := 0; i < len(frames); {
		r, err := decodeStageRec(frames[i])
		if err != nil {
			return nil, 0, false, err
		}
		if first := atStart && i == 0; first != (r.Op == "begin") {
			return nil, 0, false, fmt.Errorf("%w: stage log does not start with one begin record", errCorrupt)
		}
		if r.Op != "batch" {
			recs = append(recs, r)
			good += frameHeader + len(frames[i])
			i++
			continue
		}
		if r.N > len(frames)-i-1 {
			// The batch's append never finished: none of it counts.
			return recs, good, true, nil
		}
		size := frameHeader + len(frames[i])
		for _, p := range frames[i+1 : i+1+r.N] {
			br, err := decodeStageRec(p)
			if err != nil {
				return nil, 0, false, err
			}
			if br.Op != "set" && br.Op != "unstage" && br.Op != "whiteout" {
				return nil, 0, false, fmt.Errorf("%w: %q record inside a batch", errCorrupt, br.Op)
			}
			recs = append(recs, br)
			size += frameHeader + len(p)
		}
		good += size
		i += 1 + r.N
	}
	return recs, good, tail, nil
}

// refreshLocked brings the in-memory view up to date with the stage log,
// which another process may have appended to, and checks the transaction
// may still be staged into (open=true) or at least read. A torn tail left
// by a writer that crashed mid-append is cut off; the caller holds the
// lock, so no live writer is mid-append.
func (t *Tx) refreshLocked(open bool) error {
	f, err := t.fs.state.OpenFile(t.dir()+"/stage.log", os.O_RDWR, 0)
	if isNotExist(err) {
		if t.loaded {
			return fmt.Errorf("%w: transaction %s was committed or discarded", ErrClosed, t.id)
		}
		return fmt.Errorf("%w: transaction %s", ErrNotFound, t.id)
	}
	if err != nil {
		return fmt.Errorf("cowfs: transaction %s: %w", t.id, err)
	}
	defer f.Close()
	if open {
		switch st, reason := t.fs.txState(t.id); st {
		case StateQuarantined:
			return fmt.Errorf("%w: transaction %s is quarantined: %s", ErrRecovery, t.id, reason)
		case StateCommitting:
			return fmt.Errorf("%w: transaction %s is being committed", ErrClosed, t.id)
		}
	}
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	recs, good, tail, err := replayLog(b, t.offset == 0)
	if err != nil {
		return fmt.Errorf("%w: transaction %s: stage log: %w", ErrRecovery, t.id, err)
	}
	sealed := t.sealed
	if t.offset == 0 && len(recs) > 0 {
		sealed = recs[0].Sealed
	}
	if sealed {
		// Before a torn tail is cut: the cut must never reach records an
		// append that returned wrote.
		if err := t.checkSeal(t.offset + int64(good)); err != nil {
			return fmt.Errorf("%w: %w", ErrRecovery, err)
		}
	}
	if tail {
		if err := f.Truncate(t.offset + int64(good)); err != nil {
			return err
		}
		t.fs.log.Warn("cowfs: cut a torn stage log tail", "tx", t.id, "at", t.offset+int64(good))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range recs {
		t.apply(r)
	}
	t.offset += int64(good)
	t.loaded = true
	// Records another process appended count toward the total too.
	t.fs.account(t.id, t.bytes, false)
	return nil
}

// appendRecs appends to the stage log and fsyncs it, then applies the
// records in memory. The caller holds the lock.
//
// More than one record is headed by a batch record counting them, so
// that readers take all of them or none: a write can be cut short
// (a fatal signal stops a long write at a page boundary) and, before the
// fsync, a power loss may keep any prefix of it. The frames go out in
// two writes, the last record alone, which costs no extra fsync and
// gives the crash tests an instant (fpBatchTorn) where the batch is
// written but for its last record.
func (t *Tx) appendRecs(recs []stageRec) error {
	var buf []byte
	if len(recs) > 1 {
		p, err := json.Marshal(stageRec{Op: "batch", N: len(recs)})
		if err != nil {
			return err
		}
		buf = appendFrame(buf, p)
	}
	split := 0
	for _, r := range recs {
		p, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if len(p) > maxRecord {
			return fmt.Errorf("cowfs: stage: record of %q is %d bytes", r.Path, len(p))
		}
		split = len(buf)
		buf = appendFrame(buf, p)
	}
	f, err := t.fs.state.OpenFile(t.dir()+"/stage.log", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	fail := func(err error) error {
		// Take back what was written, so that a call that failed never
		// shows up later; if this fails too, an unfinished batch or torn
		// frame is cut by the next reader, and a whole one is what the
		// caller was told may not have happened.
		f.Truncate(t.offset)
		f.Close()
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	if len(recs) > 1 {
		if _, err := f.Write(buf[:split]); err != nil {
			return fail(err)
		}
		failpoint(fpBatchTorn)
		buf = buf[split:]
	}
	if _, err := f.Write(buf); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	failpoint(fpStageLogSynced)
	end := t.offset + int64(len(buf)+split)
	if t.sealed {
		// The records are durable; a seal that cannot be written only
		// weakens the check of a later cut, so the call still succeeds.
		if err := t.writeSeal(end); err != nil {
			t.fs.log.Warn("cowfs: stage log seal not updated", "tx", t.id, "err", err)
		}
	}
	t.mu.Lock()
	for _, r := range recs {
		t.apply(r)
	}
	t.offset = end
	t.mu.Unlock()
	return nil
}

// stageOp runs fn under the workspace lock on an up-to-date, open
// transaction. fn returns the records to append; their effect on the
// staged bytes and the change count is checked against the limits before
// anything is written.
func (t *Tx) stageOp(ctx context.Context, fn func() ([]stageRec, error)) error {
	unlock, err := t.fs.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if err := t.refreshLocked(true); err != nil {
		return err
	}
	recs, err := fn()
	if err != nil || len(recs) == 0 {
		return err
	}
	delta, count := t.effect(recs)
	if count > t.fs.opts.maxChanges {
		return &LimitError{Name: LimitChanges, Value: int64(t.fs.opts.maxChanges)}
	}
	t.mu.Lock()
	old := t.bytes
	t.mu.Unlock()
	if err := t.fs.account(t.id, old+delta, true); err != nil {
		// Another process may have committed or discarded what this FS
		// still counts: recount from the stage logs before refusing.
		// Only a refusal pays for a rescan.
		if rerr := t.fs.recount(); rerr != nil {
			return err
		}
		if err := t.fs.account(t.id, old+delta, true); err != nil {
			return err
		}
	}
	failpoint(fpStageBlob)
	if err := t.appendRecs(recs); err != nil {
		t.fs.account(t.id, old, false)
		return err
	}
	failpoint(fpStageAppended)
	return nil
}

// effect returns how recs would change the staged bytes, and how many
// changes the transaction would hold after them.
func (t *Tx) effect(recs []stageRec) (delta int64, count int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	size := map[string]int64{}
	present := map[string]bool{}
	get := func(p string) (int64, bool) {
		if v, ok := size[p]; ok {
			return v, present[p]
		}
		if c := t.curLocked(p); c != nil {
			return c.Size, true
		}
		return 0, false
	}
	count = len(t.changes)
	if t.pend != nil {
		count = t.pendCount
	}
	for _, r := range recs {
		switch r.Op {
		case "set":
			old, ok := get(r.Change.Path)
			delta += r.Change.Size - old
			if !ok {
				count++
			}
			size[r.Change.Path], present[r.Change.Path] = r.Change.Size, true
		case "unstage":
			old, ok := get(r.Path)
			delta -= old
			if ok {
				count--
			}
			size[r.Path], present[r.Path] = 0, false
		}
	}
	return delta, count
}

// cur returns the staged change of rel, or nil, counting the batch
// being planned.
func (t *Tx) cur(rel string) *change {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.curLocked(rel)
}

func (t *Tx) curLocked(rel string) *change {
	if c, ok := t.pend[rel]; ok {
		return c
	}
	return t.changes[rel]
}

// addPending records what recs do in the batch being planned.
func (t *Tx) addPending(recs []stageRec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range recs {
		p := r.Path
		if r.Op == "set" {
			p = r.Change.Path
		}
		if old := t.curLocked(p); old != nil {
			t.pendBytes -= old.Size
			t.pendCount--
		}
		if r.Op == "set" {
			c := *r.Change
			t.pend[p] = &c
			t.pendBytes += c.Size
			t.pendCount++
		} else {
			t.pend[p] = nil
		}
	}
}

// before returns the snapshot a new change of rel records: the first
// staged one, or the workspace entry now.
func (t *Tx) before(rel string) (snapshot, error) {
	if c := t.cur(rel); c != nil {
		return c.Before, nil
	}
	return t.fs.ws.snap(rel, nil)
}

// parents returns the records that make every ancestor of rel a
// directory after commit: an implicit mkdir for a missing one, a mkdir
// replacing one that is a file or is staged as a file, symlink or
// deletion. That is what a command's overlay means when it holds rel:
// whatever was on the way was replaced by directories. A symlink of the
// workspace on the way is refused (ErrInvalidPath naming it): nothing is
// staged through it, and it is replaced only when staged explicitly.
func (t *Tx) parents(rel string) ([]stageRec, error) {
	var recs []stageRec
	for _, a := range ancestors(rel) {
		if c := t.cur(a); c != nil {
			if c.Kind == KindMkdir {
				continue
			}
			m := uint32(0o755)
			if c.Before.Type == typeDir {
				m = c.Before.Mode
			}
			nc := &change{Path: a, Kind: KindMkdir, Mode: m, Before: c.Before}
			recs = append(recs, stageRec{Op: "set", Change: nc})
			continue
		}
		s, err := t.fs.ws.snap(a, nil)
		if err != nil {
			return nil, err
		}
		switch s.Type {
		case typeDir:
		case typeAbsent:
			nc := &change{Path: a, Kind: KindMkdir, Mode: 0o755, Implicit: true, Before: s}
			recs = append(recs, stageRec{Op: "set", Change: nc})
		case typeFile:
			nc := &change{Path: a, Kind: KindMkdir, Mode: 0o755, Before: s}
			recs = append(recs, stageRec{Op: "set", Change: nc})
		case typeSymlink:
			// A user's symlink is never replaced implicitly, and nothing
			// is staged through it: the path a caller names would land
			// wherever the link leads (outside the workspace, with
			// "up -> .."). Replacing the link takes a Mkdir (or Delete)
			// of it first.
			where := "a symlink"
			if linkLeaves(a, s.Target) {
				where = "a symlink leading outside the workspace"
			}
			return nil, fmt.Errorf("%w: %q: parent %q is %s (to %q); stage a directory at %q first to replace it",
				ErrInvalidPath, rel, a, where, s.Target, a)
		default:
			return nil, fmt.Errorf("%w: %q: parent %q is a special file", ErrInvalidPath, rel, a)
		}
	}
	return recs, nil
}

// replaceRecs returns what staging a non-directory at rel needs besides
// its own record: its parents, and, when a directory is there (in the
// workspace or staged), the removal of everything beneath it.
func (t *Tx) replaceRecs(rel string, before snapshot) ([]stageRec, error) {
	if before.Type == typeOther {
		return nil, fmt.Errorf("%w: %q is a special file", ErrInvalidPath, rel)
	}
	recs, err := t.parents(rel)
	if err != nil {
		return nil, err
	}
	if c := t.cur(rel); before.Type == typeDir || c != nil && c.Kind == KindMkdir {
		below, err := t.removalRecs(rel, false)
		if err != nil {
			return nil, err
		}
		recs = append(recs, below...)
	}
	return recs, nil
}

// Write stages rel to hold exactly data with mode's permission bits
// (rwx for user, group, other; setuid, setgid and sticky are dropped). A
// zero mode keeps the mode of the file it replaces (0644 for a new file).
// Missing parent directories are staged too; a file or symlink where a
// parent directory must be, and a directory at rel, are staged for
// replacement (with everything beneath, each entry checked at commit).
// The bytes are on disk, and survive a crash of this process, when Write
// returns.
func (t *Tx) Write(ctx context.Context, p string, data []byte, mode os.FileMode) error {
	rel, err := cleanRel(t.fs.ws.dir, p)
	if err != nil {
		return err
	}
	if int64(len(data)) > t.fs.opts.maxFileBytes {
		return &LimitError{Name: LimitFileBytes, Value: t.fs.opts.maxFileBytes}
	}
	sha := sha256Hex(data)
	return t.stageOp(ctx, func() ([]stageRec, error) {
		recs, err := t.planWrite(rel, sha, int64(len(data)), mode)
		if err != nil {
			return nil, err
		}
		if _, count := t.effect(recs); count > t.fs.opts.maxChanges {
			return nil, &LimitError{Name: LimitChanges, Value: int64(t.fs.opts.maxChanges)}
		}
		if err := t.putBlob(sha, data); err != nil {
			return nil, err
		}
		return recs, nil
	})
}

// planWrite returns the records staging a write of rel; the last one is
// the write's own.
func (t *Tx) planWrite(rel, sha string, size int64, mode os.FileMode) ([]stageRec, error) {
	before, err := t.before(rel)
	if err != nil {
		return nil, err
	}
	recs, err := t.replaceRecs(rel, before)
	if err != nil {
		return nil, err
	}
	m := unixMode(mode)
	if mode == 0 {
		m = 0o644
		if before.Type == typeFile {
			m = before.Mode
		}
	}
	// A sandboxed command must not plant a setuid or setgid program
	// that a privileged commit would install; new content does not
	// inherit those bits either (the kernel clears them on write too).
	m &= 0o777
	nc := &change{Path: rel, Kind: KindWrite, Mode: m, Blob: sha, Size: size, Before: before}
	return append(recs, stageRec{Op: "set", Change: nc}), nil
}

// putBlob stores data under its SHA-256 in the transaction's blobs.
func (t *Tx) putBlob(sha string, data []byte) error {
	name := t.dir() + "/blobs/" + sha
	if _, err := t.fs.state.Lstat(name); err == nil {
		return nil
	}
	tmp := t.dir() + "/blobs/.tmp-" + sha
	if err := t.fs.writeFileSync(tmp, data); err != nil {
		t.fs.state.Remove(tmp)
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	if err := t.fs.state.Rename(tmp, name); err != nil {
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	return t.fs.syncState(t.dir() + "/blobs")
}

// Mkdir stages a directory at rel with mode's permission bits (0755 when
// zero; setuid is dropped, setgid and sticky kept). On an existing
// directory it stages a mode change; a file or symlink at rel is staged
// for replacement.
func (t *Tx) Mkdir(ctx context.Context, p string, mode os.FileMode) error {
	rel, err := cleanRel(t.fs.ws.dir, p)
	if err != nil {
		return err
	}
	return t.stageOp(ctx, func() ([]stageRec, error) { return t.planMkdir(rel, mode) })
}

func (t *Tx) planMkdir(rel string, mode os.FileMode) ([]stageRec, error) {
	before, err := t.before(rel)
	if err != nil {
		return nil, err
	}
	if before.Type == typeOther {
		return nil, fmt.Errorf("%w: %q is a special file", ErrInvalidPath, rel)
	}
	recs, err := t.parents(rel)
	if err != nil {
		return nil, err
	}
	m := unixMode(mode)
	if mode == 0 {
		m = 0o755
	}
	m &^= syscall.S_ISUID // setgid and sticky are common and harmless on directories
	nc := &change{Path: rel, Kind: KindMkdir, Mode: m, Before: before}
	return append(recs, stageRec{Op: "set", Change: nc}), nil
}

// Symlink stages a symlink at rel pointing to target. Targets that are
// absolute, climb out of the workspace, have ".." after a name (it would
// climb out of whatever that name links to) or name .pulse are refused,
// so a committed link never leads a later reader outside the workspace.
// Parents and an entry at rel are handled as by Write.
func (t *Tx) Symlink(ctx context.Context, target, p string) error {
	rel, err := cleanRel(t.fs.ws.dir, p)
	if err != nil {
		return err
	}
	if err := checkLinkTarget(rel, target); err != nil {
		return err
	}
	return t.stageOp(ctx, func() ([]stageRec, error) { return t.planSymlink(rel, target) })
}

func (t *Tx) planSymlink(rel, target string) ([]stageRec, error) {
	before, err := t.before(rel)
	if err != nil {
		return nil, err
	}
	recs, err := t.replaceRecs(rel, before)
	if err != nil {
		return nil, err
	}
	nc := &change{Path: rel, Kind: KindSymlink, Target: target, Before: before}
	return append(recs, stageRec{Op: "set", Change: nc}), nil
}

// Delete stages the removal of rel. A directory is removed with
// everything beneath it, each entry snapshotted so that commit notices
// any of them changing. Deleting a path the transaction created unstages
// it. A path that neither exists nor is staged is ErrNotFound; a path
// reached through a symlinked directory is refused (removing it would
// remove what the link points at).
func (t *Tx) Delete(ctx context.Context, p string) error {
	rel, err := cleanRel(t.fs.ws.dir, p)
	if err != nil {
		return err
	}
	return t.stageOp(ctx, func() ([]stageRec, error) { return t.planDelete(rel) })
}

func (t *Tx) planDelete(rel string) ([]stageRec, error) {
	if err := t.realAncestors(rel); err != nil {
		return nil, err
	}
	recs, err := t.removalRecs(rel, true)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: %q does not exist", ErrNotFound, rel)
	}
	return recs, nil
}

// removalRecs returns the records removing everything at and (self
// false: only) beneath rel, in the workspace and staged: a deletion for
// what exists, an unstage for what the transaction created.
func (t *Tx) removalRecs(rel string, self bool) ([]stageRec, error) {
	paths := map[string]bool{}
	if err := t.walk(rel, paths); err != nil {
		return nil, err
	}
	t.mu.Lock()
	for _, m := range []map[string]*change{t.changes, t.pend} {
		for q := range m {
			if q == rel || strings.HasPrefix(q, rel+"/") {
				paths[q] = true
			}
		}
	}
	t.mu.Unlock()
	if !self {
		delete(paths, rel)
	}
	if len(paths) > t.fs.opts.maxChanges {
		return nil, &LimitError{Name: LimitChanges, Value: int64(t.fs.opts.maxChanges)}
	}
	sorted := make([]string, 0, len(paths))
	for q := range paths {
		sorted = append(sorted, q)
	}
	sort.Strings(sorted)
	var recs []stageRec
	for _, q := range sorted {
		before, err := t.before(q)
		if err != nil {
			return nil, err
		}
		if before.Type == typeAbsent {
			if t.cur(q) != nil {
				recs = append(recs, stageRec{Op: "unstage", Path: q})
			}
			continue
		}
		recs = append(recs, stageRec{Op: "set", Change: &change{Path: q, Kind: KindDelete, Before: before}})
	}
	return recs, nil
}

// realAncestors refuses a path reached through a symlinked directory.
func (t *Tx) realAncestors(rel string) error {
	for _, a := range ancestors(rel) {
		if c := t.cur(a); c != nil && c.Kind == KindMkdir {
			continue
		}
		fi, err := t.fs.ws.root.Lstat(a)
		if isNotExist(err) {
			return nil // nothing beneath can exist either
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w: %q: parent %q is not a directory", ErrInvalidPath, rel, a)
		}
	}
	return nil
}

// walk adds rel and, for a directory, every entry beneath it in the
// workspace. Symlinks are not followed.
func (t *Tx) walk(rel string, out map[string]bool) error {
	fi, err := t.fs.ws.lstat(rel)
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	out[rel] = true
	if !fi.IsDir() {
		return nil
	}
	d, err := t.fs.ws.root.Open(rel)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	if len(out)+len(names) > t.fs.opts.maxChanges {
		return &LimitError{Name: LimitChanges, Value: int64(t.fs.opts.maxChanges)}
	}
	for _, n := range names {
		if err := t.walk(path.Join(rel, n), out); err != nil {
			return err
		}
	}
	return nil
}

// Changes returns the staged changes sorted by path, as this Tx last
// read them.
func (t *Tx) Changes() []Change {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Change, 0, len(t.changes))
	for _, c := range t.changes {
		out = append(out, c.public())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func (c *change) public() Change {
	return Change{Path: c.Path, Kind: c.Kind, Mode: fileMode(c.Mode), Size: c.Size, Target: c.Target,
		New: c.Before.Type == typeAbsent, Implicit: c.Implicit}
}

// Discard deletes the transaction and its staged bytes. The workspace is
// untouched. A quarantined transaction is refused (ErrRecovery): it is
// kept for a person to inspect and remove by hand.
//
// A transaction stuck committing (its WAL is in place but the commit
// could neither finish nor be rolled back, by the process that began it
// or by recovery) is rolled back first, from the entries kept beside its
// targets and its saved copies, so the workspace is whole again; only
// then is it deleted. Holding the lock means no process is applying it.
func (t *Tx) Discard(ctx context.Context) error {
	unlock, err := t.fs.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if st, _ := t.fs.txState(t.id); st == StateCommitting {
		if err := t.fs.abortCommit(t.dir()); err != nil {
			return err
		}
	}
	if err := t.refreshLocked(true); err != nil {
		return err
	}
	if err := t.fs.removeState(t.dir()); err != nil {
		return err
	}
	t.fs.account(t.id, 0, false)
	return nil
}

// removeState removes a state directory atomically: one rename into
// trash (fsynced), then the slow recursive removal, which Open finishes
// if a crash interrupts it.
func (f *FS) removeState(dir string) error {
	dst := "trash/" + newID()
	if err := f.state.Rename(dir, dst); err != nil {
		return fmt.Errorf("cowfs: remove %s: %w", dir, err)
	}
	if err := f.syncState(path.Dir(dir)); err != nil {
		return err
	}
	if err := f.state.RemoveAll(dst); err != nil {
		f.log.Warn("cowfs: trash not emptied", "dir", dst, "err", err)
	}
	return nil
}

// isCleanRel reports whether rel is already in the form cleanRel returns.
func isCleanRel(rel string) bool {
	c, err := cleanRel("/", rel)
	return err == nil && c == rel
}

func checkChange(c *change) error {
	if !isCleanRel(c.Path) {
		return fmt.Errorf("%w: bad path %q", errCorrupt, c.Path)
	}
	switch c.Kind {
	case KindWrite:
		if !validSHA(c.Blob) || c.Size < 0 || c.Off < 0 || c.Off > maxPackBytes || c.Size > maxPackBytes {
			return fmt.Errorf("%w: %q: bad blob", errCorrupt, c.Path)
		}
		if c.Pack != "" && !validPack(c.Pack) {
			return fmt.Errorf("%w: %q: bad pack %q", errCorrupt, c.Path, c.Pack)
		}
	case KindSymlink:
		// The target policy (checkLinkTarget) is applied when a link is
		// staged and again at commit and recovery (checkLinks), which
		// know whether an undo restores a link the workspace held; the
		// record itself only has to be well formed.
		if c.Target == "" || strings.IndexByte(c.Target, 0) >= 0 || len(c.Target) > maxPathLen {
			return fmt.Errorf("%w: %q: bad symlink target", errCorrupt, c.Path)
		}
	case KindMkdir, KindDelete:
	default:
		return fmt.Errorf("%w: %q: unknown kind %q", errCorrupt, c.Path, c.Kind)
	}
	if c.Kind != KindWrite && (c.Pack != "" || c.Off != 0) {
		return fmt.Errorf("%w: %q: pack on a %s", errCorrupt, c.Path, c.Kind)
	}
	if c.Mode&^0o7777 != 0 {
		return fmt.Errorf("%w: %q: bad mode %o", errCorrupt, c.Path, c.Mode)
	}
	switch c.Before.Type {
	case typeAbsent, typeFile, typeDir, typeSymlink:
	default:
		return fmt.Errorf("%w: %q: bad before type %q", errCorrupt, c.Path, c.Before.Type)
	}
	if c.Kind == KindDelete && c.Before.Type == typeAbsent {
		return fmt.Errorf("%w: %q: delete of an absent path", errCorrupt, c.Path)
	}
	return nil
}

func validSHA(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
