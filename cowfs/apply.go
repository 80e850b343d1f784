package cowfs

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/fsmode"
)

// Names beside a target, in its directory, that only the commit of one
// transaction uses: newName holds the op's new content until it is
// published (and, after an exchange, the entry it displaced); oldName
// holds what a removal moved out of the way until the commit is done.
// Both start with ".pulse-cow-<id>-", which nothing else creates.
func tempName(id string, i int, target string) string {
	return path.Join(path.Dir(target), ".pulse-cow-"+id+"-"+strconv.Itoa(i))
}

func oldName(id string, i int, target string) string { return tempName(id, i, target) + "-old" }

// exchanges reports whether op replaces an entry that stays at its path
// until the new one takes its place (a file or symlink over a file or
// symlink): published with one RENAME_EXCHANGE, the displaced entry then
// sits at the op's newName.
func exchanges(op *walOp) bool {
	return (op.Kind == KindWrite || op.Kind == KindSymlink) &&
		(op.Before.Type == typeFile || op.Before.Type == typeSymlink)
}

// applier is one application of a WAL to the workspace.
type applier struct {
	f          *FS
	dir        string // the transaction's state directory
	w          *walFile
	recovering bool
	afters     []snapshot
	// removedDir maps the path of each removed directory to its op, so
	// that the entries moved out of its children can be found after it
	// was moved itself.
	removedDir map[string]int
	// syncDirs holds one directory per file system the commit touches;
	// syncfs(2) of each makes everything written there durable at once.
	syncDirs map[uint64]string
	seenDir  map[string]bool
	blobs    *blobReader // the staged bytes, while apply runs
	// started holds the ops this applier may have changed the workspace
	// for: each is set right before the first call that can. An op of a
	// commit of this process that is not in it has nothing to take back.
	started map[int]bool
	// at maps each op's path to it; dirs each directory ops work in
	// to its inode as validated (walOp.Dir).
	at   map[string]*walOp
	dirs map[string]uint64
}

func (f *FS) newApplier(dir string, w *walFile, recovering bool) *applier {
	a := &applier{f: f, dir: dir, w: w, recovering: recovering, afters: make([]snapshot, len(w.Ops)),
		removedDir: map[string]int{}, syncDirs: map[uint64]string{}, seenDir: map[string]bool{}}
	a.at, a.dirs = make(map[string]*walOp, len(w.Ops)), map[string]uint64{}
	for i := range w.Ops {
		a.at[w.Ops[i].Path] = &w.Ops[i]
		if w.Ops[i].Dir != 0 {
			a.dirs[path.Dir(w.Ops[i].Path)] = w.Ops[i].Dir
		}
		if removesFirst(&w.Ops[i]) && w.Ops[i].Before.Type == typeDir {
			a.removedDir[w.Ops[i].Path] = i
		}
	}
	a.touch(".")
	a.touch(StateDir)
	return a
}

// touch notes the file system of workspace directory d for the syncs.
func (a *applier) touch(d string) {
	if d == "" {
		d = "."
	}
	if a.seenDir[d] {
		return
	}
	a.seenDir[d] = true
	fi, err := a.f.ws.root.Lstat(d)
	if err != nil {
		return
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if _, ok := a.syncDirs[uint64(st.Dev)]; !ok {
			a.syncDirs[uint64(st.Dev)] = d
		}
	}
}

// sync makes everything written so far durable on every file system the
// commit touched: one syncfs(2) each instead of one fsync per file and
// directory. syncfs waits for the data and metadata of every inode of
// the file system and flushes the device cache, so it gives what the
// fsyncs it replaces gave, and reports writeback errors since Linux 5.8.
func (a *applier) sync() error {
	for _, d := range a.syncDirs {
		fl, err := a.f.ws.root.Open(d)
		if err != nil {
			return fmt.Errorf("sync %q: %w", d, err)
		}
		err = syncFS(int(fl.Fd()))
		fl.Close()
		if err != nil {
			return fmt.Errorf("sync %q: %w", d, err)
		}
	}
	return nil
}

// order returns the removals deepest first and the creations shallowest
// first.
func (a *applier) order() (removes, creates []int) {
	w := a.w
	for i := range w.Ops {
		if removesFirst(&w.Ops[i]) {
			removes = append(removes, i)
		}
		if w.Ops[i].Kind != KindDelete {
			creates = append(creates, i)
		}
	}
	sort.SliceStable(removes, func(x, y int) bool {
		return depth(w.Ops[removes[x]].Path) > depth(w.Ops[removes[y]].Path)
	})
	sort.SliceStable(creates, func(x, y int) bool {
		return depth(w.Ops[creates[x]].Path) < depth(w.Ops[creates[y]].Path)
	})
	return removes, creates
}

// locate returns where the entry originally at p is now: removed
// directories on the way were moved to their oldName.
func (a *applier) locate(p string) string {
	parts := strings.Split(p, "/")
	cur, orig := "", ""
	for k, part := range parts {
		orig = path.Join(orig, part)
		next := path.Join(cur, part)
		if j, ok := a.removedDir[orig]; ok && k < len(parts)-1 {
			// The moved name is the commit's alone: where it exists, the
			// directory is there (its own name may hold the new entry).
			moved := path.Join(cur, path.Base(oldName(a.w.ID, j, orig)))
			if _, err := a.f.ws.root.Lstat(moved); err == nil {
				next = moved
			}
		}
		cur = next
	}
	return cur
}

// displaced returns where the entry op i removed is kept until the
// commit is done.
func (a *applier) displaced(i int) string {
	op := &a.w.Ops[i]
	return path.Join(path.Dir(a.locate(op.Path)), path.Base(oldName(a.w.ID, i, op.Path)))
}

// apply makes the workspace hold what the WAL says.
//
//  1. Removals, deepest first: each entry is renamed (RENAME_NOREPLACE)
//     to its oldName and checked there against its before snapshot
//     (what was moved is what was validated, whatever raced in); a
//     mismatch moves it back and is a conflict. A removed file is linked
//     into prev/ (copied where it cannot be).
//  2. Creations, shallowest first: directories are made under a temp
//     name with their mode and renamed into place; files are written to
//     their newName, their bytes checked against the record on the way;
//     symlinks are made at their newName. Nothing is fsynced one by one.
//  3. One syncfs per file system: every new file's bytes are durable.
//  4. Publication, shallowest first: a file or symlink over a file or
//     symlink is exchanged with it (RENAME_EXCHANGE), and the displaced
//     entry is then checked against the before snapshot: if an editor
//     changed the target since validation, the exchange is undone and it
//     is a conflict; else the displaced file is linked into prev/. Over
//     nothing, a rename with RENAME_NOREPLACE, so an entry that appeared
//     meanwhile is a conflict, not overwritten.
//  5. One syncfs per file system: every rename is durable.
//
// When recovering (after precheck), each step skips what is done. Every
// step can be redone, so a crash anywhere, recovery included, is
// recovered the same way.
func (a *applier) apply() ([]snapshot, error) {
	a.blobs = a.f.blobReader(a.dir)
	defer func() { a.blobs.close(); a.blobs = nil }()
	removes, creates := a.order()
	for _, i := range removes {
		if err := a.remove(i); err != nil {
			return nil, err
		}
	}
	var publish []int
	for _, i := range creates {
		pub, err := a.create(i)
		if err != nil {
			return nil, err
		}
		if pub {
			publish = append(publish, i)
		}
	}
	if err := a.sync(); err != nil {
		return nil, err
	}
	failpoint(fpApplySynced)
	for _, i := range publish {
		if err := a.publish(i); err != nil {
			return nil, err
		}
	}
	if err := a.sync(); err != nil {
		return nil, err
	}
	failpoint(fpApplied)
	return a.afters, nil
}

func (a *applier) remove(i int) error {
	f, op := a.f, &a.w.Ops[i]
	cur, err := f.ws.snap(op.Path, nil)
	if err != nil {
		return fmt.Errorf("%q: %w", op.Path, err)
	}
	if cur.Type == typeAbsent {
		if !a.recovering && op.Before.Type != typeAbsent {
			// Validated present: removed since, or a directory on the
			// way is a symlink now. Not what was reviewed either way.
			return conflict(op.Path, ReasonDeleted)
		}
		return nil // moved already (an earlier attempt), or never there
	}
	if a.recovering && (op.Kind != KindDelete && matchesAfter(op, cur) || op.Kind == KindMkdir && cur.Type == typeDir) {
		return nil // replaced already (a directory perhaps not yet with its mode)
	}
	// Right before the move, so a change since validation is refused
	// rather than moved (and after the move, the moved entry is checked
	// again: a change landing between the two is seen there).
	if reason := compare(op.Before, cur); reason != "" {
		return conflict(op.Path, reason)
	}
	if err := a.checkParent(i); err != nil {
		return err
	}
	a.touch(path.Dir(op.Path))
	old := oldName(a.w.ID, i, op.Path)
	a.start(i)
	f.ws.removeJunk(old)
	if err := f.ws.renameNoReplace(op.Path, old); err != nil {
		return fmt.Errorf("remove %q: %w", op.Path, err)
	}
	moved, err := f.ws.snap(old, nil)
	if err != nil {
		return fmt.Errorf("remove %q: %w", op.Path, err)
	}
	reason := compare(op.Before, moved)
	if reason == "" && moved.Type == typeDir {
		reason, err = a.onlyDisplaced(old, op.Path)
		if err != nil {
			return err
		}
	}
	if reason != "" {
		if err := f.ws.renameNoReplace(old, op.Path); err != nil {
			return fmt.Errorf("%w (and it could not be moved back from %q: %v)", conflict(op.Path, reason), old, err)
		}
		return conflict(op.Path, reason)
	}
	if op.Before.Type == typeFile {
		if err := a.savePrev(i, old, moved); err != nil {
			return err
		}
	}
	failpoint(fpApplyRemoved)
	return nil
}

// onlyDisplaced checks that the directory moved to old holds nothing but
// what this commit moved out of the way in it (its removed entries): a
// file created there since validation would otherwise go with it.
func (a *applier) onlyDisplaced(old, orig string) (string, error) {
	d, err := a.f.ws.root.Open(old)
	if err != nil {
		return "", err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return "", err
	}
	prefix := ".pulse-cow-" + a.w.ID + "-"
	for _, n := range names {
		if !strings.HasPrefix(n, prefix) || !strings.HasSuffix(n, "-old") {
			return ReasonCreated + " (" + path.Join(orig, n) + ")", nil
		}
	}
	return "", nil
}

// savePrev keeps the before bytes of op i for undo and rollback as
// prev/<i>: a hard link to the entry at src (already checked to be the
// before file, snapshot s), so nothing is copied; a copy, checked against
// the before hash, when the file has other names (they could change it
// later) or lives on another file system.
func (a *applier) savePrev(i int, src string, s snapshot) error {
	f, op := a.f, &a.w.Ops[i]
	dst := a.dir + "/prev/" + strconv.Itoa(i)
	if fi, err := f.state.Lstat(dst); err == nil {
		if got := statSnap(fi); got.Ino == s.Ino && got.Size == s.Size {
			return nil // linked by an earlier attempt
		}
		f.state.Remove(dst)
	}
	if err := f.state.MkdirAll(a.dir+"/prev", 0o700); err != nil {
		return fmt.Errorf("save %q: %w", op.Path, err)
	}
	nlink := uint64(1)
	if fi, err := f.ws.root.Lstat(src); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			nlink = uint64(st.Nlink)
		}
	}
	if nlink == 1 {
		if err := f.ws.root.Link(src, StateDir+"/"+dst); err == nil {
			return nil
		}
	}
	in, err := f.ws.root.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("save %q: %w", op.Path, err)
	}
	defer in.Close()
	out, err := f.state.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("save %q: %w", op.Path, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = verifySum(&change{Path: op.Path, Blob: op.Before.SHA, Size: op.Before.Size}, n, h)
	}
	if err != nil {
		f.state.Remove(dst)
		return fmt.Errorf("save %q: %w", op.Path, err)
	}
	return nil
}

// create does step 2 for op i and reports whether it waits for
// publication.
func (a *applier) create(i int) (bool, error) {
	f, op := a.f, &a.w.Ops[i]
	cur, err := f.ws.snap(op.Path, nil)
	if err != nil {
		return false, fmt.Errorf("%q: %w", op.Path, err)
	}
	if a.recovering && matchesAfter(op, cur) {
		a.afters[i] = cur
		return false, nil
	}
	if err := a.checkParent(i); err != nil {
		return false, err
	}
	a.touch(path.Dir(op.Path))
	var after snapshot
	switch op.Kind {
	case KindMkdir:
		a.start(i)
		after, err = f.applyMkdir(a.w.ID, i, op, cur)
		a.afters[i] = after
		return false, err
	case KindWrite:
		after, err = a.writeTemp(i)
	case KindSymlink:
		tmp := tempName(a.w.ID, i, op.Path)
		a.start(i)
		if err = f.ws.root.Symlink(op.Target, tmp); errors.Is(err, fs.ErrExist) {
			f.ws.removeJunk(tmp) // a crashed attempt's
			err = f.ws.root.Symlink(op.Target, tmp)
		}
		if err == nil {
			after, err = f.ws.snap(tmp, nil)
		}
	}
	if err != nil {
		return false, fmt.Errorf("apply %q: %w", op.Path, err)
	}
	a.afters[i] = after
	return true, nil
}

// writeTemp writes op i's staged bytes to its newName, checking them on
// the way, so what is published is what was staged whatever happened to
// the blob since the commit point. It is not fsynced: the syncfs after
// all of them is. The new file is a raw descriptor (rawfd.go), opened
// O_EXCL|O_NOFOLLOW in its directory reached by dirFD.
func (a *applier) writeTemp(i int) (snapshot, error) {
	f, op := a.f, &a.w.Ops[i]
	src, closer, err := a.blobs.open(&op.change)
	if err != nil {
		return snapshot{}, fmt.Errorf("%w: staged bytes of %q are missing: %v", ErrDamaged, op.Path, err)
	}
	defer closer.Close()
	tmp := tempName(a.w.ID, i, op.Path)
	dir, release, err := f.ws.dirFD(path.Dir(tmp))
	if err != nil {
		return snapshot{}, err
	}
	defer release()
	name := path.Base(tmp)
	// Made with its mode, which the umask may take bits from: fixed
	// below, where it did. (The file holds the bytes it is published
	// with, so it is never more open than it will be.)
	mode := op.Mode & 0o7777
	const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	a.start(i)
	fd, err := openat(dir, name, flags, mode)
	if err == unix.EEXIST {
		// Left by a crashed attempt; the name is the commit's alone.
		f.ws.removeJunk(tmp)
		fd, err = openat(dir, name, flags, mode)
	}
	if err != nil {
		return snapshot{}, pathErr("open", tmp, err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
			unix.Unlinkat(dir, name, 0)
		}
	}()
	h := sha256.New()
	n, err := copyHash(h, func(b []byte) error { return pathErr("write", tmp, writeAll(fd, b)) }, src, a.blobs.buffer())
	if err != nil {
		return snapshot{}, err
	}
	if err := verifySum(&op.change, n, h); err != nil {
		return snapshot{}, err
	}
	after, err := fstatSnap(fd)
	if err != nil {
		return snapshot{}, pathErr("stat", tmp, err)
	}
	if after.Mode != mode {
		// fchmod, unlike the open mode, is not masked by the umask.
		if err := unix.Fchmod(fd, mode); err != nil {
			return snapshot{}, pathErr("chmod", tmp, err)
		}
		if after, err = fstatSnap(fd); err != nil {
			return snapshot{}, pathErr("stat", tmp, err)
		}
	}
	ok = true // fd is closed once, here
	if err := unix.Close(fd); err != nil {
		unix.Unlinkat(dir, name, 0)
		return snapshot{}, pathErr("close", tmp, err)
	}
	after.SHA = op.Blob
	failpoint(fpApplyTemp)
	return after, nil
}

// publish does step 4 for op i.
func (a *applier) publish(i int) error {
	f, op := a.f, &a.w.Ops[i]
	tmp := tempName(a.w.ID, i, op.Path)
	if !exchanges(op) {
		if err := f.ws.renameNoReplace(tmp, op.Path); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return conflict(op.Path, ReasonCreated)
			}
			return fmt.Errorf("apply %q: %w", op.Path, err)
		}
		failpoint(fpApplyRenamed)
		return nil
	}
	// Re-validated right before the exchange (cheap, and it keeps an
	// exchange from ever happening over a file known to have changed),
	// then checked again after it, on the displaced entry itself.
	cur, err := f.ws.snap(op.Path, nil)
	if err != nil {
		return fmt.Errorf("%q: %w", op.Path, err)
	}
	if reason := compare(op.Before, cur); reason != "" {
		return conflict(op.Path, reason)
	}
	failpoint(fpApplyChecked)
	err = f.ws.rename2(tmp, op.Path, renameExchange)
	if err == errNoExchange {
		// The file system cannot exchange: save the before file first,
		// then rename over it. A change landing between the check above
		// and the rename is not seen (see the package documentation).
		if op.Before.Type == typeFile {
			if err := a.savePrev(i, op.Path, cur); err != nil {
				return err
			}
		}
		if err := f.ws.root.Rename(tmp, op.Path); err != nil {
			return fmt.Errorf("apply %q: %w", op.Path, err)
		}
		failpoint(fpApplyRenamed)
		return nil
	}
	if err != nil {
		return fmt.Errorf("apply %q: %w", op.Path, err)
	}
	failpoint(fpApplyExchanged)
	was, err := f.ws.snap(tmp, nil)
	if err == nil {
		if reason := compare(op.Before, was); reason != "" {
			// Someone changed the target between validation and the
			// exchange: give it back and refuse.
			if xerr := f.ws.rename2(tmp, op.Path, renameExchange); xerr != nil {
				return fmt.Errorf("%w (and the exchange could not be undone, the changed file is at %q: %v)", conflict(op.Path, reason), tmp, xerr)
			}
			return conflict(op.Path, reason)
		}
		if op.Before.Type == typeFile {
			err = a.savePrev(i, tmp, was)
		}
	}
	if err != nil {
		return fmt.Errorf("apply %q: %w", op.Path, err)
	}
	failpoint(fpApplyRenamed)
	return nil
}

// cleanup runs once every op is applied: it makes sure every replaced or
// removed file has its before bytes in prev/ (a crash may have come
// between an exchange and the link), makes that durable, then removes
// the entries kept beside the targets, deepest first, and syncs again.
// What it cannot remove is left and logged, never removed recursively: a
// displaced directory that holds anything else holds someone's file.
func (a *applier) cleanup() error {
	f := a.f
	type kept struct {
		i    int
		name string
	}
	var keep []kept
	for i := range a.w.Ops {
		op := &a.w.Ops[i]
		name := ""
		switch {
		case exchanges(op):
			name = tempName(a.w.ID, i, op.Path)
		case removesFirst(op):
			name = a.displaced(i)
		default:
			// Published by a rename (or made by an earlier attempt):
			// its temp name is gone once apply succeeded in this
			// process; only a crashed attempt can have left one.
			if a.recovering {
				f.ws.removeJunk(tempName(a.w.ID, i, op.Path))
			}
			continue
		}
		s, err := f.ws.snap(name, nil)
		if err != nil || s.Type == typeAbsent {
			continue
		}
		if op.Before.Type == typeFile {
			if compare(op.Before, s) == "" {
				if err := a.savePrev(i, name, s); err != nil {
					return err
				}
			} else if _, err := f.state.Lstat(a.dir + "/prev/" + strconv.Itoa(i)); err != nil {
				f.log.Warn("cowfs: the previous version of a committed file was changed while it was being replaced; it cannot be undone",
					"path", op.Path, "tx", a.w.ID)
			}
		}
		keep = append(keep, kept{i, name})
	}
	if err := a.sync(); err != nil {
		return err
	}
	sort.SliceStable(keep, func(x, y int) bool { return depth(keep[x].name) > depth(keep[y].name) })
	for _, k := range keep {
		if err := f.ws.root.Remove(k.name); err != nil && !isNotExist(err) {
			f.log.Warn("cowfs: an entry moved aside by a commit holds something else; left in place",
				"path", k.name, "tx", a.w.ID, "err", err)
		}
	}
	if err := a.sync(); err != nil {
		return err
	}
	failpoint(fpCleaned)
	return nil
}

// removeJunk removes an entry a crashed attempt left at one of a commit's
// temp names (a file, a symlink or an empty directory): the name is the
// commit's alone.
func (w *workspace) removeJunk(name string) {
	// Mostly there is nothing: one lstat rather than Remove's two
	// unlinks (file, then directory) that both fail.
	if _, err := w.root.Lstat(name); isNotExist(err) {
		return
	}
	w.root.Remove(name)
}

// applyMkdir makes op's directory. A new one is made under a temp name,
// given its mode, and renamed into place, so it never exists with the
// wrong mode (a crash between mkdir and chmod would otherwise leave it
// so, looking finished). An existing one only gets its mode, which is
// idempotent, so recovery finishes one left with the wrong mode.
func (f *FS) applyMkdir(id string, i int, op *walOp, cur snapshot) (snapshot, error) {
	if cur.Type != typeDir {
		if cur.Type != typeAbsent {
			return snapshot{}, conflict(op.Path, ReasonReplaced)
		}
		tmp := tempName(id, i, op.Path)
		f.ws.removeJunk(tmp)
		if err := f.ws.root.Mkdir(tmp, 0o700); err != nil {
			return snapshot{}, err
		}
		if err := f.ws.root.Chmod(tmp, fsmode.FromUnix(op.Mode)); err != nil {
			f.ws.root.Remove(tmp)
			return snapshot{}, err
		}
		failpoint(fpApplyMkdir)
		if err := f.ws.renameNoReplace(tmp, op.Path); err != nil {
			f.ws.root.Remove(tmp)
			if errors.Is(err, fs.ErrExist) {
				return snapshot{}, conflict(op.Path, ReasonCreated)
			}
			return snapshot{}, err
		}
		return f.ws.snap(op.Path, nil)
	}
	if !op.Implicit || op.Before.Type == typeAbsent {
		if cur.Mode != op.Mode {
			if err := f.ws.root.Chmod(op.Path, fsmode.FromUnix(op.Mode)); err != nil {
				return snapshot{}, err
			}
		}
	}
	return f.ws.snap(op.Path, nil)
}

// precheck is the recovery guard: every target must be as the WAL left it
// before, as it will leave it after, or absent mid-replacement; and no
// ancestor may have become a symlink or file.
func (f *FS) precheck(w *walFile) error {
	at := make(map[string]bool, len(w.Ops))
	for i := range w.Ops {
		at[w.Ops[i].Path] = true
	}
	checked, sameIno := map[string]bool{}, map[string]bool{}
	for i := range w.Ops {
		op := &w.Ops[i]
		for _, a := range ancestors(op.Path) {
			if at[a] || checked[a] {
				continue
			}
			fi, err := f.ws.root.Lstat(a)
			if err != nil || !fi.IsDir() {
				if op.Kind == KindDelete && isNotExist(err) {
					continue
				}
				return conflict(a, ReasonReplaced)
			}
			checked[a] = true
		}
		if d := path.Dir(op.Path); op.Dir != 0 && !sameIno[d] {
			// Another directory than the one validated, the one the
			// commit worked in renamed away.
			fi, err := f.ws.root.Lstat(d)
			if err == nil && fi.IsDir() && statSnap(fi).Ino != op.Dir {
				return conflict(d, ReasonReplaced)
			}
			sameIno[d] = true
		}
		cur, err := f.ws.snap(op.Path, nil)
		if err != nil {
			return fmt.Errorf("%q: %w", op.Path, err)
		}
		switch {
		case matchesAfter(op, cur):
		case compare(op.Before, cur) == "":
		case op.Kind == KindMkdir && cur.Type == typeDir:
			// Made (or found) but not yet given its mode: the chmod is
			// idempotent, so this is unfinished, not someone else's change.
		case cur.Type == typeAbsent && removesFirst(op):
		default:
			return conflict(op.Path, compare(op.Before, cur))
		}
	}
	return nil
}

// rollback brings every path of the WAL back to its before state, from
// what the workspace holds now: the entries kept beside the targets and
// the saved files in prev/ (links: the restored file is the very inode
// the commit validated, so a later retry finds no conflict). It undoes
// the creations deepest first, then the removals shallowest first, and
// never touches an entry that is neither the commit's nor the before
// one: a path someone else changed meanwhile keeps their change, and is
// reported. It is what Commit does when applying fails past the commit
// point (a full disk, damaged bytes, a conflict found while replacing),
// what recovery does when rolling forward cannot finish, and what
// Discard does to a commit that is stuck.
func (a *applier) rollback() error {
	f := a.f
	if err := a.hidden(); err != nil {
		// What the commit published there would stay, and the before
		// entries kept for it would go with the WAL.
		return fmt.Errorf("roll back: %w, and what the commit did beneath it cannot be seen", err)
	}
	// A commit of this process takes back only the ops it started: one
	// it never reached is in its before state, or someone else's (a path
	// beneath a directory swapped for a symlink reads as absent, and
	// "restoring" it would write through the link).
	mine := func(i int) bool { return a.recovering || a.started[i] }
	removes, creates := a.order()
	var errs []error
	for k := len(creates) - 1; k >= 0; k-- {
		if !mine(creates[k]) {
			continue
		}
		if err := a.uncreate(creates[k]); err != nil {
			errs = append(errs, err)
		}
	}
	for k := len(removes) - 1; k >= 0; k-- {
		if !mine(removes[k]) {
			continue
		}
		if err := a.unremove(removes[k]); err != nil {
			errs = append(errs, err)
		}
	}
	for i := range a.w.Ops {
		op := &a.w.Ops[i]
		if mine(i) && !exchanges(op) && !removesFirst(op) {
			f.ws.removeJunk(tempName(a.w.ID, i, op.Path))
		}
	}
	if err := a.sync(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// uncreate takes back what creating op i put at its path.
func (a *applier) uncreate(i int) error {
	f, op := a.f, &a.w.Ops[i]
	tmp := tempName(a.w.ID, i, op.Path)
	cur, err := f.ws.snap(op.Path, nil)
	if err != nil {
		return fmt.Errorf("%q: %w", op.Path, err)
	}
	if op.Kind == KindMkdir {
		f.ws.removeJunk(tmp)
		if cur.Type != typeDir {
			return nil
		}
		if op.Before.Type == typeDir {
			if !op.Implicit && cur.Mode != op.Before.Mode {
				return f.ws.root.Chmod(op.Path, fsmode.FromUnix(op.Before.Mode))
			}
			return nil
		}
		// The commit made it; it holds only what the commit put there
		// (taken back already), else removing it fails and says so.
		if err := f.ws.root.Remove(op.Path); err != nil {
			return fmt.Errorf("roll back %q: %w", op.Path, err)
		}
		return nil
	}
	if !matchesAfter(op, cur) {
		// Not published, or someone replaced it since: whatever is at
		// tmp is the new content (or, after an exchange that was undone,
		// the commit's own), never the before entry, which is checked.
		if s, err := f.ws.snap(tmp, nil); err == nil && s.Type != typeAbsent && (compare(op.Before, s) != "" || op.Before.Type == typeAbsent) {
			f.ws.removeJunk(tmp)
		}
		return nil
	}
	if exchanges(op) {
		if s, err := f.ws.snap(tmp, nil); err == nil && compare(op.Before, s) == "" {
			if err := f.ws.rename2(tmp, op.Path, renameExchange); err == nil {
				f.ws.removeJunk(tmp)
				return nil
			}
		}
		f.ws.removeJunk(tmp)
		return a.restore(i, true)
	}
	// Published over nothing: move it aside (so a change racing in is
	// not removed unseen), check it is the commit's, remove it.
	f.ws.removeJunk(tmp)
	if err := f.ws.renameNoReplace(op.Path, tmp); err != nil {
		return fmt.Errorf("roll back %q: %w", op.Path, err)
	}
	if s, err := f.ws.snap(tmp, nil); err != nil || !matchesAfter(op, s) {
		f.ws.renameNoReplace(tmp, op.Path)
		return fmt.Errorf("roll back %q: %w", op.Path, conflict(op.Path, ReasonModified))
	}
	f.ws.removeJunk(tmp)
	return nil
}

// unremove puts back what removing op i moved out of the way.
func (a *applier) unremove(i int) error {
	f, op := a.f, &a.w.Ops[i]
	cur, err := f.ws.snap(op.Path, nil)
	if err != nil {
		return fmt.Errorf("%q: %w", op.Path, err)
	}
	if cur.Type != typeAbsent {
		if compare(op.Before, cur) == "" {
			return nil
		}
		return fmt.Errorf("roll back %q: %w", op.Path, conflict(op.Path, compare(op.Before, cur)))
	}
	old := a.displaced(i)
	if s, err := f.ws.snap(old, nil); err == nil && s.Type != typeAbsent && compare(op.Before, s) == "" {
		if err := f.ws.renameNoReplace(old, op.Path); err != nil {
			return fmt.Errorf("roll back %q: %w", op.Path, err)
		}
		return nil
	}
	return a.restore(i, false)
}

// restore puts op i's before entry at its path from what the WAL and
// prev/ hold: the saved file (checked against its hash), the symlink's
// target, or a new directory with the before mode. over says whether the
// path holds the commit's entry, which is replaced (exchanged, then
// removed); else nothing is there.
func (a *applier) restore(i int, over bool) error {
	f, op := a.f, &a.w.Ops[i]
	b := op.Before
	tmp := tempName(a.w.ID, i, op.Path)
	f.ws.removeJunk(tmp)
	switch b.Type {
	case typeAbsent:
		if over {
			return a.uncreate(i)
		}
		return nil
	case typeFile:
		src := StateDir + "/" + a.dir + "/prev/" + strconv.Itoa(i)
		c := &change{Path: op.Path, Blob: b.SHA, Size: b.Size}
		if err := f.checkBlobAt(src, c); err != nil {
			return fmt.Errorf("roll back %q: %w", op.Path, err)
		}
		if err := f.ws.root.Link(src, tmp); err != nil {
			return fmt.Errorf("roll back %q: %w", op.Path, err)
		}
	case typeSymlink:
		if err := f.ws.root.Symlink(b.Target, tmp); err != nil {
			return fmt.Errorf("roll back %q: %w", op.Path, err)
		}
	case typeDir:
		if err := f.ws.root.Mkdir(tmp, 0o700); err != nil {
			return fmt.Errorf("roll back %q: %w", op.Path, err)
		}
		if err := f.ws.root.Chmod(tmp, fsmode.FromUnix(b.Mode)); err != nil {
			return fmt.Errorf("roll back %q: %w", op.Path, err)
		}
	}
	var err error
	if over {
		if err = f.ws.rename2(tmp, op.Path, renameExchange); err == errNoExchange {
			err = f.ws.root.Rename(tmp, op.Path)
		}
	} else {
		err = f.ws.renameNoReplace(tmp, op.Path)
	}
	f.ws.removeJunk(tmp)
	if err != nil {
		return fmt.Errorf("roll back %q: %w", op.Path, err)
	}
	return nil
}

// checkBlobAt checks the file at workspace path p against c's size and
// hash.
func (f *FS) checkBlobAt(p string, c *change) error {
	fl, err := f.ws.root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("%w: saved bytes of %q are missing: %v", ErrDamaged, c.Path, err)
	}
	defer fl.Close()
	h := sha256.New()
	n, err := io.Copy(h, fl)
	if err != nil {
		return fmt.Errorf("%w: saved bytes of %q: %v", ErrDamaged, c.Path, err)
	}
	return verifySum(c, n, h)
}

// abandon rolls back a commit that could not be applied and makes its
// transaction pending again: the WAL and the saved copies go, and the
// reason is kept in tx/<id>/failed for List. If the rollback cannot
// finish, the WAL stays (the next Open tries again) and the error says
// why.
func (f *FS) abandon(a *applier, cause error) error {
	if a.recovering || len(a.started) > 0 {
		if err := a.rollback(); err != nil {
			f.log.Error("cowfs: a failed commit could not be rolled back", "tx", a.w.ID, "err", err)
			return err
		}
	}
	return f.reopen(a, cause)
}

// reopen makes the transaction of a commit that left nothing in the
// workspace (rolled back, or never applied) pending again: the WAL and
// the saved copies go, and cause is kept in tx/<id>/failed for List.
func (f *FS) reopen(a *applier, cause error) error {
	if err := f.state.Remove(a.dir + "/wal"); err != nil && !isNotExist(err) {
		return err
	}
	f.state.RemoveAll(a.dir + "/prev")
	f.state.Remove(a.dir + "/after")
	if err := f.syncState(a.dir); err != nil {
		return err
	}
	if err := f.replaceFileSync(a.dir+"/failed", []byte(cause.Error()+"\n")); err != nil {
		f.log.Warn("cowfs: cannot record why a commit failed", "tx", a.w.ID, "err", err)
	}
	f.log.Warn("cowfs: a commit failed and was rolled back; the transaction is pending", "tx", a.w.ID, "err", cause)
	return nil
}

// start records that op i may change the workspace from now on.
func (a *applier) start(i int) {
	if a.started == nil {
		a.started = map[int]bool{}
	}
	a.started[i] = true
}

// hidden returns a conflict naming a directory on the way to a path the
// commit works at (to where the entry it moved aside is, for one beneath
// a directory it removes) that is not a real directory now: a symlink or
// a file took its place (ReasonReplaced), or nothing is there
// (ReasonDeleted). Paths are literal, so beneath it cowfs sees nothing,
// neither what the commit did there nor what it moved aside, until it is
// a directory again. A directory the commit makes (where there was
// nothing, a file or a symlink) hides nothing that was there before the
// commit. nil when there is no such directory. A commit of this process
// looks only at the ops it started: beneath a directory it never reached
// it did nothing.
func (a *applier) hidden() error {
	made := map[string]bool{}
	for i := range a.w.Ops {
		if op := &a.w.Ops[i]; op.Kind == KindMkdir && op.Before.Type != typeDir {
			made[op.Path] = true
		}
	}
	real := map[string]bool{}
	for i := range a.w.Ops {
		if !a.recovering && !a.started[i] {
			continue
		}
		op := &a.w.Ops[i]
		orig, cur := ancestors(op.Path), ancestors(a.locate(op.Path))
		for k, d := range cur {
			if made[orig[k]] {
				break
			}
			if real[d] {
				continue
			}
			// Outermost first, so no symlink on the way is followed.
			fi, err := a.f.ws.root.Lstat(d)
			switch {
			case isNotExist(err):
				return conflict(d, ReasonDeleted)
			case err != nil:
				return fmt.Errorf("%q: %w", d, err)
			case !fi.IsDir():
				return conflict(d, ReasonReplaced)
			case !a.sameDir(orig[k], fi):
				// Another directory: the one the commit worked in was
				// renamed away, and what it did there went with it.
				return conflict(d, ReasonReplaced)
			}
			real[d] = true
		}
	}
	return nil
}

// sameDir reports whether fi, a directory found on the way to an op
// where orig was, is the directory the commit validated there: the
// before image of the op at orig if there is one, or the inode
// validation recorded for the ops working in it (walOp.Dir). A
// directory the commit makes, and one no record names (a WAL from before
// they were recorded; a directory further up, which matters only
// through the one an op works in), are taken as the same.
func (a *applier) sameDir(orig string, fi fs.FileInfo) bool {
	ino := statSnap(fi).Ino
	if op := a.at[orig]; op != nil {
		return op.Before.Type != typeDir || op.Before.Ino == ino
	}
	want, ok := a.dirs[orig]
	return !ok || want == ino
}

// checkParent refuses, right before op i first changes the workspace,
// to work in a directory other than the one validated at its parent:
// the validated one was renamed away and another put in its place
// (ReasonReplaced). What the op would make or move aside there would be
// in a directory the commit does not know, and a rollback would put
// back there what the one renamed away held.
func (a *applier) checkParent(i int) error {
	d := path.Dir(a.w.Ops[i].Path)
	if d == "." {
		return nil
	}
	fi, err := a.f.ws.root.Lstat(d)
	if err != nil || !fi.IsDir() {
		return nil // not a directory: the op's own checks refuse it
	}
	if !a.sameDir(d, fi) {
		return conflict(d, ReasonReplaced)
	}
	return nil
}

// untouched reports whether the workspace holds nothing of the commit:
// no op is in its after state (unless that is its before state too), no
// name the commit uses beside a target exists, and nothing was saved to
// prev/. It is only sure when hidden is nil. Whatever it cannot read
// counts as touched.
func (a *applier) untouched() bool {
	f := a.f
	for i := range a.w.Ops {
		op := &a.w.Ops[i]
		if _, err := f.state.Lstat(a.dir + "/prev/" + strconv.Itoa(i)); !isNotExist(err) {
			return false
		}
		cur, err := f.ws.snap(op.Path, nil)
		if err != nil || matchesAfter(op, cur) && compare(op.Before, cur) != "" {
			return false
		}
		for _, n := range []string{tempName(a.w.ID, i, op.Path), oldName(a.w.ID, i, op.Path)} {
			if s, err := f.ws.snap(n, nil); err != nil || s.Type != typeAbsent {
				return false
			}
		}
	}
	return true
}

// asConflict is err, or, when err is dirFD's failure to reach a directory
// a commit works in (checked before as a real directory), the conflict
// that is: a symlink or a file is there now (ENOTDIR, ELOOP), or nothing
// is (ENOENT).
func asConflict(err error) error {
	var de *dirError
	if !errors.As(err, &de) {
		return err
	}
	reason := ""
	switch {
	case errors.Is(de.Err, unix.ENOTDIR), errors.Is(de.Err, unix.ELOOP):
		reason = ReasonReplaced
	case errors.Is(de.Err, unix.ENOENT):
		reason = ReasonDeleted
	default:
		return err
	}
	return fmt.Errorf("%w (%v)", conflict(de.Dir, reason), err)
}

// checkSpace refuses, before the commit point, a commit whose new files
// cannot fit on the workspace's file system: each new file exists beside
// its target until published, so the room needed is about what was
// staged, rounded up to blocks, plus a margin for the WAL, directories
// and after-images. Saved copies are links and take no room. A disk that
// fills up anyway (others write too) is handled by rolling back.
func (f *FS) checkSpace(w *walFile) error {
	d, err := f.ws.root.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(d.Fd()), &st); err != nil {
		return nil // unknown: the rollback covers it
	}
	bs := uint64(st.Bsize)
	if bs == 0 {
		bs = 4096
	}
	need, inodes := uint64(1<<20), uint64(16)
	for i := range w.Ops {
		op := &w.Ops[i]
		inodes++
		if op.Kind == KindWrite {
			need += (uint64(op.Size) + bs - 1) / bs * bs
		}
		need += 512 // its WAL record and after-image
	}
	if avail := st.Bavail * bs; need > avail {
		return fmt.Errorf("the commit needs about %d bytes on the workspace's file system and %d are free: %w", need, avail, syscall.ENOSPC)
	}
	if st.Files > 0 && inodes > st.Ffree {
		return fmt.Errorf("the commit needs about %d inodes on the workspace's file system and %d are free: %w", inodes, st.Ffree, syscall.ENOSPC)
	}
	return nil
}

// abortCommit rolls back the commit whose WAL is in dir and makes the
// transaction open again. A WAL that does not decode is left alone and
// reported (ErrRecovery): without it nothing says what to take back.
func (f *FS) abortCommit(dir string) error {
	b, err := f.state.ReadFile(dir + "/wal")
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrRecovery, dir, err)
	}
	w, err := decodeWAL(b)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrRecovery, dir, err)
	}
	a := f.newApplier(dir, w, true)
	if err := f.abandon(a, errors.New("discarded while committing")); err != nil {
		return fmt.Errorf("%w: %s: roll back: %w", ErrRecovery, dir, err)
	}
	return nil
}

// dropTemps removes what a commit that is being quarantined left beside
// its targets, so no temp file stays in the workspace: its new entries,
// and the entries it moved aside, once a before file among them is safe
// in prev/ (kept with the quarantined transaction). A before entry that
// cannot be kept so, or a moved-aside directory holding anything else,
// stays where it is.
func (a *applier) dropTemps() {
	f := a.f
	type entry struct {
		i    int
		name string
	}
	var names []entry
	for i := range a.w.Ops {
		names = append(names, entry{i, tempName(a.w.ID, i, a.w.Ops[i].Path)}, entry{i, a.displaced(i)})
	}
	sort.SliceStable(names, func(x, y int) bool { return depth(names[x].name) > depth(names[y].name) })
	for _, e := range names {
		op := &a.w.Ops[e.i]
		s, err := f.ws.snap(e.name, nil)
		if err != nil || s.Type == typeAbsent {
			continue
		}
		if compare(op.Before, s) == "" && op.Before.Type == typeFile {
			if err := a.savePrev(e.i, e.name, s); err != nil {
				f.log.Warn("cowfs: a replaced file of a quarantined commit is left beside its target", "path", e.name, "err", err)
				continue
			}
		}
		if err := f.ws.root.Remove(e.name); err != nil && !isNotExist(err) {
			f.log.Warn("cowfs: an entry of a quarantined commit is left beside its target", "path", e.name, "err", err)
		}
	}
}
