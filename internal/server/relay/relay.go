package relay

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/bearer"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

var (
	// ErrWorkerLost: the worker running an execution disconnected or
	// stopped answering before the execution ended.
	ErrWorkerLost = errors.New("worker lost")
	// ErrNoCapacity: no live worker with the required programs has a free
	// slot right now.
	ErrNoCapacity = errors.New("no execution capacity")
	// ErrConfig is wrapped by every configuration error of New.
	ErrConfig = errors.New("invalid relay configuration")
)

// Relay defaults.
const (
	DefaultHelloTimeout   = 10 * time.Second
	DefaultWorkerLiveness = 35 * time.Second // 3.5 default heartbeats
	// DefaultQueueWait bounds the wait for a slot of an execution the
	// server accepted while a slot was free, and another took it first.
	DefaultQueueWait      = 30 * time.Second
	relayWorkerPath       = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	maxWorkerErrorMessage = 512
	// Hello's isolation of a worker that boxes each execution, with the
	// namespace backend or with gVisor's runsc
	// (runner.IsolationNamespace, runner.IsolationGVisor on the worker's
	// side). Any other says the worker does not.
	isolationNamespace = "namespace"
	isolationGVisor    = "gvisor"
	// defaultStdinPiece keeps every Exec frame well under gRPC's default
	// 4 MiB message limit.
	defaultStdinPiece = 2 << 20
)

type options struct {
	log          *slog.Logger
	helloTimeout time.Duration
	liveness     time.Duration
	queueWait    time.Duration
	limits       protocol.ArchiveLimits
	stdinPiece   int
}

// Option configures New.
type Option func(*options) error

// WithLogger sets the relay's logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error { o.log = l; return nil }
}

// WithWorkerLiveness sets how long a worker may stay silent (no frame at
// all, heartbeats included) before it counts as lost.
func WithWorkerLiveness(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("worker liveness %v: %w", d, ErrConfig)
		}
		o.liveness = d
		return nil
	}
}

// WithQueueWait sets how long an execution waits for a slot when every
// worker that could run it is busy (default DefaultQueueWait) before it
// fails with backend.ErrUnavailable.
func WithQueueWait(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("queue wait %v: %w", d, ErrConfig)
		}
		o.queueWait = d
		return nil
	}
}

// WithArchiveLimits bounds workspaces sent to and read back from workers.
func WithArchiveLimits(l protocol.ArchiveLimits) Option {
	return func(o *options) error { o.limits = l; return nil }
}

// WithStdinPiece sets the most stdin bytes (workspace archive or command
// input) one Exec frame carries; more goes in several (default 2 MiB,
// well under gRPC's default 4 MiB message limit).
func WithStdinPiece(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("stdin piece %d: %w", n, ErrConfig)
		}
		o.stdinPiece = n
		return nil
	}
}

// Relay is the server's executor that runs executions on pulse-workers
// attached over gRPC (SandboxWorker.Attach). It is also the gRPC service;
// register it on a grpc.Server with Register.
type Relay struct {
	sandboxv1.UnimplementedSandboxWorkerServer
	o     options
	auth  *bearer.Tokens
	reqID atomic.Uint64

	mu      sync.Mutex
	workers map[*worker]struct{}
	// freed is closed, and replaced, when a slot frees or a worker
	// attaches: executions waiting for a slot (pickFor) try again.
	freed chan struct{}
	turn  uint64 // where pick starts among equally loaded workers
}

// New returns a relay that accepts workers presenting one of tokens.
func New(tokens []string, opts ...Option) (*Relay, error) {
	o := options{helloTimeout: DefaultHelloTimeout, liveness: DefaultWorkerLiveness, queueWait: DefaultQueueWait, stdinPiece: defaultStdinPiece}
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
	r := &Relay{o: o, auth: bearer.New(tokens), workers: map[*worker]struct{}{}, freed: make(chan struct{})}
	r.reqID.Store(firstReqID())
	return r, nil
}

// firstReqID is where a relay's req_ids start: random, so that a restarted
// server does not send again the req_ids of the one before it. A worker
// keeps its dedup cache (req_id to terminal frame) across reconnects and
// answers a req_id it has seen with the same command from that cache,
// without running it: counting from 1 again, a new server's first Execs
// would get the old server's answers. The top bit and the low 32 bits are
// zero, so the counter never reaches 0 again by wrapping.
func firstReqID() uint64 {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return binary.BigEndian.Uint64(b[:]) &^ (1<<63 | 1<<32 - 1)
}

// Register adds the SandboxWorker service to g.
func (r *Relay) Register(g *grpc.Server) { sandboxv1.RegisterSandboxWorkerServer(g, r) }

// worker is one attached worker connection.
type worker struct {
	id       string
	capacity int
	caps     []string
	arch     string
	// boxes: the worker's Hello said isolation "namespace" or "gvisor", so each
	// execution sent to it runs in a box of its own (Exec.box); egress:
	// it runs the box's allowlist proxy and injection beside the box.
	boxes, egress bool

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
	// What a boxed exec's End adds: its egress connections and how it
	// ended when the code does not say it.
	network        []*sandboxv1.NetworkEvent
	networkDropped uint32
	termination    string
	message        string // ExecError message; "" for End
	isError        bool
	err            error // the worker was lost
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
	if _, ok := r.auth.Match(header); !ok {
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
		boxes: hello.GetIsolation() == isolationNamespace || hello.GetIsolation() == isolationGVisor,
	}
	w.egress = w.boxes && hello.GetEgress()
	if !w.boxes && w.capacity > 1 {
		// Executions side by side as one user in one pod see each
		// other: a worker that cannot keep them apart gets one at a
		// time, whatever it says (an older worker says nothing).
		w.capacity = 1
	}
	r.mu.Lock()
	r.workers[w] = struct{}{}
	r.wakeLocked()
	r.mu.Unlock()
	r.o.log.Info("worker attached", "sandbox_id", w.id, "capacity", w.capacity, "capabilities", w.caps, "arch", w.arch,
		"isolation", hello.GetIsolation(), "isolation_note", hello.GetIsolationNote(), "egress", w.egress)

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
		end = &execEnd{exitCode: x.End.GetExitCode(), network: x.End.GetNetwork(),
			networkDropped: x.End.GetNetworkDropped(), termination: x.End.GetTermination()}
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
	// An execution waiting for a slot may have only this worker to wait
	// for: it finds out now rather than at the end of its wait.
	r.wakeLocked()
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

// Name names the executor in logs and capabilities replies.
func (r *Relay) Name() string { return "relay" }

// Capabilities is what the relay enforces. Where a live worker boxes its
// executions (Hello's isolation), the relay sends every execution whose
// policy restricts the network or the secrets to such a worker, and what
// the box enforces is the relay's: each command in namespaces of its own,
// its network empty or (with the worker's egress) behind an allowlist
// proxy on the worker that injects the secrets bound to hosts, its
// environment built from scratch. Without one, a worker runs commands
// with bash in its own image, and the relay reports what the worker's
// deployment must provide: the network and the secrets are the pod's
// (allow-all), the command's environment is built from scratch (deny-all
// best effort). Workers come and go, so the answer is the one of now.
func (r *Relay) Capabilities() backend.Capabilities {
	boxes, egress := r.boxing()
	c := backend.Capabilities{
		Isolation: backend.IsolationRemote,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{
			policy.NetworkAllowAll: policy.Strong,
		},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{
			secrets.AllowAll:  policy.Strong,
			secrets.DenyAll:   policy.BestEffort,
			secrets.Allowlist: policy.BestEffort,
		},
		CapturesWrites: true,
		Limits: map[policy.LimitKey]policy.EnforcementLevel{
			policy.LimitTimeout:     policy.Strong,
			policy.LimitOutputBytes: policy.Strong,
		},
		Notes: []string{"commands run on attached pulse-workers; isolation is the worker pod's"},
	}
	if !boxes {
		return c
	}
	c.Network[policy.NetworkDenyAll] = policy.Strong
	if egress {
		c.Network[policy.NetworkAllowlist] = policy.Strong
	}
	c.Secrets[secrets.DenyAll], c.Secrets[secrets.Allowlist] = policy.Strong, policy.Strong
	c.Notes = []string{"commands run on attached pulse-workers, each execution in a box of its own (namespaces)"}
	if egress {
		c.Notes = append(c.Notes, "an allowlist command reaches the network through an egress proxy beside its box on the worker, which injects the secrets bound to hosts")
	}
	return c
}

// boxing reports whether a live worker boxes its executions, and whether
// one of those also runs their egress proxy.
func (r *Relay) boxing() (boxes, egress bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.workers {
		w.mu.Lock()
		live := w.lost == nil
		w.mu.Unlock()
		if live && w.boxes {
			boxes = true
			egress = egress || w.egress
		}
	}
	return boxes, egress
}

// Available returns nil when one more execution needing the programs in
// requires could start now, or an error wrapping ErrNoCapacity.
func (r *Relay) Available(requires []string) error {
	if r.pick(false, requires, anyWorker) == nil {
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

// need is what an execution needs of its worker beyond programs.
type need int

const (
	anyWorker    need = iota
	boxWorker         // one that boxes executions
	egressWorker      // one that boxes them and runs their egress proxy
)

func (w *worker) meets(n need) bool {
	switch n {
	case boxWorker:
		return w.boxes
	case egressWorker:
		return w.egress
	}
	return true
}

// pick returns the least-loaded live worker with a free slot, every
// required program and what n asks, reserving the slot when reserve is
// set.
func (r *Relay) pick(reserve bool, requires []string, n need) *worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	ws := make([]*worker, 0, len(r.workers))
	for w := range r.workers {
		ws = append(ws, w)
	}
	// Equal loads take turns: a stable order, scanned from a start that
	// moves on with every reservation. Always starting from the first
	// would send every replica's next execution to the same worker (each
	// counts only its own), piling them on its shared slots while the
	// others idle.
	sort.Slice(ws, func(i, j int) bool { return ws[i].id < ws[j].id })
	first := 0
	if len(ws) > 0 {
		first = int(r.turn % uint64(len(ws)))
	}
	var best *worker
	bestLoad := math.Inf(1)
	for i := range ws {
		w := ws[(first+i)%len(ws)]
		w.mu.Lock()
		free := w.lost == nil && w.busy < w.capacity && w.has(requires) && w.meets(n)
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
		r.turn++
	}
	return best
}

// release frees the slot pick reserved on w.
func (r *Relay) release(w *worker) {
	w.mu.Lock()
	w.busy--
	w.mu.Unlock()
	r.mu.Lock()
	r.wakeLocked()
	r.mu.Unlock()
}

// wakeLocked wakes the executions waiting for a slot. The caller holds
// r.mu.
func (r *Relay) wakeLocked() {
	close(r.freed)
	r.freed = make(chan struct{})
}

// freedSignal returns the channel the next release or attach closes.
func (r *Relay) freedSignal() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.freed
}

// could reports whether a live worker with every program of requires
// and what n asks is attached, free or not: one that a slot may free on.
func (r *Relay) could(requires []string, n need) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.workers {
		w.mu.Lock()
		ok := w.lost == nil && w.has(requires) && w.meets(n)
		w.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}
