//go:build linux

package host

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// A command with Request.TTY runs on a new pseudo-terminal this backend
// opens from /dev/ptmx for it alone: the slave is the command's stdin,
// stdout and stderr and the controlling terminal of the new session it
// leads (Setsid, Setctty), so its /dev/tty is that terminal, never the
// caller's (which, without Request.TTY as with it, no command of this
// backend can open: it never shares its caller's session). The backend
// keeps the master: what the terminal shows goes to Request.Stdout,
// Request.Stdin is typed into it, and a resize is TIOCSWINSZ on it, which
// the kernel follows with SIGWINCH to the terminal's foreground process
// group. The terminal lives on the host's devpts (/dev/pts/N), as every
// other terminal of the machine: the host backend isolates nothing, and
// its commands can open other terminals of the same user as any of that
// user's programs can.

// pty is a command's terminal, master side.
type pty struct {
	master *os.File
	slave  *os.File // the command's side; nil once handed over
	copied chan struct{}

	mu     sync.Mutex
	closed bool
}

// openPTY opens a new terminal of size sz. Both ends are close-on-exec;
// the slave reaches the command as its stdio only.
func openPTY(sz *backend.TTY) (*pty, error) {
	if sz.Rows == 0 || sz.Cols == 0 {
		return nil, fmt.Errorf("host: %w: terminal size %dx%d", backend.ErrInvalidRequest, sz.Rows, sz.Cols)
	}
	// os.OpenFile (not a bare descriptor) so that reads and writes go
	// through the runtime's poller and Close interrupts them.
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("host: %w: opening /dev/ptmx: %w", backend.ErrUnavailable, err)
	}
	var n int
	err = ptyIoctl(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlocking the terminal: %w", err)
		}
		var err error
		if n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN); err != nil {
			return fmt.Errorf("terminal number: %w", err)
		}
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: sz.Rows, Col: sz.Cols})
	})
	if err != nil {
		master.Close()
		return nil, fmt.Errorf("host: %w: %w", backend.ErrUnavailable, err)
	}
	// Opened by number through the master's own devpts: O_NOCTTY, as the
	// child takes it as its controlling terminal itself (Setctty).
	slave, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, fmt.Errorf("host: %w: opening the terminal: %w", backend.ErrUnavailable, err)
	}
	return &pty{master: master, slave: slave, copied: make(chan struct{})}, nil
}

// ptyIoctl runs fn on f's descriptor without putting it in blocking mode
// (as File.Fd would).
func ptyIoctl(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// startCopy copies what the terminal shows to out until no one holds the
// slave any more (the master then reads EIO) or the master is closed.
func (t *pty) startCopy(out io.Writer) {
	go func() {
		defer close(t.copied)
		_, _ = backend.ReadOutput(out, t.master)
	}()
}

// dropSlave closes this process's copy of the slave once the child has
// its own, so that the master reads EIO when the command's side is gone.
func (t *pty) dropSlave() {
	if t.slave != nil {
		t.slave.Close()
		t.slave = nil
	}
}

// feed types r into the terminal until r ends or the terminal closes.
// The end of r is not passed on (a terminal has no end of input, only the
// EOF character a program may or may not heed).
func (t *pty) feed(r io.Reader) {
	_, _ = io.Copy(t.master, r)
}

// drain waits, at most wait, until the terminal's output is all copied,
// then closes the master: a process that escaped the command's group and
// still holds the terminal is cut off from it.
func (t *pty) drain(wait time.Duration) {
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-t.copied:
	case <-tm.C:
	}
	t.close()
	<-t.copied
}

func (t *pty) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropSlave()
	if !t.closed {
		t.closed = true
		t.master.Close()
	}
}

// resize sets the terminal's size; the kernel sends SIGWINCH to its
// foreground process group.
func (t *pty) resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return fmt.Errorf("host: %w: terminal size %dx%d", backend.ErrInvalidRequest, rows, cols)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return backend.ErrProcessDone
	}
	err := ptyIoctl(t.master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
	if errors.Is(err, os.ErrClosed) {
		return backend.ErrProcessDone
	}
	if err != nil {
		return fmt.Errorf("host: resize: %w", err)
	}
	return nil
}

// ttyControl is the control of a command on a terminal.
type ttyControl struct {
	*control
	term *pty
}

// Resize implements backend.Resizer.
func (c *ttyControl) Resize(rows, cols uint16) error { return c.term.resize(rows, cols) }

// closeTerm closes the terminal of a command that did not start.
func (x *hostExec) closeTerm() {
	if x.term != nil {
		x.term.close()
	}
}
