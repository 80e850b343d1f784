// Package pty opens pseudo-terminals inside a sandbox, for the init
// programs that run a command on one (the namespace backend's init and
// the in-box runtime's gVisor step). It links the standard library and
// golang.org/x/sys alone, as those programs must.
package pty

import (
	"fmt"
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
