package namespace

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/pathguard"
)

// maxOverlayTotal bounds the bytes of all files of one overlay, since the
// whole overlay is returned in memory. A variable so tests can lower it.
var maxOverlayTotal int64 = 4 << 30

// maxOverlayFile bounds one file read back from the upper layer, so that a
// command cannot make the backend allocate without limit.
const maxOverlayFile = 1 << 30 // and never more than maxOverlayTotal

// streamMin is the size from which a regular file is handed as
// File.Source rather than read into memory, when the request allows it.
// A variable so tests can lower it.
var streamMin int64 = 1 << 20

// readOverlayKeep is readOverlayOn that moves each regular file of at
// least streamMin bytes into keep and hands it as File.Source (keep nil:
// every file is read into Data). The overlay's Release removes keep; on
// error the caller releases keep.
func readOverlayKeep(upper string, lower lowerView, hidden hiddenSet, keep *holder) (*backend.Overlay, error) {
	w := &overlayWalk{hidden: hidden, keep: keep}
	ufd, err := openUpperDir(unix.AT_FDCWD, upper)
	if err != nil {
		return nil, err
	}
	defer unix.Close(ufd)
	// The workspace is reached the way a path lookup under it would be
	// (its own path may hold a symlink); what is beneath, one name at a
	// time without following any (lowerView.dirAt).
	lfd, err := openPathDir(unix.AT_FDCWD, lower.dir, 0)
	if err != nil {
		lfd = -1
	} else {
		defer unix.Close(lfd)
	}
	if err := walkUpper(w, upper, ufd, lower, lfd, "."); err != nil {
		return nil, err
	}
	ov := &w.Overlay
	if keep.holds() {
		ov.SetRelease(keep.release)
	} else {
		_ = keep.release() // nothing kept: it only frees the scratch
	}
	sort.Slice(ov.Files, func(i, j int) bool { return ov.Files[i].Path < ov.Files[j].Path })
	sort.Strings(ov.Deleted)
	return ov, nil
}

// overlayWalk is an Overlay being built, with the bytes read so far.
type overlayWalk struct {
	backend.Overlay
	size   int64
	hidden hiddenSet // paths the command was shown as absent
	keep   *holder   // where large files are moved to be handed as Source; nil reads them
}

// holder keeps the large files of one overlay, moved out of the upper
// layer so that the run directory can go as usual. It is a run directory
// of its own, locked while held, so that Reconcile removes it only once
// its owner is gone.
type holder struct {
	b *Backend
	r *run
	n int
	// scratch, when set, is the tmpfs the upper layer is on (see
	// scratch_linux.go): files are kept in it, moved (another filesystem
	// would take a copy), and it is held open until release.
	scratch *os.File
	kept    bool
}

// holds reports whether the holder keeps anything; nil-safe.
func (h *holder) holds() bool {
	return h != nil && (h.r != nil || h.kept)
}

// take moves the upper file full into the holder and returns its new
// path. The command is gone, so nothing else writes the file.
func (h *holder) take(full string) (string, error) {
	if h.scratch != nil {
		dir := scratchPath(h.scratch) + "/keep"
		if !h.kept {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
			}
			h.kept = true
		}
		if err := os.Chmod(full, 0o600); err != nil {
			return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
		}
		h.n++
		dst := filepath.Join(dir, strconv.Itoa(h.n))
		if err := os.Rename(full, dst); err != nil {
			return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
		}
		return dst, nil
	}
	if h.r == nil {
		r, err := h.b.newRun()
		if err != nil {
			return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
		}
		h.r = r
	}
	// Made unreadable by the command (chmod 000)? The upper layer is
	// ours, and the caller keeps the mode it saw. On any error nothing
	// has moved, so the caller can still read full.
	if err := os.Chmod(full, 0o600); err != nil {
		return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
	}
	h.n++
	dst := filepath.Join(h.r.dir, "upper", strconv.Itoa(h.n))
	if err := os.Rename(full, dst); err != nil {
		return "", fmt.Errorf("namespace: keeping overlay files: %w", err)
	}
	return dst, nil
}

// release removes what the holder keeps; nil-safe and idempotent. An
// error names the directory left on the host.
func (h *holder) release() error {
	if h == nil {
		return nil
	}
	if h.scratch != nil {
		// The last hold on the tmpfs: its memory is freed.
		h.scratch.Close()
		h.scratch = nil
	}
	if h.r == nil {
		return nil
	}
	r := h.r
	h.r = nil
	if err := r.remove(); err != nil {
		h.b.o.logger.Warn("namespace: removing kept overlay files", slog.String("dir", r.dir), slog.Any("err", err))
		return fmt.Errorf("namespace: overlay files kept in %s: %w", r.dir, err)
	}
	return nil
}

// walkUpper records the entries of upper/rel, whose directory is open as
// ufd. lfd is the workspace's directory rel, -1 when the workspace has no
// real directory there (no symlink on the way): lower entries are only
// consulted through real directories. Every entry is reached by its name
// in an open directory, never by a path, and nothing is followed: the
// upper directory is the command's work.
func walkUpper(ov *overlayWalk, upper string, ufd int, lower lowerView, lfd int, rel string) error {
	entries, err := readDirFD(ufd, filepath.Join(upper, filepath.FromSlash(rel)))
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		p := path.Join(rel, name)
		if p == pathguard.ReservedDir {
			// The directory the sandbox hides; the command cannot have
			// written into it. Another case spelling is a directory of
			// the command's own on this case-sensitive upper layer: it
			// is reported, so the facade refuses it (IsReserved)
			// visibly instead of its writes vanishing here.
			continue
		}
		if e.Type().IsRegular() {
			if err := ov.file(upper, ufd, lower, lfd, p, name); err != nil {
				return err
			}
			continue
		}
		var st unix.Stat_t
		if err := fstatat(ufd, name, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: filepath.Join(upper, filepath.FromSlash(p)), Err: err}
		}
		lst := lower.lstatAt(p, lfd, name)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			// Not what the directory said it was; the command is gone,
			// so something else is changing the upper layer.
			return fmt.Errorf("namespace: %s changed while the overlay was read", filepath.Join(upper, filepath.FromSlash(p)))
		case unix.S_IFLNK:
			t, err := readlinkat(ufd, name)
			if err != nil {
				return &fs.PathError{Op: "readlink", Path: filepath.Join(upper, filepath.FromSlash(p)), Err: err}
			}
			if lst != nil && lst.Mode()&fs.ModeSymlink != 0 {
				if lt, err := lower.readlinkAt(p, lfd, name); err == nil && lt == t {
					continue
				}
			}
			ov.Files = append(ov.Files, backend.File{Path: p, Mode: fs.ModeSymlink, Data: []byte(t)})
		case unix.S_IFCHR:
			if st.Rdev == 0 {
				// A whiteout. At a hidden path it is the backend's, or
				// the command's removal of what it never saw: not a
				// deletion.
				if lst != nil && !ov.hidden.covers(p) {
					ov.Deleted = append(ov.Deleted, p)
				}
			}
			// Other device nodes cannot be made in the sandbox; one that
			// is there anyway is reported like a FIFO.
			if st.Rdev != 0 {
				ov.special(p, fs.ModeDevice|fs.ModeCharDevice, st.Mode, lst)
			}
		case unix.S_IFDIR:
			// setgid and sticky are kept (as cowfs keeps them on
			// directories); setuid means nothing on one and is dropped.
			perm := fsmode.FromUnix(st.Mode) &^ fs.ModeSetuid
			if err := ov.dir(upper, ufd, lower, lfd, p, name, lst, perm); err != nil {
				return err
			}
		case unix.S_IFIFO:
			ov.special(p, fs.ModeNamedPipe, st.Mode, lst)
		case unix.S_IFSOCK:
			ov.special(p, fs.ModeSocket, st.Mode, lst)
		case unix.S_IFBLK:
			ov.special(p, fs.ModeDevice, st.Mode, lst)
		}
	}
	return nil
}

// special reports a FIFO, socket or device node at p (see backend.File):
// not workspace content, but what the command left there, so the caller
// can say it was not kept rather than that nothing changed. What the
// lower layer held there (lst), the command removed to make it: that is
// a deletion, as a whiteout is (and as the remote backend's snapshot,
// which carries no such entry, reports it), unless the path was hidden.
func (ov *overlayWalk) special(p string, typ fs.FileMode, mode uint32, lst fs.FileInfo) {
	ov.Files = append(ov.Files, backend.File{Path: p, Mode: typ | fsmode.FromUnix(mode)&fs.ModePerm})
	if lst != nil && !ov.hidden.covers(p) {
		ov.Deleted = append(ov.Deleted, p)
	}
}

// file records the regular file name of upper directory ufd, at p.
func (ov *overlayWalk) file(upper string, ufd int, lower lowerView, lfd int, p, name string) error {
	full := func() string { return filepath.Join(upper, filepath.FromSlash(p)) }
	fd, st, err := openUpperFile(ufd, name)
	if err != nil {
		return &fs.PathError{Op: "open", Path: full(), Err: err}
	}
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	mode, size := fs.FileMode(st.Mode&0o777), st.Size
	if ov.size += size; ov.size > maxOverlayTotal {
		return fmt.Errorf("%w: over %d bytes of written files", ErrOverlayTooLarge, maxOverlayTotal)
	}
	lst := lower.lstatAt(p, lfd, name)
	maybeSame := lst != nil && lst.Mode().IsRegular() && lst.Mode().Perm() == mode && lst.Size() == size
	if ov.keep != nil && size >= streamMin && !maybeSame {
		// Large and certainly changed: handed by path, never held in
		// memory. (One that may be an unchanged copy-up is read and
		// compared as before.)
		if size > maxOverlayFile {
			return fmt.Errorf("%w: %s: %d bytes is over the %d byte limit of one overlay file", ErrOverlayTooLarge, full(), size, maxOverlayFile)
		}
		// If it cannot be moved (a directory the command made
		// unwritable, say), it is read as before.
		if src, err := ov.keep.take(full()); err == nil {
			ov.Files = append(ov.Files, backend.File{Path: p, Mode: mode, Source: src})
			return nil
		}
	}
	data, err := readFD(fd, size, full)
	if err != nil {
		return err
	}
	if maybeSame && lower.sameAt(p, lfd, name, data) {
		return nil // copied up (touch, chmod back) but unchanged
	}
	ov.Files = append(ov.Files, backend.File{Path: p, Mode: mode, Data: data})
	return nil
}

// dir records the directory name of upper directory ufd, at p, and what
// it holds. lst is what the command saw there beneath it; perm the
// directory's permission, setgid and sticky bits as the command left
// them: a directory that was there before is recorded too when they
// differ from what the command saw (a chmod), since a copied-up one
// keeps its mode.
func (ov *overlayWalk) dir(upper string, ufd int, lower lowerView, lfd int, p, name string, lst fs.FileInfo, perm fs.FileMode) error {
	sub, err := openUpperDir(ufd, name)
	if err != nil {
		return &fs.PathError{Op: "open", Path: filepath.Join(upper, filepath.FromSlash(p)), Err: err}
	}
	defer unix.Close(sub)
	// wsDir: the workspace itself has a real directory there (the
	// pending view may have made one where it has not, or hidden one
	// that is).
	subL := lower.dirAt(lfd, name)
	if subL >= 0 {
		defer unix.Close(subL)
	}
	wsDir := subL >= 0
	if lst == nil || !lst.IsDir() {
		if lst != nil {
			// A file or link replaced by a directory.
			ov.Deleted = append(ov.Deleted, p)
		}
		ov.Files = append(ov.Files, backend.File{Path: p, Mode: fs.ModeDir | perm})
	} else {
		if lst.Mode()&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky) != perm {
			ov.Files = append(ov.Files, backend.File{Path: p, Mode: fs.ModeDir | perm})
		}
		if isOpaqueFD(sub) && !ov.hidden.covers(p) {
			// The directory was removed and made again: every lower
			// entry not in upper is gone.
			if err := opaqueDeletions(ov, upper, lower, p, wsDir); err != nil {
				return err
			}
		}
	}
	return walkUpper(ov, upper, sub, lower, subL, p)
}

func opaqueDeletions(ov *overlayWalk, upper string, lower lowerView, rel string, wsDir bool) error {
	names, err := lower.list(rel, wsDir)
	if err != nil {
		return fmt.Errorf("listing lower %s: %w", rel, err)
	}
	for _, name := range names {
		p := path.Join(rel, name)
		if _, err := os.Lstat(filepath.Join(upper, filepath.FromSlash(p))); errors.Is(err, fs.ErrNotExist) {
			ov.Deleted = append(ov.Deleted, p)
		}
	}
	return nil
}

// isOpaqueFD reports an overlayfs opaque directory, open as fd. With
// userxattr (user namespaces) the mark is user.overlay.opaque, otherwise
// trusted.overlay.opaque; only "y" means opaque ("x" marks a directory
// that merely holds whiteouts).
func isOpaqueFD(fd int) bool {
	for _, name := range []string{"user.overlay.opaque", "trusted.overlay.opaque"} {
		buf := make([]byte, 8)
		n, err := unix.Fgetxattr(fd, name, buf)
		if err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// Raw descriptors, not os.File: os.OpenFile of a regular file or a
// directory tries to register it with Go's poller (two or four fcntl and
// an epoll_ctl that fails), five system calls on each of a thousand
// files a command wrote.

// openUpperDir opens the upper directory name of dir (AT_FDCWD: a path)
// to read it, without following a symlink. A directory the command made
// unreadable (chmod 000) is opened up first: the upper layer is ours, and
// the reported mode was taken before.
func openUpperDir(dir int, name string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := openat(dir, name, flags)
	if err == unix.EACCES && unix.Fchmodat(dir, name, 0o700, 0) == nil {
		fd, err = openat(dir, name, flags)
	}
	return fd, err
}

// openUpperFile opens the regular file name of upper directory dir for
// reading, and returns it with its stat (the mode as the command left
// it). O_NONBLOCK|O_NOFOLLOW: a FIFO or a symlink at name (the entry the
// directory listed as a regular file has been replaced) neither blocks
// nor is followed, and anything but a regular file is refused. A file the
// command made unreadable (chmod 000) is opened up first; no process of
// the sandbox is left to swap it for something else.
func openUpperFile(dir int, name string) (int, unix.Stat_t, error) {
	const flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	var st unix.Stat_t
	fd, err := openat(dir, name, flags)
	if err == unix.EACCES {
		if err := fstatat(dir, name, &st); err != nil {
			return -1, st, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return -1, st, unix.EINVAL
		}
		mode := st.Mode
		if err := unix.Fchmodat(dir, name, 0o600, 0); err != nil {
			return -1, st, unix.EACCES
		}
		if fd, err = openat(dir, name, flags); err != nil {
			return -1, st, err
		}
		if err := fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, st, err
		}
		st.Mode = st.Mode&unix.S_IFMT | mode&^unix.S_IFMT
	} else if err != nil {
		return -1, st, err
	} else if err := fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, st, unix.EINVAL
	}
	return fd, st, nil
}

// openPathDir opens directory name of dir as an O_PATH descriptor to look
// names up in: flags unix.O_NOFOLLOW refuses a symlink at name (ENOTDIR),
// 0 follows it. O_PATH needs no read permission on the directory, as a
// path lookup through it does not.
func openPathDir(dir int, name string, flags int) (int, error) {
	return openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|flags)
}

func openat(dir int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(dir, name, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

func fstatat(dir int, name string, st *unix.Stat_t) error {
	for {
		err := unix.Fstatat(dir, name, st, unix.AT_SYMLINK_NOFOLLOW)
		if err != unix.EINTR {
			return err
		}
	}
}

func fstat(fd int, st *unix.Stat_t) error {
	for {
		err := unix.Fstat(fd, st)
		if err != unix.EINTR {
			return err
		}
	}
}

// readlinkat is os.Readlink of name in dir.
func readlinkat(dir int, name string) (string, error) {
	for n := 128; ; n *= 2 {
		b := make([]byte, n)
		k, err := unix.Readlinkat(dir, name, b)
		if err == unix.EINTR {
			n /= 2
			continue
		}
		if err != nil {
			return "", err
		}
		if k < n {
			return string(b[:k]), nil
		}
	}
}

// readDirFD lists directory fd (at path p, for errors and for the
// entries whose type the file system does not report).
func readDirFD(fd int, p string) ([]fs.DirEntry, error) {
	d, err := unix.Dup(fd)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	unix.CloseOnExec(d)
	f := os.NewFile(uintptr(d), p)
	defer f.Close()
	return f.ReadDir(-1)
}

// readFD reads the regular file fd, of size bytes at its open, to its
// end, refusing more than maxOverlayFile. p names it in errors.
func readFD(fd int, size int64, p func() string) ([]byte, error) {
	if size > maxOverlayFile {
		return nil, fmt.Errorf("%w: %s: %d bytes is over the %d byte limit of one overlay file", ErrOverlayTooLarge, p(), size, maxOverlayFile)
	}
	// One byte more than its size, so that the end is seen without
	// growing the buffer.
	data := make([]byte, 0, size+1)
	for {
		if len(data) == cap(data) {
			if len(data) > maxOverlayFile {
				return nil, fmt.Errorf("%w: %s: over the %d byte limit of one overlay file", ErrOverlayTooLarge, p(), maxOverlayFile)
			}
			data = append(data, 0)[:len(data)]
		}
		n, err := unix.Read(fd, data[len(data):cap(data)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: p(), Err: err}
		}
		if n == 0 {
			break
		}
		data = data[:len(data)+n]
	}
	if len(data) > maxOverlayFile {
		return nil, fmt.Errorf("%w: %s: over the %d byte limit of one overlay file", ErrOverlayTooLarge, p(), maxOverlayFile)
	}
	return data, nil
}

// sameContentAt reports whether the regular file name of directory dir
// holds exactly data. Opened like an upper file (openUpperFile, without
// opening up its mode): a FIFO neither blocks nor counts.
func sameContentAt(dir int, name string, data []byte) bool {
	fd, err := openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(len(data)) {
		return false
	}
	buf, err := readFD(fd, st.Size, func() string { return name })
	return err == nil && bytes.Equal(buf, data)
}
