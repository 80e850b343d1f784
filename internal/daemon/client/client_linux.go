package client

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Client errors. Every one but ErrLost means the command did not run: the
// caller runs it itself.
var (
	// ErrNotRunning: no daemon listens for the name; Start starts one.
	ErrNotRunning = errors.New("daemon: not running")
	// ErrUnavailable: the daemon could not be asked (a socket path too
	// long, a request too large, a daemon that did not answer).
	ErrUnavailable = errors.New("daemon: unavailable")
	// ErrRefused: the daemon refused the request.
	ErrRefused = errors.New("daemon: refused")
	// ErrLost: the daemon accepted the request and ended before it said
	// how the command ended. The command may have run in part.
	ErrLost = errors.New("the pulse daemon that ran the command ended before the command did")
)

// ReplyWait bounds how long a client waits for a daemon to accept its
// request: longer, and it runs the command itself.
const ReplyWait = 5 * time.Second

// Run hands req (an OpRun) to the daemon name in dir, with stdio as the
// command's stdin, stdout and stderr, and waits for its exit code. Each
// signal from signals is forwarded to the command; on the first, the
// code returned is 128+N, as a shell reports a command a signal ended; a
// second one returns at once (the caller then exits, which cancels the
// command in the daemon).
func Run(dir, name string, req *Request, stdio [3]*os.File, signals <-chan os.Signal) (int, error) {
	return RunFor("/proc/self/exe", dir, name, req, stdio, signals)
}

// RunFor is Run from a client that is not the daemon's executable exe
// (a front end that only hands commands over).
//
// The client is all of a front end's work, so it is kept to what the
// exchange needs (doc.go): blocking system calls on the socket, the
// request written by appendRequest, and the exit read in the calling
// goroutine; only the forwarding of signals has a goroutine of its own,
// started once the daemon has accepted.
func RunFor(exe, dir, name string, req *Request, stdio [3]*os.File, signals <-chan os.Signal) (int, error) {
	c, pid, err := Dial(exe, dir, name)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	req.V, req.Op = Version, OpRun
	data := appendRequest(make([]byte, 0, 4096), req)
	if len(data) > MaxMessage {
		return 0, fmt.Errorf("%w: request of %d bytes", ErrUnavailable, len(data))
	}
	fds := make([]int, 3)
	for i, f := range stdio {
		if f == nil {
			return 0, fmt.Errorf("%w: descriptor %d missing", ErrUnavailable, i)
		}
		fds[i] = int(f.Fd())
	}
	if err := c.SetTimeout(ReplyWait); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := c.Send(data, unix.UnixRights(fds...)); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	rep, err := c.readReply()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !rep.Accepted {
		return 0, fmt.Errorf("%w: %s", ErrRefused, rep.Refused)
	}
	if err := c.SetTimeout(0); err != nil {
		return 0, fmt.Errorf("%w (pid %d): %w", ErrLost, pid, err)
	}
	// got is the first signal forwarded; twice is set by a second one,
	// which also shuts the socket's reading side, so that the read
	// below returns at once.
	var got atomic.Int32
	var twice atomic.Bool
	if signals != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case s := <-signals:
					n := int32(s.(syscall.Signal))
					if got.Load() != 0 {
						twice.Store(true)
						c.shutRead()
						return
					}
					got.Store(n)
					_ = c.Send(fmt.Appendf(nil, `{"signal":%d}`, n), nil)
				case <-done:
					return
				}
			}
		}()
	}
	r, err := c.readReply()
	n := int(got.Load())
	switch {
	case twice.Load():
		return 128 + n, nil
	case err != nil && n != 0:
		return 128 + n, fmt.Errorf("%w (pid %d): %w", ErrLost, pid, err)
	case err != nil:
		return 0, fmt.Errorf("%w (pid %d): %w", ErrLost, pid, err)
	case r.Exit == nil:
		return 0, fmt.Errorf("%w (pid %d): it sent no exit code", ErrLost, pid)
	case n != 0:
		return 128 + n, nil
	}
	return *r.Exit, nil
}

// Conn is a client's connection to a daemon: the socket's descriptor,
// used with blocking system calls.
type Conn struct {
	fd     int
	mu     sync.Mutex // between Close and shutRead: the number is not reused under it
	closed bool
}

// Close closes the connection; a second Close does nothing.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return unix.Close(c.fd)
}

// shutRead ends the reading side: a read under way returns io.EOF.
func (c *Conn) shutRead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		_ = unix.Shutdown(c.fd, unix.SHUT_RD)
	}
}

// SetTimeout bounds each later send and read (0: no bound); one that
// runs out fails with EAGAIN.
func (c *Conn) SetTimeout(d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return err
	}
	return unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
}

// Send writes one message, with oob's descriptors.
func (c *Conn) Send(data, oob []byte) error {
	for {
		err := unix.Sendmsg(c.fd, data, oob, nil, 0)
		if err != unix.EINTR {
			return err
		}
	}
}

// Read reads one message into buf; io.EOF when the daemon closed the
// connection (or a second signal shut it).
func (c *Conn) Read(buf []byte) (int, error) {
	for {
		n, _, _, _, err := unix.Recvmsg(c.fd, buf, nil, 0)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// readReply reads and decodes one reply. A daemon's reply is a few
// dozen bytes; a larger one is cut and fails to decode.
func (c *Conn) readReply() (Reply, error) {
	var buf [4096]byte
	n, err := c.Read(buf[:])
	if err != nil {
		return Reply{}, err
	}
	return parseReply(buf[:n])
}

// Dial connects to the daemon name in dir and checks it is this user's,
// running the executable exe; it returns the daemon's pid.
func Dial(exe, dir, name string) (*Conn, int, error) {
	if name == "" {
		return nil, 0, fmt.Errorf("%w: no name", ErrUnavailable)
	}
	if err := CheckDir(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, 0, ErrNotRunning
		}
		return nil, 0, err
	}
	sock := SocketPath(dir, name)
	if sock == "" {
		return nil, 0, fmt.Errorf("%w: socket path too long", ErrUnavailable)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	c := &Conn{fd: fd}
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: sock})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		c.Close()
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
			return nil, 0, ErrNotRunning
		}
		return nil, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	pid, err := CheckPeer(fd, exe)
	if err != nil {
		c.Close()
		return nil, 0, err
	}
	return c, pid, nil
}
