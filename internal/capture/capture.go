// Package capture is the one reader of a workspace tree for every box
// host that cannot take what a command wrote from an overlay's upper
// directory: the Docker backend's model of its container's base, the
// host backend's scan before and after a command, and pulse-server's
// snapshot and archive of a workspace it runs on a worker. They all
// walk with Walk, so they agree on what a tree holds: the reserved
// .pulse/ left out, symlinks never followed, every entry stat'ed
// relative to its directory's descriptor.
package capture

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/fsmode"
)

// reserved is pathguard.ReservedDir (a test holds them equal), spelled
// here so that the in-box runtime, which walks with this package, links
// no more than it runs.
const reserved = ".pulse"

// Entry is one entry Walk visits, with what an lstat of it says. The
// same *Entry is reused for every entry: it is valid only during the
// call that receives it.
type Entry struct {
	Rel   string // slash-separated, relative to the root
	Mode  uint32 // st_mode: the type (unix.S_IFMT) and the permission bits
	Size  int64
	Mtime int64 // nanoseconds since the epoch
	Ctime int64 // nanoseconds since the epoch
	Ino   uint64
	Nlink uint64

	dir  int    // the open directory that holds it
	name string // its name in dir
	abs  string // the path of dir
}

// Type is the entry's unix.S_IFMT bits.
func (e *Entry) Type() uint32 { return e.Mode & unix.S_IFMT }

// FileMode is the entry's type and permission bits (setuid, setgid and
// sticky included) as package fs spells them.
func (e *Entry) FileMode() fs.FileMode { return fsmode.FromStat(e.Mode) }

// Path is the entry's path: the root joined with Rel.
func (e *Entry) Path() string { return e.abs + "/" + e.name }

// Readlink returns the target of the symlink e, read relative to the
// directory it was found in.
func (e *Entry) Readlink() (string, error) {
	for n := 256; ; n *= 2 {
		buf := make([]byte, n)
		k, err := unix.Readlinkat(e.dir, e.name, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: e.Path(), Err: err}
		}
		if k < n {
			return string(buf[:k]), nil
		}
	}
}

// Open opens the regular file e for reading, relative to the directory
// it was found in and never through a symlink: a file swapped for a
// symlink after the lstat is refused, not followed out of the tree.
func (e *Entry) Open() (*os.File, error) {
	for {
		fd, err := unix.Openat(e.dir, e.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: e.Path(), Err: err}
		}
		f := os.NewFile(uintptr(fd), e.Path())
		// O_NONBLOCK keeps a FIFO put in the file's place from blocking
		// the open; what is open must still be the regular file.
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			f.Close()
			return nil, &fs.PathError{Op: "open", Path: e.Path(), Err: ErrChanged}
		}
		if err := unix.SetNonblock(fd, false); err != nil {
			f.Close()
			return nil, &fs.PathError{Op: "open", Path: e.Path(), Err: err}
		}
		return f, nil
	}
}

// ErrChanged: an entry was no longer what Walk found when it was opened.
var ErrChanged = errors.New("capture: the entry changed while it was read")

// Verdict is what a Filter says of a path.
type Verdict uint8

// The verdicts.
const (
	// Visit: the entry is given to fn, and a directory walked into.
	Visit Verdict = iota
	// Skip: neither the entry nor anything beneath it is visited.
	Skip
	// Within: the entry is not given to fn, but when it is a directory
	// what it holds is (each by its own verdict); anything else is
	// left out.
	Within
)

// Options tune a Walk.
type Options struct {
	// Filter, when set, gives each path's verdict before its lstat.
	Filter func(rel string) Verdict
	// Lenient leaves out an entry or directory below the root that
	// cannot be read (gone, replaced, unreadable) instead of failing:
	// for a scan that runs while something else may still write, where
	// a missing entry reads as deleted. A strict walk (the default)
	// fails, because a tree read in part would tell the caller that the
	// rest is gone.
	Lenient bool
	// Vanished, in a strict walk, leaves out an entry that is gone by
	// the time it is stat'ed (ENOENT after its directory was read), and
	// fails on any other error: for a tree nothing writes any more but
	// the walker's own clean-up (a box's copy after its command).
	Vanished bool
	// Sorted gives each directory's entries in byte order of their
	// names, not in directory order: for a listing two walks of equal
	// trees must write alike.
	Sorted bool
	// KeepReserved visits the reserved directory at the top too (with
	// Filter's verdict), for a walker that leaves out only exactly the
	// name it owns and must see every other spelling.
	KeepReserved bool
}

// Walk calls fn for every entry beneath root, but for the reserved
// directory at the top (unless KeepReserved) and what Filter skips. It
// reads each directory with getdents and stats its entries relative to
// the directory's descriptor, without a FileInfo, a DirEntry or a path
// lookup per entry. Entries come in directory order (or sorted, with
// Options.Sorted), a directory before what it holds. A root that is not
// a directory (a symlink to one included) is an error, and every
// directory is opened with O_NOFOLLOW relative to its parent, so a
// directory swapped for a symlink during the walk is never followed. The
// walk holds one descriptor per level of depth. What fn returns ends the
// walk and is returned as it is, but fs.SkipDir (for a directory: what
// it holds is left out, and the walk goes on).
func Walk(root string, o Options, fn func(*Entry) error) error {
	fd, err := openDir(unix.AT_FDCWD, root)
	if err != nil {
		return &fs.PathError{Op: "open", Path: root, Err: err}
	}
	w := &walker{o: o, fn: fn, buf: make([]byte, 32<<10)}
	return w.dir(fd, root, "")
}

type walker struct {
	o     Options
	fn    func(*Entry) error
	buf   []byte   // getdents buffer
	names []string // a stack of paths: each directory's above its parents'
	e     Entry
}

// dir walks the open directory fd (path abs, rel prefix prefix: "" at
// the root, else "rel/") and closes it.
func (w *walker) dir(fd int, abs, prefix string) error {
	defer unix.Close(fd)
	start := len(w.names)
	var err error
	w.names, err = readNames(fd, w.buf, prefix, w.names)
	if err != nil {
		w.names = w.names[:start]
		if w.o.Lenient && prefix != "" {
			return nil
		}
		return &fs.PathError{Op: "readdirent", Path: abs, Err: err}
	}
	end := len(w.names)
	if w.o.Sorted {
		slices.Sort(w.names[start:end])
	}
	defer func() { w.names = w.names[:start] }()
	for i := start; i < end; i++ {
		rel := w.names[i]
		name := rel[len(prefix):]
		// pathguard.IsReserved of a top-level name: any case, so that
		// a case-insensitive file system cannot alias it.
		if prefix == "" && !w.o.KeepReserved && strings.EqualFold(name, reserved) {
			continue
		}
		v := Visit
		if w.o.Filter != nil {
			v = w.o.Filter(rel)
		}
		if v == Skip {
			continue
		}
		var st unix.Stat_t
		if err := lstatAt(fd, name, &st); err != nil {
			if w.o.Lenient || w.o.Vanished && err == unix.ENOENT {
				continue
			}
			return &fs.PathError{Op: "lstat", Path: abs + "/" + name, Err: err}
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if v == Within && !isDir {
			continue
		}
		if v == Visit {
			w.e = Entry{Rel: rel, Mode: uint32(st.Mode), Size: st.Size, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(),
				Ino: uint64(st.Ino), Nlink: uint64(st.Nlink), dir: fd, name: name, abs: abs}
			if err := w.fn(&w.e); errors.Is(err, fs.SkipDir) {
				continue
			} else if err != nil {
				return err
			}
		}
		if isDir {
			sub, err := openDir(fd, name)
			if err != nil {
				if w.o.Lenient {
					continue
				}
				return &fs.PathError{Op: "open", Path: abs + "/" + name, Err: err}
			}
			if err := w.dir(sub, abs+"/"+name, rel+"/"); err != nil {
				return err
			}
		}
	}
	return nil
}

// openDir opens the directory name relative to dirfd, never through a
// symlink.
func openDir(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// lstatAt is fstatat without following a symlink at name.
func lstatAt(dirfd int, name string, st *unix.Stat_t) error {
	for {
		if err := unix.Fstatat(dirfd, name, st, unix.AT_SYMLINK_NOFOLLOW); err != unix.EINTR {
			return err
		}
	}
}
