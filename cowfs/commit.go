package cowfs

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"time"
)

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

// commitLocked runs the commit protocol (doc.go) in its phases: the WAL
// of the staged changes, validated against the workspace, written (the
// commit point), then applied. Call with the lock.
func (t *Tx) commitLocked(ctx context.Context) ([]string, error) {
	if err := t.refreshLocked(true); err != nil {
		return nil, err
	}
	w, err := t.newWAL()
	if err != nil {
		return nil, err
	}
	f, dir := t.fs, t.dir()
	if err := t.validate(ctx, w); err != nil {
		f.state.RemoveAll(dir + "/prev")
		return nil, err
	}
	failpoint(fpValidated)
	if err := f.writeWAL(dir, w); err != nil {
		f.state.RemoveAll(dir + "/prev")
		return nil, err
	}
	failpoint(fpWALRenamed)
	return t.applyWAL(dir, w)
}

// newWAL is the WAL of the staged changes, in path order, refused when
// their shape or their symlinks could not be applied as staged.
func (t *Tx) newWAL() (*walFile, error) {
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
	if err := t.fs.checkLinks(w, false); err != nil {
		return nil, fmt.Errorf("cowfs: commit %s refused: %w", t.id, err)
	}
	return w, nil
}

// validate checks w against the workspace before the commit point: every
// target is as it was staged over (else a *ConflictError), and the tree's
// shape, the staged bytes and the free space allow applying all of it. It
// makes the transaction's prev directory, where applying keeps the bytes
// it replaces; the caller removes it when validate fails.
func (t *Tx) validate(ctx context.Context, w *walFile) error {
	f, dir := t.fs, t.dir()
	f.state.RemoveAll(dir + "/prev")
	if err := f.state.Mkdir(dir+"/prev", 0o700); err != nil {
		return fmt.Errorf("cowfs: commit: %w", err)
	}
	f.state.Remove(dir + "/failed")
	for i := range w.Ops {
		if err := ctx.Err(); err != nil {
			return err
		}
		op := &w.Ops[i]
		// The before bytes are kept (for undo and rollback) when the
		// file is replaced, as a link to the replaced inode: nothing is
		// copied here, only hashed.
		op.Prev = op.Before.Type == typeFile
		cur, err := f.ws.snap(op.Path, nil)
		if err != nil {
			return fmt.Errorf("cowfs: commit: %q: %w", op.Path, err)
		}
		if dirMadeMeanwhile(&op.change, cur) {
			// Someone made the directory meanwhile; writing into it is
			// fine. It is theirs now: the commit keeps it as it is (no
			// mode of the staged mkdir), and undo will leave it alone.
			op.Before, op.Implicit = cur, true
			continue
		}
		if reason := compare(op.Before, cur); reason != "" {
			return conflict(op.Path, reason)
		}
	}
	if err := f.checkStructure(w); err != nil {
		return err
	}
	// The staged bytes must all be there and whole before the commit
	// point: past it, a missing or damaged blob would leave the commit
	// half applied.
	if err := f.checkBlobs(dir, w.Ops); err != nil {
		return fmt.Errorf("cowfs: commit %s refused: %w", t.id, err)
	}
	if err := f.checkSpace(w); err != nil {
		return fmt.Errorf("cowfs: commit %s refused: %w", t.id, err)
	}
	return f.syncState(dir + "/prev")
}

// applyWAL applies a commit whose WAL is in place: from here on the
// commit happens. If applying fails (a full disk, damaged bytes, a change
// racing in), everything is rolled back and the transaction is pending
// again; if even that fails, the WAL stays for the next Open to roll
// forward. That is so too when a directory on the way became a symlink
// or a file after the commit began writing: what it wrote beneath cannot
// be seen to be taken back until the directory is back. It returns the
// paths changed.
func (t *Tx) applyWAL(dir string, w *walFile) ([]string, error) {
	f := t.fs
	interrupted := func(err error) ([]string, error) {
		return nil, fmt.Errorf("cowfs: commit %s interrupted (Open rolls it forward): %w", t.id, err)
	}
	if err := f.syncState(dir); err != nil {
		return interrupted(err)
	}
	failpoint(fpWALSynced)
	a := f.newApplier(dir, w, false)
	afters, err := a.apply()
	if err == nil {
		// Before cleanup: a commit that cannot record its after-images
		// is rolled back while what it replaced is still beside the
		// targets (see writeAfter).
		err = f.writeAfter(dir, afters)
	}
	if err != nil {
		// A directory on the way that became a symlink or a file since
		// validation is a change racing in, as one at a target is.
		err = asConflict(err)
		if rerr := f.abandon(a, err); rerr != nil {
			return interrupted(errors.Join(err, rerr))
		}
		return nil, fmt.Errorf("cowfs: commit %s rolled back, the transaction is pending: %w", t.id, err)
	}
	if err := a.cleanup(); err != nil {
		return interrupted(err)
	}
	if err := f.finish(dir, w, afters); err != nil {
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
	checked := map[string]uint64{} // a real directory: its inode
	for i := range w.Ops {
		op := &w.Ops[i]
		for _, a := range ancestors(op.Path) {
			if at[a] != nil || checked[a] != 0 {
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
			checked[a] = max(statSnap(fi).Ino, 1)
		}
		// The directory the op works in, where no op says what it is.
		op.Dir = checked[path.Dir(op.Path)]
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

// writeAfter records the after-images of an applied commit, before the
// entries it moved aside are removed (cleanup). A commit that cannot
// record them (a full disk) is rolled back, and only then can the
// rollback put back the very entries the commit replaced: afterwards the
// replaced files are only in prev/, where a file that had other hard
// links, or lived on another file system, is a copy, and removed
// directories and symlinks are gone, so what a rollback put back would be
// new inodes, which the transaction's before snapshots no longer match
// (a retry would be refused as a conflict for good), and a file's other
// names would no longer be linked to it. Recovery of a commit that
// already wrote them (it may have removed the entries since) writes
// nothing when they are the ones it finds now, so it needs no room and
// has no reason to roll back.
func (f *FS) writeAfter(dir string, afters []snapshot) error {
	if b, err := f.state.ReadFile(dir + "/after"); err == nil {
		if old, err := decodeAfter(b, len(afters)); err == nil && len(old) == len(afters) {
			same := true
			for i := range afters {
				if compare(old[i], afters[i]) != "" {
					same = false
					break
				}
			}
			if same {
				failpoint(fpAfterWritten)
				return nil
			}
		}
	}
	buf, err := encodeAfter(afters)
	if err != nil {
		return &afterError{err}
	}
	if err := f.replaceFileSync(dir+"/after", buf); err != nil {
		return &afterError{err}
	}
	failpoint(fpAfterWritten)
	return nil
}

// finish, once the after-images are written and the entries moved aside
// removed, moves the transaction into the undo journal (or, for an undo,
// drops the entry it reverted), then trims the journal to the undo depth.
func (f *FS) finish(dir string, w *walFile, afters []snapshot) error {
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

// rebaseAfter keeps the undo journal checkable after an Undo. The undo
// restored each of its paths to the bytes an earlier entry (the latest
// one before the undone entry that changed that path) recorded as its
// after-image, but under new inodes, so without this that entry's Undo
// would see them as replaced. For each path the undo restored, the
// latest earlier entry that changed it takes the undo's identity where
// the content matches its after-image. That entry need not be the one
// just before the undone entry: with a commit of other paths in between,
// it is reached only after that one is undone too. The search for a path
// stops at an entry that cannot be read (its Undo refuses anyway, so
// nothing below it is undone before it). Rerunning it after a crash is
// harmless.
func (f *FS) rebaseAfter(w *walFile, afters []snapshot) error {
	entries, err := f.doneEntries()
	if err != nil {
		return err
	}
	left := make(map[string]int, len(w.Ops)) // paths not yet placed: op index
	for i := range w.Ops {
		left[w.Ops[i].Path] = i
	}
	for k := len(entries) - 1; k >= 0 && len(left) > 0; k-- {
		e := entries[k]
		if e >= w.Undoes {
			continue
		}
		wb, err := f.state.ReadFile("done/" + e + "/wal")
		if err != nil {
			return nil
		}
		pw, err := decodeWAL(wb)
		if err != nil {
			return nil // a damaged entry is refused by Undo anyway
		}
		ab, err := f.state.ReadFile("done/" + e + "/after")
		if err != nil {
			return nil
		}
		pa, err := decodeAfter(ab, len(pw.Ops))
		if err != nil {
			return nil
		}
		changed := false
		for j := range pw.Ops {
			i, ok := left[pw.Ops[j].Path]
			if !ok {
				continue
			}
			delete(left, pw.Ops[j].Path)
			if sameContent(pa[j], afters[i]) && pa[j] != afters[i] {
				pa[j] = afters[i]
				changed = true
			}
		}
		if !changed {
			continue
		}
		buf, err := encodeAfter(pa)
		if err != nil {
			return err
		}
		if err := f.replaceFileSync("done/"+e+"/after", buf); err != nil {
			return err
		}
	}
	return nil
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
