package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/artifact"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/protocol"
)

// ErrNoCapacity: the executor cannot take another execution right now (no
// live worker with a free slot). It is the relay's, the one executor that
// can run out.
var ErrNoCapacity = relay.ErrNoCapacity

// Executor runs submitted executions. The local executor runs them on this
// machine through a backend.Backend; the relay executor sends them to an
// attached pulse-worker.
type Executor interface {
	// Name identifies the executor in logs and in capabilities replies
	// ("local:namespace", "relay").
	Name() string
	// Capabilities is what the executor enforces; it does not block.
	Capabilities() backend.Capabilities
	// Available returns nil when one more execution needing the programs
	// in requires could start now, or an error wrapping ErrNoCapacity.
	Available(requires []string) error
	// Exec runs req with the contract of backend.Backend.Exec: a Result
	// whenever a process started, and Result.Overlay holding what it
	// wrote to req.Workspace (whether the executor captures writes or
	// computes them afterwards), or, when those writes could not be
	// captured, the Result with an error wrapping backend.ErrOverlayLost.
	Exec(ctx context.Context, req *backend.Request) (*backend.Result, error)
}

// Local runs executions with a backend on this machine.
type Local struct {
	b          backend.Backend
	maxOverlay int64
	log        *slog.Logger
}

var _ Executor = (*Local)(nil)

// NewLocal returns the embedded executor over b. The caller chooses b
// (Docker, namespace, or host only when explicitly allowed) and keeps
// ownership: Local never closes it. maxOverlay bounds the bytes of changed
// files read back from a backend that writes in place (<= 0: the artifact
// unpacked limit).
func NewLocal(b backend.Backend, maxOverlay int64, log *slog.Logger) *Local {
	if maxOverlay <= 0 {
		maxOverlay = protocol.DefaultMaxUnpacked
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Local{b: b, maxOverlay: maxOverlay, log: log}
}

// Name implements Executor.
func (l *Local) Name() string { return "local:" + l.b.Name() }

// Capabilities implements Executor: the backend's, except that writes are
// always captured. A backend that writes in place changes only the
// server's copy of the workspace, and this executor returns what changed
// as an overlay, so for a client the writes never land directly.
func (l *Local) Capabilities() backend.Capabilities {
	c := l.b.Capabilities()
	if !c.CapturesWrites {
		c.CapturesWrites = true
		c.Notes = append(append([]string(nil), c.Notes...), "writes land in the server's copy of the workspace and come back as an overlay")
	}
	return c
}

// Available implements Executor: the server's own limit is the only one.
// Requirements name programs of a worker image; the local backend's image
// is the operator's choice, so they are not checked here.
func (l *Local) Available(requires []string) error { return nil }

// ProcessStarter is an Executor that can also start a command with a
// handle (backend.Starter's contract): the server runs process
// submissions (protocol.FeatureProcess) with it.
type ProcessStarter interface {
	Executor
	// StartsProcesses reports whether Start works here; the local
	// executor depends on its backend.
	StartsProcesses() bool
	// StartsTerminals reports whether Start honours Request.TTY.
	StartsTerminals() bool
	// Start returns once the command runs; the Process's Wait returns
	// what Exec would have.
	Start(ctx context.Context, req *backend.Request) (backend.Process, error)
}

var _ ProcessStarter = (*Local)(nil)

// Exec implements Executor.
func (l *Local) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	r, err := l.begin(req)
	if err != nil {
		return nil, err
	}
	return r.end(l.b.Exec(ctx, r.req))
}

// StartsProcesses implements ProcessStarter.
func (l *Local) StartsProcesses() bool {
	_, ok := l.b.(backend.Starter)
	return ok
}

// StartsTerminals implements ProcessStarter.
func (l *Local) StartsTerminals() bool {
	ts, ok := l.b.(backend.TerminalStarter)
	return ok && ts.StartsTerminals()
}

// Start implements ProcessStarter: the same command as Exec, the snapshot
// and egress proxy around it ending when the process does.
func (l *Local) Start(ctx context.Context, req *backend.Request) (backend.Process, error) {
	st, ok := l.b.(backend.Starter)
	if !ok {
		return nil, fmt.Errorf("backend %s runs no background processes: %w", l.b.Name(), backend.ErrUnsupported)
	}
	r, err := l.begin(req)
	if err != nil {
		return nil, err
	}
	p, err := st.Start(ctx, r.req)
	if err != nil {
		r.stopEgress()
		return nil, err
	}
	return &localProcess{Process: p, r: r}, nil
}

// localRun is what the local executor puts around one command: the
// snapshot of a workspace written in place, and the egress proxy.
type localRun struct {
	l          *Local
	req        *backend.Request
	snap       *artifact.Snapshot
	stopEgress func() ([]backend.NetworkEvent, int)
}

func (l *Local) begin(req *backend.Request) (*localRun, error) {
	r := &localRun{l: l}
	if !l.b.Capabilities().CapturesWrites {
		s, err := artifact.Take(req.Workspace)
		if err != nil {
			return nil, fmt.Errorf("snapshot workspace: %w", err)
		}
		r.snap = s
	}
	req, stopEgress, err := withEgress(req, l.log) // egress.go
	if err != nil {
		return nil, err
	}
	r.req, r.stopEgress = req, stopEgress
	return r, nil
}

// end turns the backend's answer into the executor's: the egress proxy
// stopped, and what a backend writing in place changed read back.
func (r *localRun) end(res *backend.Result, err error) (*backend.Result, error) {
	if evs, dropped := r.stopEgress(); res != nil {
		res.Network, res.NetworkDropped = evs, dropped
	}
	if err != nil {
		return res, err
	}
	if r.snap != nil {
		ov, err := r.snap.Diff(r.req.Workspace, r.l.maxOverlay)
		if err != nil {
			// The command ran: its result stands, and the error says that
			// what it wrote is gone.
			return res, fmt.Errorf("reading back what the command changed: %w: %w", err, backend.ErrOverlayLost)
		}
		res.Overlay = ov
	}
	return res, nil
}

// localProcess is a started command of the local executor: Wait ends
// the run around it once.
type localProcess struct {
	backend.Process
	r    *localRun
	once sync.Once
	res  *backend.Result
	err  error
}

func (p *localProcess) Wait() (*backend.Result, error) {
	p.once.Do(func() { p.res, p.err = p.r.end(p.Process.Wait()) })
	return p.res, p.err
}
