package backend

import (
	"io"
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

// PollReadable waits up to StreamWait in poll(2) for the pipe fd to have
// bytes (or to be at its end or broken: the read that follows says
// which), and reports whether it does. A command that is streaming
// writes again in moments: waiting for it here costs a syscall, where a
// wait in the netpoller costs several more syscalls and task switches of
// this process's threads at each wake-up. One that has gone quiet is then
// left to the netpoller, which costs nothing while it waits. An
// interrupted wait reports true: the read that follows finds out.
func PollReadable(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(StreamWait.Milliseconds()))
	return err != nil || n > 0
}

// WaitReadable is PollReadable for r, when it is a file (or an
// OutputSource reading one), before a read of it; for any other reader
// it does nothing. The wait holds r's descriptor: r's Close waits for it,
// at most StreamWait.
func WaitReadable(r io.Reader) {
	if s, ok := r.(*OutputSource); ok {
		r = s.R
	}
	sc, ok := r.(syscall.Conn)
	if !ok {
		return
	}
	if rc, err := sc.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { PollReadable(int(fd)) })
	}
}

// Nap sleeps BulkNap, in nanosleep(2) (a Go timer can oversleep by a
// millisecond, longer than a grown pipe takes to fill): a bulk stream's
// command fills its pipe meanwhile, and the next read or splice takes
// that much at once instead of one wake-up of the copy, and of what is
// after it, per write the command makes.
func Nap() {
	ts := unix.NsecToTimespec(BulkNap.Nanoseconds())
	_ = unix.Nanosleep(&ts, nil)
}
