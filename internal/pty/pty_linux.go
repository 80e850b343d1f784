// Package pty opens pseudo-terminals inside a sandbox, for the init
// programs that run a command on one (the namespace backend's init and
// the in-box runtime's gVisor step). It links the standard library and
// golang.org/x/sys alone, as those programs must.
package pty

import (
	"fmt"
	"io"
	"strconv"

	"golang.org/x/sys/unix"
)

// Open opens a new terminal of the devpts instance mounted at /dev/pts
// (the sandbox's own, never the host's) at size rows×cols and returns
// the master and the slave, both close-on-exec.
func Open(rows, cols uint16) (master, slave int, err error) {
	master, err = unix.Open("/dev/pts/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("opening /dev/pts/ptmx: %w", err)
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(master)
		return -1, -1, fmt.Errorf("unlocking the terminal: %w", err)
	}
	n, err := unix.IoctlGetInt(master, unix.TIOCGPTN)
	if err != nil {
		unix.Close(master)
		return -1, -1, fmt.Errorf("terminal number: %w", err)
	}
	slave, err = unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(master)
		return -1, -1, fmt.Errorf("opening the terminal: %w", err)
	}
	_ = unix.IoctlSetWinsize(master, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	return master, slave, nil
}

// CopyOut copies what the terminal's master prints to w until no
// process holds the terminal any more (EIO) or w fails.
func CopyOut(w io.Writer, master int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Read(master, buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return // EIO: no process holds the terminal any more
		}
	}
}

// CopyIn copies r to the terminal's master until r ends or the master
// fails.
func CopyIn(master int, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		for p := buf[:n]; len(p) > 0; {
			w, werr := unix.Write(master, p)
			if werr == unix.EINTR {
				continue
			}
			if werr != nil {
				return
			}
			p = p[w:]
		}
		if err != nil {
			return
		}
	}
}
