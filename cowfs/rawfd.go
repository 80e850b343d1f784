package cowfs

import (
	"errors"
	"hash"
	"io"
	"io/fs"
	"path"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A commit of many small files does a few system calls per file; an
// os.File would add five to each open (Go tries to register every opened
// file with its poller: two fcntl to make it non-blocking, an epoll_ctl
// that a regular file or directory refuses, two fcntl to undo it) and an
// allocation with a finalizer. The hot paths of a commit (the new file's
// bytes, the renames, hashing a file) use raw descriptors instead,
// reached through the same rules as the os.Root.

// dirFD returns a descriptor of the workspace directory rel ("" or "."
// for the workspace itself) and the func that releases it. rel is walked
// one name at a time from the workspace's own descriptor, each opened
// O_DIRECTORY|O_NOFOLLOW, so nothing on the way leads out of the
// workspace — stricter than the os.Root, which follows a symlink that
// stays inside: cowfs writes only where every ancestor is a real
// directory (checkStructure), and one that became a symlink since is
// refused (ELOOP, ENOTDIR) rather than followed.
//
// The workspace's own descriptor is held (topMu) until the root's release
// or the end of the walk, so that a Close meanwhile cannot hand its
// number to another file.
func (w *workspace) dirFD(rel string) (int, func(), error) {
	w.topMu.RLock()
	if w.topClosed {
		w.topMu.RUnlock()
		return -1, nil, &fs.PathError{Op: "openat", Path: rel, Err: fs.ErrClosed}
	}
	if rel == "" || rel == "." {
		return w.topFD, w.topMu.RUnlock, nil
	}
	defer w.topMu.RUnlock()
	fd := w.topFD
	end := 0 // rel[:end] is the directory being opened
	for name := range strings.SplitSeq(rel, "/") {
		if end > 0 {
			end++
		}
		end += len(name)
		if name == "" || name == "." || name == ".." {
			if fd != w.topFD {
				unix.Close(fd)
			}
			return -1, nil, &fs.PathError{Op: "openat", Path: rel, Err: ErrInvalidPath}
		}
		next, err := openat(fd, name, dirFlags|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if fd != w.topFD {
			unix.Close(fd)
		}
		if err != nil {
			return -1, nil, &dirError{Dir: rel[:end], Err: err}
		}
		fd = next
	}
	return fd, func() { unix.Close(fd) }, nil
}

// dirError is dirFD's failure to open Dir, a directory on the way to the
// one asked for: ENOTDIR or ELOOP when a file or symlink is there now,
// ENOENT when nothing is.
type dirError struct {
	Dir string
	Err error
}

func (e *dirError) Error() string { return "openat " + e.Dir + ": " + e.Err.Error() }
func (e *dirError) Unwrap() error { return e.Err }

// lstatSys is lstat of the literal path rel, with what lstat (above)
// promises: an ancestor that is not a real directory (a symlink, a file)
// means rel does not exist (ENOTDIR).
func (w *workspace) lstatSys(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	dir, release, err := w.dirFD(path.Dir(rel))
	if errors.Is(err, unix.ELOOP) {
		err = &fs.PathError{Op: "lstat", Path: rel, Err: unix.ENOTDIR}
	}
	if err != nil {
		return st, err
	}
	defer release()
	err = ignoringEINTR(func() error { return unix.Fstatat(dir, path.Base(rel), &st, unix.AT_SYMLINK_NOFOLLOW) })
	return st, pathErr("lstat", rel, err)
}

// ignoringEINTR calls fn again while it fails with EINTR, as the os
// package does its system calls.
func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// openat is openat(2), retried on EINTR.
func openat(dir int, name string, flags int, perm uint32) (int, error) {
	var fd int
	err := ignoringEINTR(func() (err error) { fd, err = unix.Openat(dir, name, flags, perm); return err })
	return fd, err
}

// writeAll writes all of b to fd.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		var n int
		err := ignoringEINTR(func() (err error) { n, err = unix.Write(fd, b); return err })
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		b = b[n:]
	}
	return nil
}

// fdReader reads a raw descriptor.
type fdReader int

func (r fdReader) Read(b []byte) (int, error) {
	var n int
	err := ignoringEINTR(func() (err error) { n, err = unix.Read(int(r), b); return err })
	switch {
	case err != nil:
		return 0, err
	case n == 0 && len(b) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// fstatSnap is the snapshot of what fd is open on (no content hash).
func fstatSnap(fd int) (snapshot, error) {
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return snapshot{}, err
	}
	return unixSnap(&st), nil
}

// unixSnap is sysSnap of x/sys/unix's stat.
func unixSnap(st *unix.Stat_t) snapshot {
	return newSnap(uint32(st.Mode), st.Ino, uint64(st.Dev), st.Size, st.Mtim.Nano())
}

// copyBufSize is the buffer a commit reads staged bytes and workspace
// files through.
const copyBufSize = 64 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// copyHash reads r to its end through buf, hashing what it reads into h
// and handing it to out (when not nil), and returns how many bytes it
// read. Unlike io.Copy it never allocates a buffer of its own (32 KiB per
// call, per file of a commit, and the garbage collection that follows).
func copyHash(h hash.Hash, out func([]byte) error, r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			n += int64(k)
			h.Write(buf[:k])
			if out != nil {
				if werr := out(buf[:k]); werr != nil {
					return n, werr
				}
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// pathErr wraps a raw call's errno like the os package does.
func pathErr(op, p string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: p, Err: err}
}
