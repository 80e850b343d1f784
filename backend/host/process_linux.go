package host

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

var _ backend.TerminalStarter = (*Backend)(nil)

// StartsTerminals implements backend.TerminalStarter: the backend opens
// a new terminal from /dev/ptmx for the command (tty_linux.go).
func (b *Backend) StartsTerminals() bool {
	return unix.Access("/dev/ptmx", unix.R_OK|unix.W_OK) == nil
}

// Start implements backend.Starter: the command runs exactly as under
// Exec (its own session, cgroup and output caps), and the handle signals
// it through a pidfd, so that a signal can never reach a process that
// reused its pid after it ended.
func (b *Backend) Start(ctx context.Context, req *backend.Request) (backend.Process, error) {
	return backend.Background(ctx, func(ctx context.Context, started func(backend.Control)) (*backend.Result, error) {
		return b.exec(ctx, req, func(pid int, term *pty) {
			c := &control{pidfd: -1}
			if fd, err := unix.PidfdOpen(pid, 0); err == nil {
				c.pidfd = fd
				runtime.AddCleanup(c, func(fd int) { unix.Close(fd) }, fd)
			}
			if term != nil {
				started(&ttyControl{control: c, term: term})
				return
			}
			started(c)
		})
	})
}

// control acts on a command the host backend started. Its pidfd is
// closed when the control is collected, never while a Signal may use it.
type control struct{ pidfd int }

// Signal implements backend.Control.
func (c *control) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("%w: signal %v", backend.ErrUnsupported, sig)
	}
	if c.pidfd < 0 {
		return fmt.Errorf("%w: no pidfd for the command (kernel older than 5.3)", backend.ErrUnsupported)
	}
	if err := unix.PidfdSendSignal(c.pidfd, s, nil, 0); err != nil {
		if err == unix.ESRCH {
			return backend.ErrProcessDone
		}
		return fmt.Errorf("host: signal: %w", err)
	}
	return nil
}

// DialPort implements backend.PortDialer: the command shares the host's
// network, so its loopback is this one.
func (c *control) DialPort(ctx context.Context, port int) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}
