package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/gvisor"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/egressrun"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// What Hello's isolation says of a worker's boxes, and what a worker may
// be asked to use (Config.Isolation).
const (
	// IsolationNamespace: the namespace backend makes the boxes.
	IsolationNamespace = "namespace"
	// IsolationGVisor: gVisor's runsc (the gvisor backend) makes them,
	// for a node that cannot make user namespaces (a cluster that
	// forbids them in pods) but lets the worker run runsc as root.
	IsolationGVisor = "gvisor"
	// IsolationAuto asks for namespace, else gVisor.
	IsolationAuto = "auto"
)

// ValidIsolation reports whether s is one a worker may be asked for
// ("" is auto).
func ValidIsolation(s string) bool {
	switch s {
	case "", IsolationAuto, IsolationNamespace, IsolationGVisor:
		return true
	}
	return false
}

// ErrNoBox: an Exec carrying a Box reached a runner that makes no boxes.
// It is never run outside one.
var ErrNoBox = errors.New("runner: this worker makes no boxes")

// Reporter is a Sink that also takes what a boxed exec adds to its End
// frame: the connections of its egress proxy and how it ended when the
// exit code does not say it. Report is called once, before Run returns.
type Reporter interface {
	Report(extra *sandboxv1.End)
}

// ProbeBoxes makes the backend isolation asks for and runs a trial
// command in it, as `pulse doctor` does, and returns it with the
// isolation it gives (IsolationNamespace or IsolationGVisor). Auto ("")
// tries namespace, then gVisor. The error says why no box can be made
// here (no user namespaces in the pod, a seccomp profile refusing
// unshare, no runsc, ...), for each backend tried. The caller closes the
// backend.
func ProbeBoxes(ctx context.Context, log *slog.Logger, isolation string) (backend.Backend, string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !ValidIsolation(isolation) {
		return nil, "", fmt.Errorf("runner: isolation %q: want %s, %s or %s", isolation, IsolationAuto, IsolationNamespace, IsolationGVisor)
	}
	var errs []error
	for _, kind := range []string{IsolationNamespace, IsolationGVisor} {
		if isolation != "" && isolation != IsolationAuto && isolation != kind {
			continue
		}
		b, err := probeBox(ctx, log, kind)
		if err == nil {
			return b, kind, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", kind, err))
	}
	return nil, "", errors.Join(errs...)
}

// probeBox makes the backend of one isolation and probes it.
func probeBox(ctx context.Context, log *slog.Logger, kind string) (backend.Backend, error) {
	var b interface {
		backend.Backend
		Probe(context.Context) error
		Close() error
	}
	var err error
	switch kind {
	case IsolationNamespace:
		b, err = namespace.New(namespace.WithLogger(log))
	default:
		b, err = gvisor.New(gvisor.WithLogger(log))
	}
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.Probe(pctx); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Boxes runs each Exec carrying a Box in a box of its own made by a
// capturing backend (namespace), and every other Exec, the relay's own
// steps around it (make the directory, move the workspace in and the
// overlay out, remove them), with Bash. The box shows the workspace
// read-only and captures what the command writes; Boxes writes that as an
// overlay archive to Box.overlay_file, outside the box, where the relay's
// next step reads it. An allowlist box gets an egress proxy of its own
// beside it (egressrun), holding the values of the injected secrets; the
// box sees only their placeholders. Boxes is safe for concurrent use.
type Boxes struct {
	bash *Bash
	b    backend.Backend
	log  *slog.Logger
}

var _ Runner = (*Boxes)(nil)

// NewBoxes returns a runner that boxes with b and runs the rest with
// bash. It does not take ownership of b.
func NewBoxes(bash *Bash, b backend.Backend, log *slog.Logger) *Boxes {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Boxes{bash: bash, b: b, log: log}
}

// Run implements Runner.
func (x *Boxes) Run(ctx context.Context, s Spec, sink Sink) (int32, error) {
	if s.Box == nil {
		return x.bash.Run(ctx, s, sink)
	}
	req, err := boxRequest(s)
	if err != nil {
		return -1, fmt.Errorf("%w: %w", ErrStart, err)
	}
	if f := s.Box.GetStdinFile(); f != "" {
		// The relay wrote it beside the workspace; it is read here, by
		// the worker, and reaches the box only as a pipe.
		fl, err := os.OpenFile(f, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return -1, fmt.Errorf("%w: stdin: %w", ErrStart, err)
		}
		defer fl.Close()
		req.Stdin = fl
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if s.TimeoutS > 0 {
		var stop context.CancelFunc
		runCtx, stop = context.WithTimeoutCause(runCtx, time.Duration(s.TimeoutS)*time.Second, ErrTimeout)
		defer stop()
	}
	d := &delivery{ctx: runCtx, fail: cancel, sink: sink, streaming: s.Streaming}
	req.Stdout, req.Stderr = d.writer(sandboxv1.Stream_STDOUT), d.writer(sandboxv1.Stream_STDERR)
	req, stopEgress, err := egressrun.Start(req, x.log)
	if err != nil {
		return -1, fmt.Errorf("%w: %w", ErrStart, err)
	}
	res, err := x.b.Exec(runCtx, req)
	events, dropped := stopEgress()
	if rep, ok := sink.(Reporter); ok {
		extra := &sandboxv1.End{Network: wireEvents(events), NetworkDropped: uint32(dropped)}
		if res != nil && (res.Termination == backend.OOM || res.Termination == backend.DiskLimit) {
			extra.Termination = string(res.Termination)
		}
		rep.Report(extra)
	}
	if res != nil && res.Overlay != nil {
		// Written even when the command was ended: the relay collects
		// what it wrote up to there, as the local backends return it.
		if werr := x.writeOverlay(s.Box.GetOverlayFile(), res.Overlay); werr != nil {
			x.log.Warn("boxed exec's writes not kept", "req_id", s.ReqID, "err", werr)
		}
	}
	if err != nil && res == nil {
		// Nothing ran: what the box refused or failed to make is only
		// "an internal error" past the relay, so the worker's log says it.
		x.log.Warn("boxed exec not run", "req_id", s.ReqID, "err", err)
	}
	if errors.Is(err, backend.ErrOverlayLost) {
		// The command ran; the missing overlay file tells the relay
		// that its writes are gone.
		x.log.Warn("boxed exec's writes lost", "req_id", s.ReqID, "err", err)
		err = nil
	}
	return outcome(ctx, runCtx, x.log, s, d, res, err)
}

// boxRequest is the backend request of s's Box: its paths checked, its
// policies decoded (an empty network policy is deny-all), no timeout or
// output cap of the backend's own (the runner's context and the relay
// bound them).
func boxRequest(s Spec) (*backend.Request, error) {
	bx := s.Box
	for _, p := range []string{bx.GetWorkspace(), bx.GetOverlayFile()} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return nil, fmt.Errorf("box path %q is not absolute and clean: %w", p, backend.ErrInvalidRequest)
		}
	}
	if (bx.GetShell() == "") == (len(bx.GetArgs()) == 0) {
		return nil, fmt.Errorf("box: exactly one of shell and args: %w", backend.ErrInvalidRequest)
	}
	var lim policy.ResourceLimits
	if len(bx.GetLimits()) > 0 {
		if err := json.Unmarshal(bx.GetLimits(), &lim); err != nil {
			return nil, fmt.Errorf("box limits: %v: %w", err, backend.ErrInvalidRequest)
		}
	}
	lim.Timeout, lim.OutputBytes = time.Duration(math.MaxInt64), math.MaxInt64
	np := policy.NetworkPolicy{Mode: policy.NetworkDenyAll}
	if len(bx.GetNetwork()) > 0 {
		if err := json.Unmarshal(bx.GetNetwork(), &np); err != nil {
			return nil, fmt.Errorf("box network policy: %v: %w", err, backend.ErrInvalidRequest)
		}
	}
	req := &backend.Request{
		ExecutionID: strconv.FormatUint(s.ReqID, 10),
		Workspace:   bx.GetWorkspace(),
		Dir:         bx.GetDir(),
		Shell:       bx.GetShell(),
		Args:        bx.GetArgs(),
		Env:         bx.GetEnv(),
		Limits:      lim,
		Network:     np,
	}
	if len(s.Stdin) > 0 {
		req.Stdin = bytes.NewReader(s.Stdin)
	}
	if ins := bx.GetInject(); len(ins) > 0 {
		if np.Mode != policy.NetworkAllowlist {
			return nil, fmt.Errorf("box: secrets to inject without an allowlist: %w", backend.ErrInvalidRequest)
		}
		eg := &backend.Egress{}
		for _, in := range ins {
			eg.Inject = append(eg.Inject, backend.Injection{Name: in.GetName(), Placeholder: in.GetPlaceholder(), Value: in.GetValue(), Hosts: in.GetHosts()})
		}
		req.Egress = eg
	}
	return req, nil
}

// writeOverlay writes ov as the remote protocol's overlay archive to a
// new file at path. Entries that are not content (a fifo or socket the
// command left) have no place in the archive and are named in the log.
func (x *Boxes) writeOverlay(path string, ov *backend.Overlay) error {
	kept := *ov
	kept.Files = nil
	for _, f := range ov.Files {
		if f.Special() {
			x.log.Warn("boxed exec left a special file; not kept", "path", f.Path, "mode", f.Mode.String())
			continue
		}
		kept.Files = append(kept.Files, f)
	}
	data, err := protocol.PackOverlay(&kept)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// wireEvents turns the proxy's events into End's.
func wireEvents(evs []backend.NetworkEvent) []*sandboxv1.NetworkEvent {
	out := make([]*sandboxv1.NetworkEvent, 0, len(evs))
	for _, e := range evs {
		out = append(out, &sandboxv1.NetworkEvent{
			Method: e.Method, Host: e.Host, Port: int32(e.Port), Addr: e.Addr, Allowed: e.Allowed,
			Rule: e.Rule, Reason: e.Reason, Injected: e.Injected, Sent: e.Sent, Received: e.Received,
			DurationNs: int64(e.Duration),
		})
	}
	return out
}
