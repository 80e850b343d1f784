package cowfs

import (
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"

	"github.com/pulse-agent/pulse/internal/fsmode"
)

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

// replaceRecs returns what is at rel now (before the change), and what
// staging a non-directory there needs besides its own record: its parents,
// and, when a directory is there (in the workspace or staged), the removal
// of everything beneath it.
func (t *Tx) replaceRecs(rel string) (snapshot, []stageRec, error) {
	before, err := t.before(rel)
	if err != nil {
		return before, nil, err
	}
	if before.Type == typeOther {
		return before, nil, fmt.Errorf("%w: %q is a special file", ErrInvalidPath, rel)
	}
	recs, err := t.parents(rel)
	if err != nil {
		return before, nil, err
	}
	if c := t.cur(rel); before.Type == typeDir || c != nil && c.Kind == KindMkdir {
		below, err := t.removalRecs(rel, false)
		if err != nil {
			return before, nil, err
		}
		recs = append(recs, below...)
	}
	return before, recs, nil
}

// planWrite returns the records staging a write of rel; the last one is
// the write's own.
func (t *Tx) planWrite(rel, sha string, size int64, mode os.FileMode) ([]stageRec, error) {
	before, recs, err := t.replaceRecs(rel)
	if err != nil {
		return nil, err
	}
	m := fsmode.ToUnix(mode)
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
	m = t.writeBits(m, before, typeFile)
	nc := &change{Path: rel, Kind: KindWrite, Mode: m, Blob: sha, Size: size, Before: before}
	return append(recs, stageRec{Op: "set", Change: nc}), nil
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
	m := fsmode.ToUnix(mode)
	if mode == 0 {
		m = 0o755
	}
	m &^= syscall.S_ISUID // setgid and sticky are common and harmless on directories
	m = t.writeBits(m, before, typeDir)
	nc := &change{Path: rel, Kind: KindMkdir, Mode: m, Before: before}
	return append(recs, stageRec{Op: "set", Change: nc}), nil
}

// writeBits takes the guarded write bits out of m where before, the
// workspace entry, is not of type typ or has not got them
// (WithoutNewWriteBits).
func (t *Tx) writeBits(m uint32, before snapshot, typ string) uint32 {
	had := uint32(0)
	if before.Type == typ {
		had = before.Mode
	}
	return m &^ (t.fs.opts.guardWrite &^ had)
}

func (t *Tx) planSymlink(rel, target string) ([]stageRec, error) {
	before, recs, err := t.replaceRecs(rel)
	if err != nil {
		return nil, err
	}
	nc := &change{Path: rel, Kind: KindSymlink, Target: target, Before: before}
	return append(recs, stageRec{Op: "set", Change: nc}), nil
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
