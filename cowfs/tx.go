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
	Path     string     `json:"path"`
	Kind     ChangeKind `json:"kind"`
	Mode     uint32     `json:"mode,omitempty"`
	Blob     string     `json:"blob,omitempty"`
	Size     int64      `json:"size,omitempty"`
	Target   string     `json:"target,omitempty"`
	Implicit bool       `json:"implicit,omitempty"`
	// Before is the entry at Path when it was first staged.
	Before snapshot `json:"before"`
}

// stageRec is one record of a transaction's stage log.
type stageRec struct {
	Op      string  `json:"op"` // begin, set, unstage
	ID      string  `json:"id,omitempty"`
	Desc    string  `json:"desc,omitempty"`
	Created int64   `json:"created,omitempty"`
	Undoes  string  `json:"undoes,omitempty"`
	Path    string  `json:"path,omitempty"`
	Change  *change `json:"change,omitempty"`
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
		t.desc, t.created, t.undoes = r.Desc, time.Unix(0, r.Created).UTC(), r.Undoes
	case "set":
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
	case "set":
		if r.Change == nil {
			return r, fmt.Errorf("%w: set record without change", errCorrupt)
		}
		if err := checkChange(r.Change); err != nil {
			return r, err
		}
	case "unstage":
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
	frames, _, err := decodeFrames(b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	for i, p := range frames {
		r, err := decodeStageRec(p)
		if err != nil {
			return err
		}
		if (i == 0) != (r.Op == "begin") {
			return fmt.Errorf("%w: stage log does not start with begin", errCorrupt)
		}
		t.apply(r)
	}
	return nil
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
	frames, good, err := decodeFrames(b)
	if err != nil {
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: transaction %s: stage log: %w", ErrRecovery, t.id, err)
		}
		if err := f.Truncate(t.offset + int64(good)); err != nil {
			return err
		}
		t.fs.log.Warn("cowfs: cut a torn stage log tail", "tx", t.id, "at", t.offset+int64(good))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, p := range frames {
		r, err := decodeStageRec(p)
		if err != nil {
			return fmt.Errorf("%w: transaction %s: stage log: %w", ErrRecovery, t.id, err)
		}
		if t.offset == 0 && (i == 0) != (r.Op == "begin") {
			return fmt.Errorf("%w: transaction %s: stage log does not start with begin", ErrRecovery, t.id)
		}
		t.apply(r)
	}
	t.offset += int64(good)
	t.loaded = true
	return nil
}

// appendRecs appends to the stage log and fsyncs it, then applies the
// records in memory. The caller holds the lock.
func (t *Tx) appendRecs(recs []stageRec) error {
	var buf []byte
	for _, r := range recs {
		p, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf = appendFrame(buf, p)
	}
	f, err := t.fs.state.OpenFile(t.dir()+"/stage.log", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("cowfs: stage: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	t.mu.Lock()
	for _, r := range recs {
		t.apply(r)
	}
	t.offset += int64(len(buf))
	t.mu.Unlock()
	return nil
}

// stageOp runs fn under the workspace lock on an up-to-date, open
// transaction. fn returns the records to append and the change in staged
// bytes, which is checked against the limit before anything is written.
func (t *Tx) stageOp(fn func() ([]stageRec, int64, error)) error {
	unlock, err := t.fs.lock(context.Background())
	if err != nil {
		return err
	}
	defer unlock()
	if err := t.refreshLocked(true); err != nil {
		return err
	}
	recs, delta, err := fn()
	if err != nil || len(recs) == 0 {
		return err
	}
	if err := t.fs.addStaged(delta); err != nil {
		return err
	}
	failpoint(fpStageBlob)
	if err := t.appendRecs(recs); err != nil {
		t.fs.addStaged(-delta)
		return err
	}
	failpoint(fpStageAppended)
	return nil
}

// cur returns the staged change of rel, or nil.
func (t *Tx) cur(rel string) *change {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changes[rel]
}

// before returns the snapshot a new change of rel records: the first
// staged one, or the workspace entry now.
func (t *Tx) before(rel string) (snapshot, error) {
	if c := t.cur(rel); c != nil {
		return c.Before, nil
	}
	return t.fs.ws.snap(rel, nil)
}

// stagedBelow reports whether a change is staged strictly beneath rel.
func (t *Tx) stagedBelow(rel string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p, c := range t.changes {
		if strings.HasPrefix(p, rel+"/") && c.Kind != KindDelete {
			return true
		}
	}
	return false
}

// parents returns the records that make every ancestor of rel a
// directory after commit: an implicit mkdir for a missing one, a mkdir
// for one staged for deletion. An ancestor that is (or is staged as) a
// file or symlink is refused.
func (t *Tx) parents(rel string) ([]stageRec, error) {
	var recs []stageRec
	for _, a := range ancestors(rel) {
		if c := t.cur(a); c != nil {
			switch c.Kind {
			case KindMkdir:
				continue
			case KindDelete:
				m := c.Before.Mode
				if c.Before.Type != typeDir {
					m = 0o755
				}
				nc := &change{Path: a, Kind: KindMkdir, Mode: m, Before: c.Before}
				recs = append(recs, stageRec{Op: "set", Change: nc})
				continue
			default:
				return nil, fmt.Errorf("%w: %q: parent %q is staged as a %s", ErrInvalidPath, rel, a, c.Kind)
			}
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
		default:
			return nil, fmt.Errorf("%w: %q: parent %q is a %s, not a directory (delete it first)", ErrInvalidPath, rel, a, s.Type)
		}
	}
	return recs, nil
}

// checkReplace refuses to stage a non-directory at rel over a directory
// that is not staged for deletion, and over special files.
func (t *Tx) checkReplace(rel string, before snapshot, c *change) error {
	switch {
	case before.Type == typeOther:
		return fmt.Errorf("%w: %q is a special file", ErrInvalidPath, rel)
	case t.stagedBelow(rel):
		return fmt.Errorf("%w: %q has staged entries beneath it", ErrInvalidPath, rel)
	case before.Type == typeDir && (c == nil || c.Kind == KindMkdir):
		return fmt.Errorf("%w: %q is a directory (delete it first)", ErrInvalidPath, rel)
	}
	return nil
}

func (t *Tx) countCheck(extra int) error {
	t.mu.Lock()
	n := len(t.changes)
	t.mu.Unlock()
	if n+extra > t.fs.opts.maxChanges {
		return &LimitError{Name: LimitChanges, Value: int64(t.fs.opts.maxChanges)}
	}
	return nil
}

// Write stages rel to hold exactly data with mode's permission bits
// (rwx for user, group, other; setuid, setgid and sticky are dropped). A
// zero mode keeps the mode of the file it replaces (0644 for a new file).
// Missing parent directories are staged too. The bytes are on disk, and
// survive a crash of this process, when Write returns.
func (t *Tx) Write(p string, data []byte, mode os.FileMode) error {
	rel, err := cleanRel(t.fs.ws.dir, p)
	if err != nil {
		return err
	}
	if int64(len(data)) > t.fs.opts.maxFileBytes {
		return &LimitError{Name: LimitFileBytes, Value: t.fs.opts.maxFileBytes}
	}
	sha := sha256Hex(data)
	return t.stageOp(func() ([]stageRec, int64, error) {
		c := t.cur(rel)
		before, err := t.before(rel)
		if err != nil {
			return nil, 0, err
		}
		if err := t.checkReplace(rel, before, c); err != nil {
			return nil, 0, err
		}
		recs, err := t.parents(rel)
		if err != nil {
			return nil, 0, err
		}
		if err := t.countCheck(len(recs) + 1); err != nil {
			return nil, 0, err
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
		var delta int64 = int64(len(data))
		if c != nil {
			delta -= c.Size
		}
		if err := t.putBlob(sha, data); err != nil {
			return nil, 0, err
		}
		nc := &change{Path: rel, Kind: KindWrite, Mode: m, Blob: sha, Size: int64(len(data)), Before: before}
		return append(recs, stageRec{Op: "set", Change: nc}), delta, nil
	})
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
// directory it stages a mode change.
func (t *Tx) Mkdir(p string, mode os.FileMode) error {
	rel, err := cleanRel(t.fs.ws.dir, p)
	if err != nil {
		return err
	}
	return t.stageOp(func() ([]stageRec, int64, error) {
		c := t.cur(rel)
		before, err := t.before(rel)
		if err != nil {
			return nil, 0, err
		}
		if before.Type == typeOther || (before.Type == typeFile || before.Type == typeSymlink) && c == nil {
			return nil, 0, fmt.Errorf("%w: %q is a %s (delete it first)", ErrInvalidPath, rel, before.Type)
		}
		recs, err := t.parents(rel)
		if err != nil {
			return nil, 0, err
		}
		if err := t.countCheck(len(recs) + 1); err != nil {
			return nil, 0, err
		}
		m := unixMode(mode)
		if mode == 0 {
			m = 0o755
		}
		m &^= syscall.S_ISUID // setgid and sticky are common and harmless on directories
		var delta int64
		if c != nil {
			delta = -c.Size
		}
		nc := &change{Path: rel, Kind: KindMkdir, Mode: m, Before: before}
		return append(recs, stageRec{Op: "set", Change: nc}), delta, nil
	})
}

// Symlink stages a symlink at rel pointing to target. Targets that are
// absolute, climb out of the workspace or point into .pulse are refused,
// so a committed link never leads a later reader outside the workspace.
func (t *Tx) Symlink(target, p string) error {
	rel, err := cleanRel(t.fs.ws.dir, p)
	if err != nil {
		return err
	}
	if err := checkLinkTarget(rel, target); err != nil {
		return err
	}
	return t.stageOp(func() ([]stageRec, int64, error) {
		c := t.cur(rel)
		before, err := t.before(rel)
		if err != nil {
			return nil, 0, err
		}
		if err := t.checkReplace(rel, before, c); err != nil {
			return nil, 0, err
		}
		recs, err := t.parents(rel)
		if err != nil {
			return nil, 0, err
		}
		if err := t.countCheck(len(recs) + 1); err != nil {
			return nil, 0, err
		}
		var delta int64
		if c != nil {
			delta = -c.Size
		}
		nc := &change{Path: rel, Kind: KindSymlink, Target: target, Before: before}
		return append(recs, stageRec{Op: "set", Change: nc}), delta, nil
	})
}

// Delete stages the removal of rel. A directory is removed with
// everything beneath it, each entry snapshotted so that commit notices
// any of them changing. Deleting a path the transaction created unstages
// it. A path that neither exists nor is staged is ErrNotFound.
func (t *Tx) Delete(p string) error {
	rel, err := cleanRel(t.fs.ws.dir, p)
	if err != nil {
		return err
	}
	return t.stageOp(func() ([]stageRec, int64, error) {
		if err := t.realAncestors(rel); err != nil {
			return nil, 0, err
		}
		paths := map[string]bool{}
		if err := t.walk(rel, paths); err != nil {
			return nil, 0, err
		}
		t.mu.Lock()
		for q := range t.changes {
			if q == rel || strings.HasPrefix(q, rel+"/") {
				paths[q] = true
			}
		}
		t.mu.Unlock()
		if len(paths) == 0 {
			return nil, 0, fmt.Errorf("%w: %q does not exist", ErrNotFound, rel)
		}
		if err := t.countCheck(len(paths)); err != nil {
			return nil, 0, err
		}
		sorted := make([]string, 0, len(paths))
		for q := range paths {
			sorted = append(sorted, q)
		}
		sort.Strings(sorted)
		var recs []stageRec
		var delta int64
		for _, q := range sorted {
			c := t.cur(q)
			if c != nil {
				delta -= c.Size
			}
			before, err := t.before(q)
			if err != nil {
				return nil, 0, err
			}
			if before.Type == typeAbsent {
				if c != nil {
					recs = append(recs, stageRec{Op: "unstage", Path: q})
				}
				continue
			}
			recs = append(recs, stageRec{Op: "set", Change: &change{Path: q, Kind: KindDelete, Before: before}})
		}
		return recs, delta, nil
	})
}

// realAncestors refuses a path reached through a symlinked directory:
// removing it would remove whatever the link points at.
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
	fi, err := t.fs.ws.root.Lstat(rel)
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
func (t *Tx) Discard() error {
	unlock, err := t.fs.lock(context.Background())
	if err != nil {
		return err
	}
	defer unlock()
	if err := t.refreshLocked(true); err != nil {
		return err
	}
	if err := t.fs.removeState(t.dir()); err != nil {
		return err
	}
	t.fs.addStaged(-t.bytes)
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
		if !validSHA(c.Blob) || c.Size < 0 {
			return fmt.Errorf("%w: %q: bad blob", errCorrupt, c.Path)
		}
	case KindSymlink:
		// The target policy (checkLinkTarget) is applied when a link is
		// staged; undo may restore a pre-existing link of any target, so
		// the record only has to be well formed.
		if c.Target == "" || strings.IndexByte(c.Target, 0) >= 0 || len(c.Target) > maxPathLen {
			return fmt.Errorf("%w: %q: bad symlink target", errCorrupt, c.Path)
		}
	case KindMkdir, KindDelete:
	default:
		return fmt.Errorf("%w: %q: unknown kind %q", errCorrupt, c.Path, c.Kind)
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
