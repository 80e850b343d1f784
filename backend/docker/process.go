package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/pulse-agent/pulse/backend"
)

var _ backend.TerminalStarter = (*Backend)(nil)

// Start implements backend.Starter: the command runs exactly as under
// Exec, in the sandbox's container, and the handle reaches it through
// execs of its own (a signal, a relay to a port, a terminal's resize).
func (b *Backend) Start(ctx context.Context, req *backend.Request) (backend.Process, error) {
	return backend.Background(ctx, func(ctx context.Context, started func(backend.Control)) (*backend.Result, error) {
		return b.exec(ctx, req, func(containerID, id string) {
			c := &control{b: b, container: containerID, id: id}
			if req.TTY != nil {
				run, _ := ttyRuns.Load(id)
				r, _ := run.(*ttyRun)
				started(&ttyControl{control: c, run: r})
				return
			}
			started(c)
		})
	})
}

// StartsTerminals implements backend.TerminalStarter: the engine makes
// the terminal in the container (tty.go).
func (b *Backend) StartsTerminals() bool { return true }

// ttyControl is the control of a command on a terminal.
type ttyControl struct {
	*control
	run *ttyRun // nil when the command was over before Start returned
}

// Resize implements backend.Resizer.
func (c *ttyControl) Resize(rows, cols uint16) error {
	if c.run == nil {
		return backend.ErrProcessDone
	}
	return c.run.resize(rows, cols)
}

// control acts on one command of a container.
type control struct {
	b         *Backend
	container string
	id        string
}

// Signal implements backend.Control.
func (c *control) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("%w: signal %v", backend.ErrUnsupported, sig)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	code, err := c.b.runCmd(ctx, c.container, runtimePath, "signal", c.id, strconv.Itoa(int(s)))
	if err != nil {
		return fmt.Errorf("docker: signal: %w", err)
	}
	if code != 0 {
		return backend.ErrProcessDone
	}
	return nil
}

// runCmd runs cmd as root in the container and returns its exit code.
func (b *Backend) runCmd(ctx context.Context, containerID string, cmd ...string) (int, error) {
	ec, err := b.cli.ContainerExecCreate(ctx, containerID, container.ExecOptions{
		User:         wrapperUser,
		Env:          b.scriptEnv(),
		AttachStdout: true,
		AttachStderr: true,
		Cmd:          cmd,
	})
	if err != nil {
		return 0, err
	}
	hj, err := b.cli.ContainerExecAttach(ctx, ec.ID, container.ExecAttachOptions{})
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, hj.Reader)
	hj.Close()
	return b.execExit(ctx, ec.ID, 0, 5*time.Millisecond)
}

// errExecRunning: execExit asked as many times as it was allowed and the
// exec was still running.
var errExecRunning = errors.New("exec did not end")

// execExit waits for the exec id, whose output stream has ended, to be
// reported ended by the engine (the two are not one event), asking every
// interval, at most tries times (tries <= 0: until ctx is done), and
// returns its exit code.
func (b *Backend) execExit(ctx context.Context, id string, tries int, every time.Duration) (int, error) {
	for n := 0; tries <= 0 || n < tries; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(every):
			}
		}
		insp, err := b.cli.ContainerExecInspect(ctx, id)
		if err != nil {
			return 0, err
		}
		if !insp.Running {
			return insp.ExitCode, nil
		}
	}
	return 0, errExecRunning
}

// relayUser runs the relay to a port: nobody, with no capability; it
// needs only to connect to the container's loopback.
const relayUser = "65534:65534"

// DialPort implements backend.PortDialer: an exec of `nc 127.0.0.1 PORT`
// in the container carries the connection, its stdin and stdout the two
// directions. It works whatever the container's network (none included),
// since the exec shares the container's own loopback.
func (c *control) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: port %d", backend.ErrInvalidRequest, port)
	}
	ec, err := c.b.cli.ContainerExecCreate(ctx, c.container, container.ExecOptions{
		User:         relayUser,
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		Cmd:          []string{"nc", "127.0.0.1", strconv.Itoa(port)},
	})
	if err != nil {
		return nil, fmt.Errorf("docker: relay to port %d: %v: %w", port, err, backend.ErrUnavailable)
	}
	hj, err := c.b.cli.ContainerExecAttach(ctx, ec.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, fmt.Errorf("docker: relay to port %d: %v: %w", port, err, backend.ErrUnavailable)
	}
	pr, pw := io.Pipe()
	go func() {
		// The exec's stdout is the port's bytes; its stderr (nc's
		// complaints) is dropped.
		_, err := stdcopy.StdCopy(pw, io.Discard, hj.Reader)
		pw.CloseWithError(err)
	}()
	return &relayConn{Conn: hj.Conn, r: pr, closeWrite: hj.CloseWrite, closeAll: hj.Close}, nil
}

// relayConn is a connection carried by an exec's attached stream: reads
// come demultiplexed from its stdout, writes go to its stdin.
type relayConn struct {
	net.Conn
	r          *io.PipeReader
	closeWrite func() error
	closeAll   func()
}

func (c *relayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite ends the exec's stdin: nc sends a FIN on.
func (c *relayConn) CloseWrite() error { return c.closeWrite() }

func (c *relayConn) Close() error {
	c.r.Close()
	c.closeAll()
	return nil
}
