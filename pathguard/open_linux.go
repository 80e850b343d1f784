//go:build linux

package pathguard

import (
	"errors"
	"os"
	"path"
	"sync/atomic"
	"syscall"
	"unsafe"
)

const openFlags = syscall.O_RDONLY | syscall.O_NOFOLLOW | syscall.O_NONBLOCK | syscall.O_CLOEXEC | syscall.O_NOCTTY

// openNoFollow opens rel, already resolved and free of symlinks, under the
// directory base for reading. O_NOFOLLOW refuses a symlink swapped in at
// the last element, which os.Root alone would follow, and O_NONBLOCK makes
// opening a FIFO return at once.
//
// With openat2(2) (Linux 5.6+) one call opens the whole path beneath base
// and refuses any symlink that appeared in it since Resolve ran. Where
// openat2 is missing or filtered, the parent directory is opened through an
// os.Root, so no intermediate element can lead out of base either.
func openNoFollow(base, rel string) (*os.File, error) {
	if rel == "." {
		return nil, errIsRoot
	}
	if openat2State.Load() != openat2Missing {
		f, err := openat2(base, rel, resolveBeneath|resolveNoSymlinks|resolveNoMagiclinks)
		if !errors.Is(err, errNoOpenat2) {
			return f, err
		}
		openat2State.Store(openat2Missing)
	}
	return openViaRoot(base, rel)
}

const (
	openat2Unknown int32 = iota
	openat2Missing
)

var openat2State atomic.Int32

var errNoOpenat2 = errors.New("openat2 unavailable")

// sysOpenat2 is the same on every Linux architecture (it postdates the
// unified syscall numbering).
const sysOpenat2 = 437

// Resolve flags of openat2(2), from linux/openat2.h.
const (
	resolveNoMagiclinks = 0x02
	resolveNoSymlinks   = 0x04
	resolveBeneath      = 0x08
)

type openHow struct {
	flags   uint64
	mode    uint64
	resolve uint64
}

// openBeneath opens rel under base in one openat2(2) call that follows
// symlinks only while they stay beneath base (absolute ones never) and
// never at the last element. It is the fast path of Open: any error sends
// the caller to the careful path, which decides.
func openBeneath(base, rel string) (*os.File, error) {
	if openat2State.Load() == openat2Missing {
		return nil, errNoOpenat2
	}
	f, err := openat2(base, rel, resolveBeneath|resolveNoMagiclinks)
	if errors.Is(err, errNoOpenat2) {
		openat2State.Store(openat2Missing)
	}
	return f, err
}

func openat2(base, rel string, resolve uint64) (*os.File, error) {
	dfd, err := syscall.Open(base, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: ".", Err: err}
	}
	defer syscall.Close(dfd)
	p, err := syscall.BytePtrFromString(rel)
	if err != nil {
		return nil, err
	}
	how := openHow{flags: openFlags, resolve: resolve}
	var fd uintptr
	var errno syscall.Errno
	for {
		fd, _, errno = syscall.Syscall6(sysOpenat2, uintptr(dfd), uintptr(unsafe.Pointer(p)),
			uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
		if errno != syscall.EINTR && errno != syscall.EAGAIN {
			break
		}
	}
	switch errno {
	case 0:
		return os.NewFile(fd, rel), nil
	case syscall.ENOSYS, syscall.EPERM:
		// Old kernel, or a seccomp filter that refuses the call: EPERM
		// cannot come from opening a path we may read with these flags
		// (O_NOATIME is not set), so it means the call itself is refused.
		return nil, errNoOpenat2
	case syscall.ELOOP:
		return nil, errSymlink
	case syscall.EXDEV:
		return nil, errEscape
	case syscall.ENXIO, syscall.ENODEV, syscall.EOPNOTSUPP:
		return nil, errSpecial
	}
	return nil, &os.PathError{Op: "openat2", Path: rel, Err: errno}
}

func openViaRoot(base, rel string) (*os.File, error) {
	r, err := os.OpenRoot(base)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	dir, err := r.OpenFile(path.Dir(rel), os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, errSymlink
		}
		if isEscape(err) {
			return nil, errEscape
		}
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
			fd, oerr = syscall.Openat(int(dfd), name, openFlags, 0)
			if oerr != syscall.EINTR {
				return
			}
		}
	})
	if cerr != nil {
		return nil, cerr
	}
	switch oerr {
	case nil:
		return os.NewFile(uintptr(fd), rel), nil
	case syscall.ELOOP:
		return nil, errSymlink
	case syscall.ENXIO, syscall.ENODEV, syscall.EOPNOTSUPP:
		return nil, errSpecial
	}
	return nil, &os.PathError{Op: "openat", Path: rel, Err: oerr}
}

// isEscape recognises os.Root's refusal of a path that leads out of it; the
// os package does not export that error.
func isEscape(err error) bool {
	var pe *os.PathError
	return errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent"
}
