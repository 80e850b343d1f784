//go:build linux

package pathguard

import (
	"errors"
	"os"
	"path"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const openFlags = syscall.O_RDONLY | syscall.O_NOFOLLOW | syscall.O_NONBLOCK | syscall.O_CLOEXEC | syscall.O_NOCTTY

// openNoFollow opens rel, already resolved and free of symlinks, under the
// directory base for reading. O_NOFOLLOW refuses a symlink swapped in at
// the last element, which os.Root alone would follow, and O_NONBLOCK makes
// opening a FIFO return at once.
//
// With openat2(2) (Linux 5.6+) one call opens the whole path beneath base
// and refuses any symlink that appeared in it since Resolve ran. Where
// openat2 is missing or filtered, the path is walked an element at a time
// with O_NOFOLLOW (openWalk), which refuses the same symlinks.
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
	return openWalk(base, rel)
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

// openWalk opens rel under base one element at a time, so that, as with
// openat2's RESOLVE_NO_SYMLINKS, a symlink anywhere in the path is refused
// rather than followed and nothing can lead out of base. Each directory
// is opened with O_PATH|O_NOFOLLOW, which opens a symlink itself instead
// of following it, and its type is read from that descriptor: a swap
// after the open cannot change what the descriptor is. A ".." or an
// absolute rel cannot come from Resolve and is refused as an escape.
func openWalk(base, rel string) (*os.File, error) {
	if path.IsAbs(rel) {
		return nil, errEscape
	}
	dfd, err := openatRetry(unix.AT_FDCWD, base, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: ".", Err: err}
	}
	defer func() { syscall.Close(dfd) }()
	elems := strings.Split(rel, "/")
	for i, el := range elems {
		switch {
		case el == "..":
			return nil, errEscape
		case el == "" || el == ".":
			continue
		case i == len(elems)-1:
			fd, err := openatRetry(dfd, el, openFlags)
			switch err {
			case nil:
				return os.NewFile(uintptr(fd), rel), nil
			case syscall.ELOOP:
				return nil, errSymlink
			case syscall.ENXIO, syscall.ENODEV, syscall.EOPNOTSUPP:
				return nil, errSpecial
			}
			return nil, &os.PathError{Op: "openat", Path: rel, Err: err}
		}
		next, err := openatRetry(dfd, el, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC)
		if err != nil {
			return nil, &os.PathError{Op: "openat", Path: strings.Join(elems[:i+1], "/"), Err: err}
		}
		syscall.Close(dfd)
		dfd = next
		var st syscall.Stat_t
		if err := syscall.Fstat(dfd, &st); err != nil {
			return nil, &os.PathError{Op: "fstat", Path: strings.Join(elems[:i+1], "/"), Err: err}
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
		case syscall.S_IFLNK:
			return nil, errSymlink
		default:
			return nil, &os.PathError{Op: "openat", Path: strings.Join(elems[:i+1], "/"), Err: syscall.ENOTDIR}
		}
	}
	return nil, errIsRoot
}

func openatRetry(dfd int, name string, flags int) (int, error) {
	for {
		fd, err := syscall.Openat(dfd, name, flags, 0)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}
