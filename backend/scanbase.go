package backend

import (
	"io/fs"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/pathguard"
)

// BaseEntry is one entry ScanBase visits, with what an lstat of it says.
// The same *BaseEntry is reused for every entry: it is valid only during
// the call that receives it.
type BaseEntry struct {
	Rel   string // slash-separated, relative to the workspace
	Mode  uint32 // st_mode: the type (unix.S_IFMT) and the permission bits
	Size  int64
	Mtime int64 // nanoseconds since the epoch
	Ctime int64 // nanoseconds since the epoch
	Ino   uint64

	dir  int    // the open directory that holds it
	name string // its name in dir
	abs  string // the path of dir
}

// Type is the entry's unix.S_IFMT bits.
func (e *BaseEntry) Type() uint32 { return e.Mode & unix.S_IFMT }

// Readlink returns the target of the symlink e, read relative to the
// directory it was found in.
func (e *BaseEntry) Readlink() (string, error) {
	for n := 256; ; n *= 2 {
		buf := make([]byte, n)
		k, err := unix.Readlinkat(e.dir, e.name, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: e.abs + "/" + e.name, Err: err}
		}
		if k < n {
			return string(buf[:k]), nil
		}
	}
}

// ScanBase visits exactly the entries WalkBase visits (the test compares
// the two), but reads each directory with getdents and stats its entries
// relative to the directory's descriptor, without a FileInfo, a DirEntry
// or a path lookup per entry: for a copying backend, which walks the
// whole workspace before every command, WalkBase's was most of the
// host's CPU per command. Entries come in directory order, a directory
// before what it holds. Every failure to read an entry or a directory is
// an error, as it is for WalkBase's callers: a tree read in part would
// tell the caller that the rest is gone. Unlike WalkBase, a workspace
// root that is not a directory (a symlink) is an error too, not an empty
// tree, and a directory is opened with O_NOFOLLOW relative to its parent,
// so a directory swapped for a symlink during the scan is never followed.
// The scan holds one descriptor per level of depth.
func (p *Pending) ScanBase(ws string, hidden map[string]bool, fn func(*BaseEntry) error) error {
	fd, err := openDir(unix.AT_FDCWD, ws)
	if err != nil {
		return &fs.PathError{Op: "open", Path: ws, Err: err}
	}
	s := &baseScan{p: p, hidden: hidden, fn: fn, buf: make([]byte, 32<<10)}
	return s.dir(fd, ws, "")
}

type baseScan struct {
	p      *Pending
	hidden map[string]bool
	fn     func(*BaseEntry) error
	buf    []byte   // getdents buffer
	names  []string // a stack of paths: each directory's above its parents'
	e      BaseEntry
}

// dir scans the open directory fd (path abs, rel prefix prefix: "" at the
// root, else "rel/") and closes it.
func (s *baseScan) dir(fd int, abs, prefix string) error {
	defer unix.Close(fd)
	start := len(s.names)
	var err error
	s.names, err = readNames(fd, s.buf, prefix, s.names)
	if err != nil {
		s.names = s.names[:start]
		return &fs.PathError{Op: "readdirent", Path: abs, Err: err}
	}
	end := len(s.names)
	defer func() { s.names = s.names[:start] }()
	for i := start; i < end; i++ {
		rel := s.names[i]
		name := rel[len(prefix):]
		if prefix == "" && pathguard.IsReserved(name) {
			continue
		}
		if s.hidden[rel] {
			continue
		}
		// A path the view decides is the caller's (Shown), but for a
		// pending directory over a workspace one: what that holds may
		// show through, so it is walked into.
		into := false
		if e, decided := s.p.Lookup(rel); decided {
			if e == nil || e.Kind != PendingDir {
				continue
			}
			into = true
		}
		var st unix.Stat_t
		if err := lstatAt(fd, name, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: abs + "/" + name, Err: err}
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if into && !isDir {
			continue
		}
		if !into {
			s.e = BaseEntry{Rel: rel, Mode: uint32(st.Mode), Size: st.Size, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(),
				Ino: uint64(st.Ino), dir: fd, name: name, abs: abs}
			if err := s.fn(&s.e); err != nil {
				return err
			}
		}
		if isDir {
			sub, err := openDir(fd, name)
			if err != nil {
				return &fs.PathError{Op: "open", Path: abs + "/" + name, Err: err}
			}
			if err := s.dir(sub, abs+"/"+name, rel+"/"); err != nil {
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
