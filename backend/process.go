package backend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
)

// ErrProcessDone: the process has already ended, so it cannot be
// signalled, resized or dialled any more.
var ErrProcessDone = errors.New("process already ended")

// Starter is an optional interface of a Backend: it starts a request in
// the background and hands back a handle to the running command. Start
// then Wait is the same command as Exec — the same view of the workspace,
// the same limits and policies, the same Result and Overlay — only the
// caller gets control back as soon as the command runs. A backend without
// it runs commands with Exec alone, and the facade refuses a background
// process on it (ErrUnsupported).
type Starter interface {
	// Start returns once the command runs, or with the error Exec would
	// have returned when nothing could be started. ctx bounds the whole
	// command as Exec's does: its end kills it (Termination Cancelled).
	Start(ctx context.Context, req *Request) (Process, error)
}

// Process is a command started by a Starter. Its methods are safe for
// concurrent use.
type Process interface {
	// Wait waits for the command to end and returns what Exec would have
	// returned. Every call returns the same.
	Wait() (*Result, error)
	// Signal sends sig to the command's main process. It returns
	// ErrProcessDone once the command has ended, and an error wrapping
	// ErrUnsupported where the backend cannot deliver signals.
	Signal(sig os.Signal) error
	// Kill ends the command and everything it started, and returns once
	// none of it runs any more; Wait then reports Termination Cancelled.
	// Kill is idempotent, and returns nil after the end.
	Kill() error
	// DialPort connects to a TCP port that the command (or a process it
	// started) listens on at the loopback address of its own network —
	// for the facade's Expose. It returns an error wrapping ErrUnsupported
	// where the backend cannot reach into the sandbox's network.
	DialPort(ctx context.Context, port int) (net.Conn, error)
	// Resize sets the size of the command's terminal (Request.TTY); the
	// command gets SIGWINCH. It returns an error wrapping ErrUnsupported
	// for a command without one.
	Resize(rows, cols uint16) error
}

// TTY is the size of a pseudo-terminal (Request.TTY).
type TTY struct {
	Rows, Cols uint16
}

// TerminalStarter is a Starter that honours Request.TTY: the command
// runs on a pseudo-terminal the backend makes inside the sandbox, and
// its Process can Resize it.
type TerminalStarter interface {
	Starter
	// StartsTerminals reports whether Request.TTY is honoured here (a
	// backend may depend on what the machine offers).
	StartsTerminals() bool
}

// Resizer is a Control whose command runs on a terminal.
type Resizer interface {
	Resize(rows, cols uint16) error
}

// Control is what a backend can do to a command while it runs; a backend
// hands one to Background's started callback. Dialling and resizing are
// optional abilities, found with a type assertion (PortDialer, Resizer).
type Control interface {
	Signal(sig os.Signal) error
}

// PortDialer is a Control that can connect to a port inside the
// command's network.
type PortDialer interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// RunFunc runs one request to its end, as Exec does, and calls started
// once (before it returns) when the command runs; a RunFunc that returns
// without calling it started nothing and must return an error.
type RunFunc func(ctx context.Context, started func(Control)) (*Result, error)

// Background is the shared half of Start for backends whose Exec can say
// when the command runs: it calls run in a goroutine and returns when run
// reports the start, or with run's error when it ends first. Kill ends
// the command by cancelling run's context, so it relies on Exec's promise
// that nothing it started outlives its return.
func Background(ctx context.Context, run RunFunc) (Process, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := &bgProcess{cancel: cancel, started: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer cancel()
		p.res, p.err = run(ctx, p.start)
		if p.err == nil && p.res == nil {
			p.err = fmt.Errorf("%w: backend returned no result", ErrUnavailable)
		}
	}()
	select {
	case <-p.started:
		return p, nil
	case <-p.done:
		select {
		case <-p.started:
			return p, nil // it ran, and is over already
		default:
		}
		if p.err == nil {
			p.err = fmt.Errorf("%w: the command ended before the backend said it started", ErrUnavailable)
		}
		return nil, p.err
	}
}

type bgProcess struct {
	cancel  context.CancelFunc
	once    sync.Once
	started chan struct{}
	ctl     Control // set before started is closed

	done chan struct{}
	res  *Result
	err  error
}

func (p *bgProcess) start(c Control) {
	p.once.Do(func() {
		p.ctl = c
		close(p.started)
	})
}

func (p *bgProcess) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *bgProcess) Wait() (*Result, error) {
	<-p.done
	return p.res, p.err
}

func (p *bgProcess) Signal(sig os.Signal) error {
	if p.ended() {
		return ErrProcessDone
	}
	if p.ctl == nil {
		return fmt.Errorf("%w: signals", ErrUnsupported)
	}
	if err := p.ctl.Signal(sig); err != nil {
		if p.ended() {
			return ErrProcessDone
		}
		return err
	}
	return nil
}

func (p *bgProcess) Kill() error {
	p.cancel()
	<-p.done
	return nil
}

func (p *bgProcess) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if p.ended() {
		return nil, ErrProcessDone
	}
	d, ok := p.ctl.(PortDialer)
	if !ok {
		return nil, fmt.Errorf("%w: reaching a port inside the sandbox", ErrUnsupported)
	}
	return d.DialPort(ctx, port)
}

func (p *bgProcess) Resize(rows, cols uint16) error {
	if p.ended() {
		return ErrProcessDone
	}
	r, ok := p.ctl.(Resizer)
	if !ok {
		return fmt.Errorf("%w: the command has no terminal", ErrUnsupported)
	}
	return r.Resize(rows, cols)
}
