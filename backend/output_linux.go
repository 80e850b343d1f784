package backend

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// GrowPipe raises the buffer of f (either end), when it is a pipe, to
// OutputChunk. Failing is harmless (the size stays the default 64 KiB): a
// user over the kernel's pipe-user-pages-soft allowance cannot grow pipes.
func GrowPipe(f any) { growPipe(f, OutputChunk) }

// GrowBulk raises the buffer of f, when it is a pipe (or an OutputSource
// reading one), to BulkPipe, best effort as GrowPipe: for a stream that
// has passed BulkAfter bytes. It reports whether f is now a pipe of at
// least that size.
func GrowBulk(f any) bool {
	if s, ok := f.(*OutputSource); ok {
		f = s.R
	}
	return growPipe(f, BulkPipe)
}

// growPipe grows f, when it is a pipe, to size, and reports whether it
// now holds at least that much.
func growPipe(f any, size int) bool {
	sc, ok := f.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	grown := false
	_ = rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return
		}
		n, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0)
		if err == nil && n < size {
			n, err = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size)
		}
		grown = err == nil && n >= size
	})
	return grown
}
