package nsinit

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/pty"
)

// A command with Request.TTY runs on a pseudo-terminal the init opens in
// the sandbox's own devpts instance (mounted newinstance in setupDev), so
// the terminal is the sandbox's, never the caller's. The command leads a
// session whose controlling terminal it is; the init copies the master to
// its stdout pipe and its stdin pipe to the master. Resizes come from the
// backend as "resize ROWS COLS" lines on the config pipe, after the
// config (see controlLines).

// TTYConfig is the terminal's size in the request's config.
type TTYConfig struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ptyMaster is the init's master descriptor, -1 without a terminal.
var ptyMaster atomic.Int32

// ptyOut ends once the master's output is all copied to stdout.
var ptyOut sync.WaitGroup

func init() { ptyMaster.Store(-1) }

// relayPTY copies between the master and the init's stdio.
func relayPTY(master int) {
	ptyMaster.Store(int32(master))
	ptyOut.Add(1)
	go func() {
		defer ptyOut.Done()
		pty.CopyOut(os.Stdout, master)
	}()
	go pty.CopyIn(master, os.Stdin)
}

// drainPTY waits, a bounded time, for the terminal's output to be copied
// once everything holding the terminal is dead.
func drainPTY() {
	if ptyMaster.Load() < 0 {
		return
	}
	done := make(chan struct{})
	go func() { ptyOut.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
}

// controlLines reads what the backend sends on the config pipe after the
// config: resize lines for the terminal. Its EOF means the backend's
// process is gone: the sandbox ends (the kernel kills the rest of the
// namespace with the init).
func controlLines(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] != "resize" {
			continue
		}
		rows, err1 := strconv.ParseUint(f[1], 10, 16)
		cols, err2 := strconv.ParseUint(f[2], 10, 16)
		if m := ptyMaster.Load(); m >= 0 && err1 == nil && err2 == nil {
			_ = unix.IoctlSetWinsize(int(m), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
		}
	}
	syscall.Exit(126)
}
