package backend

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// GrowPipe raises the buffer of f (either end), when it is a pipe, to
// OutputChunk. Failing is harmless (the size stays the default 64 KiB): a
// user over the kernel's pipe-user-pages-soft allowance cannot grow pipes.
func GrowPipe(f any) {
	sc, ok := f.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return
		}
		if n, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0); err == nil && n < OutputChunk {
			_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, OutputChunk)
		}
	})
}
