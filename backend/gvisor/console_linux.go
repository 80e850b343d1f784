package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// A cold command on a terminal: runsc run makes the pseudo-terminal on
// the host (--console-socket), gives the sandbox its replica and sends
// the master here over a Unix socket; gVisor's kernel serves the
// command's terminal from the replica, so a size set on the master is
// what the command reads and reaches it as SIGWINCH.

// console is the socket a cold sandbox's runsc sends its terminal's
// master to, and then that master.
type console struct {
	dir string // a directory of this uid alone, holding the socket
	ln  *net.UnixListener

	master *os.File      // set once got is closed (nil: none came)
	got    chan struct{} // closed once the master came or never will
	out    chan struct{} // closed once the master's output is all copied
	mu     sync.Mutex
	ended  bool
	once   sync.Once
}

// listenConsole makes the socket. Its directory is a new one under the
// temporary directory (a Unix socket's path has room for about 100
// bytes, which a state dir may not leave), closed to everyone else, so
// that only this uid can hand a master in.
func listenConsole() (*console, error) {
	dir, err := os.MkdirTemp("", "pulse-console-")
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unix"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &console{dir: dir, ln: ln, got: make(chan struct{}), out: make(chan struct{})}, nil
}

// path is the socket's path, for runsc's --console-socket.
func (c *console) path() string { return filepath.Join(c.dir, "s") }

// serve takes the master runsc sends, sets the terminal's size, and
// copies its output to w and in to it until the terminal is closed; it
// ends at once if runsc ends (exited) or ctx does before it sent one.
func (c *console) serve(ctx context.Context, exited <-chan struct{}, rows, cols uint16, w io.Writer, in io.Reader) {
	type got struct {
		f   *os.File
		err error
	}
	ch := make(chan got, 1)
	go func() {
		f, err := c.accept()
		ch <- got{f, err}
	}()
	var g got
	select {
	case g = <-ch:
	case <-exited:
	case <-ctx.Done():
	}
	c.ln.Close() // ends the accept if it still waits
	if g.f == nil {
		if g.err == nil {
			if r := <-ch; r.f != nil {
				r.f.Close()
			}
		}
		close(c.got)
		close(c.out)
		return
	}
	c.mu.Lock()
	c.master = g.f
	c.mu.Unlock()
	// Before the command starts, as a rule: runsc sends the master
	// before it starts the sandbox that runs it.
	_ = c.resize(rows, cols)
	close(c.got)
	go func() {
		defer close(c.out)
		copyOut(w, g.f)
	}()
	if in != nil {
		go func() { _, _ = io.Copy(g.f, in) }()
	}
}

// accept takes one connection and the one descriptor it carries, which
// must be a terminal's master.
func (c *console) accept() (*os.File, error) {
	// runsc sends the master before it starts the sandbox; a runsc
	// that sends nothing for this long is not waited for.
	_ = c.ln.SetDeadline(time.Now().Add(time.Minute))
	conn, err := c.ln.AcceptUnix()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := conn.ReadMsgUnix(make([]byte, 64), oob)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("console socket: no descriptor (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("console socket: want one descriptor (%v)", err)
	}
	// A master answers TIOCGPTN; anything else is not what runsc sends.
	if _, err := unix.IoctlGetInt(fds[0], unix.TIOCGPTN); err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("console socket: not a terminal's master: %w", err)
	}
	unix.CloseOnExec(fds[0])
	// Non-blocking, so that os's poller serves it and Close ends a read
	// that waits.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	return os.NewFile(uintptr(fds[0]), "console"), nil
}

// copyOut copies the master's output to w until no process holds the
// terminal any more (EIO), the master is closed, or w fails.
func copyOut(w io.Writer, f *os.File) {
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// resize sets the terminal's size; the command gets SIGWINCH.
func (c *console) resize(rows, cols uint16) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.master == nil || c.ended {
		return backend.ErrProcessDone
	}
	rc, err := c.master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ierr
}

// close waits, a bounded time, for the output of a sandbox that ended to
// be copied, then closes the master and removes the socket.
func (c *console) close() { c.once.Do(c.end) }

func (c *console) end() {
	<-c.got
	select {
	case <-c.out:
	case <-time.After(2 * time.Second):
	}
	c.mu.Lock()
	c.ended = true
	if c.master != nil {
		c.master.Close()
	}
	c.mu.Unlock()
	<-c.out
	c.ln.Close()
	os.RemoveAll(c.dir)
}

// ttyControl is the control of a cold command on a terminal: signals as
// any cold command's, resizes on the master.
type ttyControl struct {
	*control
	c *console
}

// resizeCheck is what a terminal's Resize refuses, warm or cold, before
// it acts: a size of no rows or columns, a command that ended.
func resizeCheck(rows, cols uint16, ended <-chan struct{}) error {
	if rows == 0 || cols == 0 {
		return fmt.Errorf("gvisor: %w: terminal size %dx%d", backend.ErrInvalidRequest, rows, cols)
	}
	select {
	case <-ended:
		return backend.ErrProcessDone
	default:
		return nil
	}
}

// Resize implements backend.Resizer.
func (t *ttyControl) Resize(rows, cols uint16) error {
	if err := resizeCheck(rows, cols, t.exited); err != nil {
		return err
	}
	if err := t.c.resize(rows, cols); err != nil {
		if errors.Is(err, backend.ErrProcessDone) {
			return err
		}
		return fmt.Errorf("gvisor: resize: %w", err)
	}
	return nil
}
