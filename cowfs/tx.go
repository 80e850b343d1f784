package cowfs

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/internal/fsmode"
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
	// ModeChanged is true when a write or mkdir replaces an entry of its
	// own kind (a file, a directory) in the workspace and changes its
	// permission bits, OldMode; a reviewer must see a chmod even when the
	// content is the same.
	ModeChanged bool        `json:"mode_changed,omitempty"`
	OldMode     fs.FileMode `json:"old_mode,omitempty"`
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

// Tx is a copy-on-write transaction: changes staged under .pulse/cow and
// applied to the workspace only by Commit. A Tx value may be used from
// several goroutines; the same transaction may be opened by several
// processes, each seeing the others' staged changes on its next call.
type Tx struct {
	fs   *FS
	id   string
	lane string // set by Begin or the begin record (lane.go)

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
	return TxInfo{ID: t.id, Lane: t.lane, Description: t.desc, State: StateOpen, Created: t.created,
		Changes: len(t.changes), Whiteouts: len(t.whiteouts), Bytes: t.bytes}
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
	if err := t.fs.countStaged(); err != nil {
		return err
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
	pc := Change{Path: c.Path, Kind: c.Kind, Mode: fsmode.FromUnix(c.Mode), Size: c.Size, Target: c.Target,
		New: c.Before.Type == typeAbsent, Implicit: c.Implicit}
	if c.Kind == KindWrite && c.Before.Type == typeFile || c.Kind == KindMkdir && c.Before.Type == typeDir && !c.Implicit {
		if c.Before.Mode&0o7777 != c.Mode&0o7777 {
			pc.ModeChanged, pc.OldMode = true, fsmode.FromUnix(c.Before.Mode&0o7777)
		}
	}
	return pc
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
