package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/artifact"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

// ErrWorkerLost: the worker running an execution disconnected or stopped
// answering before the execution ended.
var ErrWorkerLost = errors.New("worker lost")

// Relay defaults.
const (
	DefaultHelloTimeout   = 10 * time.Second
	DefaultWorkerLiveness = 35 * time.Second // 3.5 default heartbeats
	relayWorkerPath       = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	maxWorkerErrorMessage = 512
	// defaultStdinPiece keeps every Exec frame well under gRPC's default
	// 4 MiB message limit.
	defaultStdinPiece = 2 << 20
)

type relayOptions struct {
	log          *slog.Logger
	helloTimeout time.Duration
	liveness     time.Duration
	limits       protocol.ArchiveLimits
	stdinPiece   int
}

// RelayOption configures NewRelay.
type RelayOption func(*relayOptions) error

// WithRelayLogger sets the relay's logger (default: discard).
func WithRelayLogger(l *slog.Logger) RelayOption {
	return func(o *relayOptions) error { o.log = l; return nil }
}

// WithWorkerLiveness sets how long a worker may stay silent (no frame at
// all, heartbeats included) before it counts as lost.
func WithWorkerLiveness(d time.Duration) RelayOption {
	return func(o *relayOptions) error {
		if d <= 0 {
			return fmt.Errorf("worker liveness %v: %w", d, ErrConfig)
		}
		o.liveness = d
		return nil
	}
}

// WithRelayArtifactLimits bounds workspaces sent to and read back from
// workers.
func WithRelayArtifactLimits(l protocol.ArchiveLimits) RelayOption {
	return func(o *relayOptions) error { o.limits = l; return nil }
}

// Relay is the Executor that runs executions on pulse-workers attached
// over gRPC (SandboxWorker.Attach). It is also the gRPC service; register
// it on a grpc.Server with Register.
type Relay struct {
	sandboxv1.UnimplementedSandboxWorkerServer
	o     relayOptions
	auth  *authenticator
	reqID atomic.Uint64

	mu      sync.Mutex
	workers map[*worker]struct{}
}

var _ Executor = (*Relay)(nil)

// NewRelay returns a relay that accepts workers presenting one of tokens.
func NewRelay(tokens []string, opts ...RelayOption) (*Relay, error) {
	o := relayOptions{helloTimeout: DefaultHelloTimeout, liveness: DefaultWorkerLiveness, stdinPiece: defaultStdinPiece}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("relay needs at least one worker token: %w", ErrConfig)
	}
	return &Relay{o: o, auth: newAuthenticator(tokens), workers: map[*worker]struct{}{}}, nil
}

// Register adds the SandboxWorker service to g.
func (r *Relay) Register(g *grpc.Server) { sandboxv1.RegisterSandboxWorkerServer(g, r) }

// worker is one attached worker connection.
type worker struct {
	id       string
	capacity int
	caps     []string
	arch     string

	sendMu sync.Mutex
	stream sandboxv1.SandboxWorker_AttachServer

	mu       sync.Mutex
	busy     int // executions assigned
	pending  map[uint64]*pendingExec
	lastSeen time.Time
	lost     error
	gone     chan struct{}
}

// pendingExec collects the frames of one Exec.
type pendingExec struct {
	onChunk func(stream sandboxv1.Stream, data []byte)
	end     chan execEnd // buffered 1
}

type execEnd struct {
	exitCode int32
	message  string // ExecError message; "" for End
	isError  bool
	err      error // the worker was lost
}

func (w *worker) send(f *sandboxv1.ServerFrame) error {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	return w.stream.Send(f)
}

// Workers reports the live workers, their total capacity and slots in use.
func (r *Relay) Workers() (live, capacity, busy int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.workers {
		w.mu.Lock()
		live++
		capacity += w.capacity
		busy += w.busy
		w.mu.Unlock()
	}
	return live, capacity, busy
}

// Attach implements SandboxWorkerServer: one worker's connection for its
// whole life.
func (r *Relay) Attach(stream sandboxv1.SandboxWorker_AttachServer) error {
	ctx := stream.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	var header string
	if v := md.Get("authorization"); len(v) == 1 {
		header = v[0]
	}
	if _, ok := r.auth.check(header); !ok {
		r.o.log.Warn("worker attach refused: bad token")
		return status.Error(codes.Unauthenticated, "invalid worker token")
	}
	hello, err := r.recvHello(ctx, stream)
	if err != nil {
		return err
	}
	w := &worker{
		id: hello.GetSandboxId(), capacity: int(hello.GetCapacityMax()), caps: hello.GetCapabilities(),
		arch: hello.GetArch(), stream: stream, pending: map[uint64]*pendingExec{},
		lastSeen: time.Now(), gone: make(chan struct{}),
	}
	r.mu.Lock()
	r.workers[w] = struct{}{}
	r.mu.Unlock()
	r.o.log.Info("worker attached", "sandbox_id", w.id, "capacity", w.capacity, "capabilities", w.caps, "arch", w.arch)

	frames := make(chan *sandboxv1.WorkerFrame)
	recvErr := make(chan error, 1)
	go func() {
		for {
			f, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case frames <- f:
			case <-ctx.Done():
				recvErr <- ctx.Err()
				return
			}
		}
	}()
	tick := time.NewTicker(max(r.o.liveness/4, 10*time.Millisecond))
	defer tick.Stop()
	var cause error
loop:
	for {
		select {
		case f := <-frames:
			w.mu.Lock()
			w.lastSeen = time.Now()
			w.mu.Unlock()
			r.dispatch(w, f)
		case err := <-recvErr:
			cause = fmt.Errorf("worker %s disconnected: %v: %w", w.id, err, ErrWorkerLost)
			break loop
		case <-tick.C:
			w.mu.Lock()
			silent := time.Since(w.lastSeen)
			w.mu.Unlock()
			if silent > r.o.liveness {
				cause = fmt.Errorf("worker %s silent for %v: %w", w.id, silent.Round(time.Second), ErrWorkerLost)
				break loop
			}
		}
	}
	r.drop(w, cause)
	return status.Error(codes.Unavailable, cause.Error())
}

func (r *Relay) recvHello(ctx context.Context, stream sandboxv1.SandboxWorker_AttachServer) (*sandboxv1.Hello, error) {
	type res struct {
		f   *sandboxv1.WorkerFrame
		err error
	}
	ch := make(chan res, 1)
	go func() {
		f, err := stream.Recv()
		ch <- res{f, err}
	}()
	select {
	case x := <-ch:
		if x.err != nil {
			return nil, x.err
		}
		h := x.f.GetHello()
		if h == nil {
			return nil, status.Error(codes.InvalidArgument, "the first frame must be Hello")
		}
		if h.GetCapacityMax() == 0 || h.GetCapacityMax() > 4096 {
			return nil, status.Errorf(codes.InvalidArgument, "capacity_max %d out of range", h.GetCapacityMax())
		}
		return h, nil
	case <-time.After(r.o.helloTimeout):
		return nil, status.Error(codes.DeadlineExceeded, "no Hello")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// dispatch routes one worker frame to the exec it belongs to. Frames for
// unknown req_ids (an exec already given up on) are dropped.
func (r *Relay) dispatch(w *worker, f *sandboxv1.WorkerFrame) {
	var id uint64
	var end *execEnd
	switch x := f.Frame.(type) {
	case *sandboxv1.WorkerFrame_Heartbeat, *sandboxv1.WorkerFrame_Hello:
		return
	case *sandboxv1.WorkerFrame_Chunk:
		w.mu.Lock()
		p := w.pending[x.Chunk.GetReqId()]
		w.mu.Unlock()
		if p != nil && p.onChunk != nil {
			p.onChunk(x.Chunk.GetStream(), x.Chunk.GetData())
		}
		return
	case *sandboxv1.WorkerFrame_End:
		id = x.End.GetReqId()
		end = &execEnd{exitCode: x.End.GetExitCode()}
	case *sandboxv1.WorkerFrame_ExecError:
		id = x.ExecError.GetReqId()
		msg := x.ExecError.GetMessage()
		if len(msg) > maxWorkerErrorMessage {
			msg = msg[:maxWorkerErrorMessage]
		}
		end = &execEnd{isError: true, message: msg, exitCode: -1}
	default:
		return
	}
	w.mu.Lock()
	p := w.pending[id]
	delete(w.pending, id)
	w.mu.Unlock()
	if p != nil {
		p.end <- *end
	}
}

// drop removes a worker and fails everything it was running.
func (r *Relay) drop(w *worker, cause error) {
	r.mu.Lock()
	delete(r.workers, w)
	r.mu.Unlock()
	w.mu.Lock()
	w.lost = cause
	pend := w.pending
	w.pending = map[uint64]*pendingExec{}
	w.mu.Unlock()
	close(w.gone)
	for _, p := range pend {
		p.end <- execEnd{err: cause, exitCode: -1}
	}
	r.o.log.Warn("worker detached", "sandbox_id", w.id, "in_flight", len(pend), "cause", cause)
}

// Name implements Executor.
func (r *Relay) Name() string { return "relay" }

// Capabilities implements Executor. A worker runs commands with bash in
// its own sandbox image; the relay cannot enforce network or secret modes
// inside it, so it reports what the worker's deployment must provide: the
// network and the secrets are the pod's (allow-all), the command's
// environment is built from scratch (deny-all best effort).
func (r *Relay) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Isolation: backend.IsolationRemote,
		Network: map[policy.NetworkMode]secrets.EnforcementLevel{
			policy.NetworkAllowAll: secrets.Strong,
		},
		Secrets: map[secrets.Mode]secrets.EnforcementLevel{
			secrets.AllowAll:  secrets.Strong,
			secrets.DenyAll:   secrets.BestEffort,
			secrets.Allowlist: secrets.BestEffort,
		},
		CapturesWrites: true,
		Limits: map[string]secrets.EnforcementLevel{
			"timeout":      secrets.Strong,
			"output_bytes": secrets.Strong,
		},
		Notes: []string{"commands run on attached pulse-workers; isolation is the worker pod's"},
	}
}

// Available implements Executor.
func (r *Relay) Available(requires []string) error {
	if r.pick(false, requires) == nil {
		if len(requires) > 0 {
			return fmt.Errorf("no attached worker with %v has a free slot: %w", requires, ErrNoCapacity)
		}
		return fmt.Errorf("no attached worker has a free slot: %w", ErrNoCapacity)
	}
	return nil
}

func (w *worker) has(requires []string) bool {
	for _, need := range requires {
		found := false
		for _, c := range w.caps {
			if c == need {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// pick returns the least-loaded live worker with a free slot and every
// required program, reserving the slot when reserve is set.
func (r *Relay) pick(reserve bool, requires []string) *worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	ws := make([]*worker, 0, len(r.workers))
	for w := range r.workers {
		ws = append(ws, w)
	}
	// Stable order for equal load, so scheduling is deterministic.
	sort.Slice(ws, func(i, j int) bool { return ws[i].id < ws[j].id })
	var best *worker
	bestLoad := math.Inf(1)
	for _, w := range ws {
		w.mu.Lock()
		free := w.lost == nil && w.busy < w.capacity && w.has(requires)
		load := float64(w.busy) / float64(w.capacity)
		w.mu.Unlock()
		if free && load < bestLoad {
			best, bestLoad = w, load
		}
	}
	if best != nil && reserve {
		best.mu.Lock()
		best.busy++
		best.mu.Unlock()
	}
	return best
}

func (w *worker) release() {
	w.mu.Lock()
	w.busy--
	w.mu.Unlock()
}

// call runs one Exec on w and waits for its terminal frame. Cancelling ctx
// sends Abort and still waits for the worker's answer (End{-1}), bounded
// by the worker's liveness.
func (r *Relay) call(ctx context.Context, w *worker, ex *sandboxv1.Exec, onChunk func(sandboxv1.Stream, []byte)) (execEnd, bool) {
	ex.ReqId = r.reqID.Add(1)
	p := &pendingExec{onChunk: onChunk, end: make(chan execEnd, 1)}
	w.mu.Lock()
	if w.lost != nil {
		w.mu.Unlock()
		return execEnd{err: w.lost, exitCode: -1}, false
	}
	w.pending[ex.ReqId] = p
	w.mu.Unlock()
	if err := w.send(&sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Exec{Exec: ex}}); err != nil {
		w.mu.Lock()
		delete(w.pending, ex.ReqId)
		w.mu.Unlock()
		return execEnd{err: fmt.Errorf("worker %s: send: %v: %w", w.id, err, ErrWorkerLost), exitCode: -1}, false
	}
	aborted := false
	select {
	case e := <-p.end:
		return e, false
	case <-ctx.Done():
		aborted = true
		w.send(&sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Abort{Abort: &sandboxv1.Abort{ReqId: ex.ReqId}}})
	}
	select {
	case e := <-p.end:
		return e, aborted
	case <-time.After(r.o.liveness):
		w.mu.Lock()
		delete(w.pending, ex.ReqId)
		w.mu.Unlock()
		return execEnd{err: fmt.Errorf("worker %s did not confirm the abort: %w", w.id, ErrWorkerLost), exitCode: -1}, aborted
	}
}

// Exec implements Executor. The workspace travels to the worker through
// the exec protocol itself: one exec unpacks it from stdin (base64 of a
// tar.gz) into a fresh directory, one runs the command there, one sends
// the directory back as a tar.gz on stdout, and the last removes it.
func (r *Relay) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	if (req.Shell == "") == (len(req.Args) == 0) {
		return nil, fmt.Errorf("exactly one of Shell and Args: %w", backend.ErrInvalidRequest)
	}
	snap, err := artifact.Take(req.Workspace)
	if err != nil {
		return nil, fmt.Errorf("snapshot workspace: %w", err)
	}
	packed, err := artifact.PackDir(req.Workspace, r.o.limits)
	if err != nil {
		return nil, fmt.Errorf("pack workspace: %w", err)
	}
	w := r.pick(true, requiresFrom(ctx))
	if w == nil {
		return nil, fmt.Errorf("no attached worker has a free slot: %w", backend.ErrUnavailable)
	}
	defer w.release()
	log := r.o.log.With("execution_id", req.ExecutionID, "sandbox_id", w.id)

	// 1. Unpack, in its own context: setup is quick and must not be left
	// half done when the client cancels. The archive goes in pieces of at
	// most stdinPiece bytes, because a gRPC peer refuses messages over
	// 4 MiB by default, and is unpacked once whole.
	sctx := context.WithoutCancel(ctx)
	var dirOut bytes.Buffer
	end, _ := r.call(sctx, w, &sandboxv1.Exec{
		Command:  `d=$(mktemp -d "${TMPDIR:-/tmp}/pulse-exec.XXXXXXXX") && printf '%s' "$d"`,
		TimeoutS: 60, Streaming: true,
	}, func(s sandboxv1.Stream, b []byte) {
		if s == sandboxv1.Stream_STDOUT {
			dirOut.Write(b)
		}
	})
	if err := endErr("create workspace", end); err != nil {
		return nil, err
	}
	dir := strings.TrimSpace(dirOut.String())
	if !strings.HasPrefix(dir, "/") || strings.ContainsAny(dir, "'\n\x00") {
		return nil, fmt.Errorf("worker %s returned workspace %q: %w", w.id, dir, ErrWorkerLost)
	}
	b64File := shQuote(dir + ".b64")
	defer func() {
		// 4. Remove the directory, whatever happened.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.liveness)
		defer cancel()
		if e, _ := r.call(cctx, w, &sandboxv1.Exec{Command: "rm -rf " + shQuote(dir) + " " + b64File + " " + shQuote(dir+".stdin"), TimeoutS: 60, Streaming: true}, nil); endErr("cleanup", e) != nil {
			log.Warn("worker workspace not removed", "dir", dir, "err", endErr("cleanup", e))
		}
	}()
	encoded := []byte(base64.StdEncoding.EncodeToString(packed))
	for len(encoded) > 0 {
		n := min(len(encoded), r.o.stdinPiece)
		end, _ = r.call(sctx, w, &sandboxv1.Exec{Command: "cat >> " + b64File, Stdin: encoded[:n], TimeoutS: 120, Streaming: true}, nil)
		if err := endErr("send workspace", end); err != nil {
			return nil, err
		}
		encoded = encoded[n:]
	}
	end, _ = r.call(sctx, w, &sandboxv1.Exec{
		Command:  "base64 -d < " + b64File + " | tar -xzpf - --no-same-owner -C " + shQuote(dir) + " && rm -f " + b64File,
		TimeoutS: 300, Streaming: true,
	}, nil)
	if err := endErr("unpack workspace", end); err != nil {
		return nil, err
	}

	// Stdin travels with the run exec when it fits one frame, else as a
	// file beside the workspace, sent in pieces like the workspace.
	var stdin []byte
	stdinFile := ""
	if req.Stdin != nil {
		stdin, err = io.ReadAll(io.LimitReader(req.Stdin, protocol.MaxStdinBytes+1))
		if err != nil || len(stdin) > protocol.MaxStdinBytes {
			return nil, fmt.Errorf("stdin unreadable or over %d bytes: %w", protocol.MaxStdinBytes, backend.ErrInvalidRequest)
		}
	}
	if len(stdin) > r.o.stdinPiece {
		stdinFile = dir + ".stdin"
		for rest := stdin; len(rest) > 0; {
			n := min(len(rest), r.o.stdinPiece)
			end, _ = r.call(sctx, w, &sandboxv1.Exec{Command: "cat >> " + shQuote(stdinFile), Stdin: rest[:n], TimeoutS: 120, Streaming: true}, nil)
			if err := endErr("send stdin", end); err != nil {
				return nil, err
			}
			rest = rest[n:]
		}
		stdin = nil
	}

	// 2. Run.
	limits := req.Limits.WithDefaults()
	timeoutS := uint32(0)
	if limits.Timeout > 0 {
		timeoutS = uint32(max(1, math.Ceil(limits.Timeout.Seconds())))
	}
	// Output over the cap stops the command, as the local backends do,
	// rather than letting it run to its timeout unheard.
	rctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	capw := &relayOutput{limit: limits.OutputBytes, out: req.Stdout, err: req.Stderr, over: stopRun}
	start := time.Now()
	end, aborted := r.call(rctx, w, &sandboxv1.Exec{
		Command: runScript(dir, req, stdinFile), TimeoutS: timeoutS, Streaming: true, Stdin: stdin,
	}, capw.chunk)
	res := &backend.Result{Duration: time.Since(start), Truncated: capw.truncated}
	switch {
	case end.err != nil:
		return nil, end.err
	case end.isError && strings.HasPrefix(end.message, "timeout:"):
		res.ExitCode, res.Termination, res.TimedOut = -1, backend.Timeout, true
	case end.isError:
		return nil, fmt.Errorf("worker %s: %s: %w", w.id, end.message, backend.ErrUnavailable)
	case aborted && capw.truncated && ctx.Err() == nil:
		res.ExitCode, res.Termination = -1, backend.OutputLimit
	case aborted:
		res.ExitCode, res.Termination = int(end.exitCode), backend.Cancelled
	case capw.truncated:
		res.ExitCode, res.Termination = int(end.exitCode), backend.OutputLimit
	case end.exitCode < 0:
		res.ExitCode, res.Termination = -1, backend.Signaled
	default:
		res.ExitCode, res.Termination = int(end.exitCode), backend.Exited
	}

	// 3. Collect what the command changed.
	var tarOut bytes.Buffer
	var tooBig bool
	// base64 wraps lines: allow for a newline every 76 characters.
	maxB64 := base64.StdEncoding.EncodedLen(int(protocol.DefaultMaxCompressed)) * 78 / 76
	if r.o.limits.MaxCompressed > 0 {
		maxB64 = base64.StdEncoding.EncodedLen(int(r.o.limits.MaxCompressed)) * 78 / 76
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	end, _ = r.call(cctx, w, &sandboxv1.Exec{
		Command: "cd " + shQuote(dir) + " && tar -czf - --exclude=./.pulse . | base64", TimeoutS: 300, Streaming: true,
	}, func(s sandboxv1.Stream, b []byte) {
		if s == sandboxv1.Stream_STDOUT && !tooBig {
			if tarOut.Len()+len(b) > maxB64 {
				tooBig = true
				return
			}
			tarOut.Write(b)
		}
	})
	cancel()
	if err := endErr("collect workspace", end); err != nil || tooBig {
		log.Warn("overlay not collected", "err", err, "too_big", tooBig)
		return res, nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(tarOut.String()), ""))
	if err != nil {
		log.Warn("overlay not collected", "err", err)
		return res, nil
	}
	ov, err := snap.DiffTar(bytes.NewReader(raw), r.o.limits)
	if err != nil {
		log.Warn("overlay not collected", "err", err)
		return res, nil
	}
	res.Overlay = ov
	return res, nil
}

func endErr(step string, e execEnd) error {
	switch {
	case e.err != nil:
		return fmt.Errorf("%s: %w", step, e.err)
	case e.isError:
		return fmt.Errorf("%s: worker: %s: %w", step, e.message, backend.ErrUnavailable)
	case e.exitCode != 0:
		return fmt.Errorf("%s: exit status %d: %w", step, e.exitCode, backend.ErrUnavailable)
	}
	return nil
}

// relayOutput forwards chunks to the request's writers, capping each
// stream at limit bytes.
type relayOutput struct {
	mu        sync.Mutex
	limit     int64
	n         [2]int64
	out, err  interface{ Write([]byte) (int, error) }
	truncated bool
	over      func() // called when a stream goes over the cap
}

func (o *relayOutput) chunk(s sandboxv1.Stream, b []byte) {
	i := 0
	w := o.out
	if s == sandboxv1.Stream_STDERR {
		i, w = 1, o.err
	}
	o.mu.Lock()
	room := o.limit - o.n[i]
	hit := false
	if int64(len(b)) > room {
		b = b[:max(room, 0)]
		hit = !o.truncated
		o.truncated = true
	}
	o.n[i] += int64(len(b))
	o.mu.Unlock()
	if hit && o.over != nil {
		o.over()
	}
	if w != nil && len(b) > 0 {
		w.Write(b)
	}
}

// runScript builds the shell command that runs req in dir with an
// environment built from scratch, as the local backends do.
// A non-empty stdinFile becomes the command's standard input.
func runScript(dir string, req *backend.Request, stdinFile string) string {
	var b strings.Builder
	b.WriteString("cd " + shQuote(dir+"/"+strings.TrimPrefix(req.Dir, "./")) + " && exec env -i")
	base := map[string]string{"PATH": relayWorkerPath, "HOME": dir, "LANG": "C.UTF-8", "TERM": "dumb", "USER": "pulse"}
	for k, v := range req.Env {
		base[k] = v
	}
	keys := make([]string, 0, len(base))
	for k := range base {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.WriteString(" " + shQuote(k+"="+base[k]))
	}
	if req.Shell != "" {
		b.WriteString(" bash -c " + shQuote(req.Shell))
	} else {
		// Through "$@" so that no argument, not even a first one that
		// looks like NAME=VALUE, is read by env.
		b.WriteString(` bash -c 'exec "$@"' pulse`)
		for _, a := range req.Args {
			b.WriteString(" " + shQuote(a))
		}
	}
	if stdinFile != "" {
		b.WriteString(" < " + shQuote(stdinFile))
	}
	return b.String()
}

// shQuote quotes s for a POSIX shell.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
