//go:build linux

package pathguard

import (
	"errors"
	"os"
	"path"
	"syscall"
)

var (
	errNotDir  = syscall.ENOTDIR
	errSymlink = errors.New("symlink at last element")
	errIsRoot  = errors.New("the root is a directory")
	errSpecial = errors.New("special file")
)

// openNoFollow opens rel inside r for reading. The parent directory is
// opened through r, so no intermediate element can lead out of it; the last
// element is opened with openat(2) and O_NOFOLLOW, which os.Root alone does
// not honour, and O_NONBLOCK, so that opening a FIFO returns at once.
func openNoFollow(r *os.Root, rel string) (*os.File, error) {
	if rel == "." {
		return nil, errIsRoot
	}
	dir, err := r.OpenFile(path.Dir(rel), os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	rc, err := dir.SyscallConn()
	if err != nil {
		return nil, err
	}
	name := path.Base(rel)
	fd := -1
	var oerr error
	cerr := rc.Control(func(dfd uintptr) {
		for {
			fd, oerr = syscall.Openat(int(dfd), name,
				syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC|syscall.O_NOCTTY, 0)
			if oerr != syscall.EINTR {
				return
			}
		}
	})
	if cerr != nil {
		return nil, cerr
	}
	if oerr != nil {
		switch oerr {
		case syscall.ELOOP:
			return nil, errSymlink
		case syscall.ENXIO, syscall.ENODEV, syscall.EOPNOTSUPP:
			return nil, errSpecial
		}
		return nil, &os.PathError{Op: "openat", Path: rel, Err: oerr}
	}
	return os.NewFile(uintptr(fd), rel), nil
}
