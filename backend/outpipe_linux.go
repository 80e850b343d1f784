package backend

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// OutputPipe is the read end of a pipe that carries a command's output,
// kept out of the Go runtime's netpoller while bytes flow.
//
// A pipe end in the netpoller (as os.Pipe makes it) is in an epoll set,
// and the kernel then wakes that set's waiter at every write into the
// pipe, however much it already holds (pipe_write wakes its readers on
// each write once the pipe was ever polled; epoll's edge trigger makes
// each one an event). The waiter is a thread of this process, idle in
// epoll_wait while the copy is busy elsewhere: for a command streaming
// in head's 8 KiB writes, 32,768 cross-CPU wake-ups of a thread with
// nothing to do for 256 MiB. Here the copy waits for the command's
// writes in poll(2) (PollReadable) and naps (Nap), where only a waiting
// poll is woken; once the stream has been quiet for a read that found
// nothing, the wait parks in the netpoller on a duplicate of the
// descriptor, removed from it again as soon as bytes come, so that a
// quiet command costs no wake-ups either.
//
// It is an io.Reader (blocking, as a file's Read is) and a syscall.Conn
// whose RawConn.Read waits that way, so that the output copies
// (ReadOutput, PassOutput and the splice behind it) use it as they use
// an *os.File. Close may come from another goroutine at any time: the
// descriptor is closed once no call uses it any more, and a parked wait
// ends at once.
type OutputPipe struct {
	name string

	mu      sync.Mutex
	fd      int
	refs    int      // calls using fd now
	closing bool     // Close was called: no new use, fd closed at refs 0
	parked  *os.File // the duplicate a wait is parked on, if any
}

// NewOutputPipe makes a pipe whose read end is an OutputPipe and whose
// write end (for the command) an ordinary *os.File in blocking mode, as
// a child's stdout is.
func NewOutputPipe(name string) (*OutputPipe, *os.File, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	// Non-blocking on the read end only: its own file description, not
	// the command's.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	return &OutputPipe{name: name, fd: fds[0]}, os.NewFile(uintptr(fds[1]), name), nil
}

// OutputPipeFrom takes over fd, the read end of a pipe (one received from
// another process, say), as an OutputPipe: it becomes non-blocking, and
// the OutputPipe closes it.
func OutputPipeFrom(fd int, name string) (*OutputPipe, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, os.NewSyscallError("fcntl", err)
	}
	return &OutputPipe{name: name, fd: fd}, nil
}

// errNotReadable: Write of a read end's RawConn.
var errNotReadable = errors.New("backend: output pipe: read end")

// Fd is the descriptor, or -1 once closed. As with os.File.Fd, it is
// valid only while the pipe is not closed.
func (p *OutputPipe) Fd() uintptr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return ^uintptr(0)
	}
	return uintptr(p.fd)
}

// use takes a reference on the descriptor, or reports it closed.
func (p *OutputPipe) use() (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return -1, false
	}
	p.refs++
	return p.fd, true
}

func (p *OutputPipe) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refs--
	if p.refs == 0 && p.closing && p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
}

func (p *OutputPipe) closedErr(op string) error {
	return &os.PathError{Op: op, Path: p.name, Err: os.ErrClosed}
}

// Read reads what the pipe holds, waiting for the command's next write
// when it holds nothing; io.EOF once every write end is closed.
func (p *OutputPipe) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		fd, ok := p.use()
		if !ok {
			return 0, p.closedErr("read")
		}
		n, err := ignoringEINTR(func() (int, error) { return unix.Read(fd, b) })
		p.done()
		switch {
		case err == nil && n > 0:
			return n, nil
		case err == nil:
			return 0, io.EOF
		case !errors.Is(err, unix.EAGAIN):
			return 0, &os.PathError{Op: "read", Path: p.name, Err: err}
		}
		if err := p.park(); err != nil {
			return 0, err
		}
	}
}

func ignoringEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// park waits in the netpoller until the pipe is readable (bytes, or every
// writer gone), on a duplicate of the descriptor registered for this
// wait only.
func (p *OutputPipe) park() error {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return p.closedErr("read")
	}
	dup, err := unix.FcntlInt(uintptr(p.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		p.mu.Unlock()
		return &os.PathError{Op: "dup", Path: p.name, Err: err}
	}
	// Non-blocking (the shared file description is): NewFile puts it in
	// the netpoller.
	f := os.NewFile(uintptr(dup), p.name)
	p.parked = f
	p.mu.Unlock()

	rc, err := f.SyscallConn()
	if err == nil {
		err = rc.Read(func(fd uintptr) bool { return readable(int(fd)) })
	}
	p.mu.Lock()
	p.parked = nil
	closing := p.closing
	p.mu.Unlock()
	// Its Close takes it out of the epoll set again.
	f.Close()
	if closing {
		return p.closedErr("read")
	}
	if err != nil {
		return &os.PathError{Op: "wait", Path: p.name, Err: err}
	}
	return nil
}

// readable reports whether a read of the pipe fd would not find it empty
// (bytes, or its end), without waiting.
func readable(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err != nil || n > 0
}

// Close closes the pipe: at once when no call uses it, else when the last
// one returns; a parked wait ends now. Later calls fail with
// os.ErrClosed.
func (p *OutputPipe) Close() error {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return p.closedErr("close")
	}
	p.closing = true
	parked := p.parked
	if p.refs == 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
	p.mu.Unlock()
	if parked != nil {
		// Ends the wait in the netpoller; park closes it again.
		parked.Close()
	}
	return nil
}

// SyscallConn gives access to the descriptor as an *os.File's does: the
// descriptor is not closed while a call of its is running, and Read's
// wait for readability is OutputPipe's.
func (p *OutputPipe) SyscallConn() (syscall.RawConn, error) { return rawOutputPipe{p}, nil }

type rawOutputPipe struct{ p *OutputPipe }

func (r rawOutputPipe) Control(f func(fd uintptr)) error {
	fd, ok := r.p.use()
	if !ok {
		return r.p.closedErr("control")
	}
	defer r.p.done()
	f(uintptr(fd))
	return nil
}

// Read calls f until it returns true, waiting for the pipe to be readable
// after each false, as os.File's RawConn.Read waits in the netpoller.
func (r rawOutputPipe) Read(f func(fd uintptr) bool) error {
	for {
		fd, ok := r.p.use()
		if !ok {
			return r.p.closedErr("read")
		}
		ok = f(uintptr(fd))
		r.p.done()
		if ok {
			return nil
		}
		if err := r.p.park(); err != nil {
			return err
		}
	}
}

func (r rawOutputPipe) Write(func(fd uintptr) bool) error { return errNotReadable }
