package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"sync"
	"time"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/internal/worker/runner"
)

// Messages of the ExecError frames the session itself produces.
const (
	MsgBusy      = "busy: queue full"
	MsgDuplicate = "duplicate req_id: another command with this id is still running"
)

// Defaults for the zero values of Config.
const (
	DefaultCapacity  = 4
	DefaultQueueSize = 64
	DefaultCacheSize = 256
	DefaultHeartbeat = 10 * time.Second
)

var (
	// ErrNilRunner is returned by New without a runner.
	ErrNilRunner = errors.New("session: nil runner")
	// ErrDisconnected is the cause given to the execs of a connection that
	// ended.
	ErrDisconnected = errors.New("session: connection lost")
	// errAbort is the cause given to an exec the relay aborted.
	errAbort = errors.New("session: aborted by relay")
)

// Stream is one connection as the session needs it. The generated
// SandboxWorker_AttachClient satisfies it. Send is never called
// concurrently and must not keep the frame after it returns (gRPC marshals
// it before returning). Recv must fail once the connection is gone or the
// context given to Serve is done, as a stream opened with that context does.
type Stream interface {
	Send(*sandboxv1.WorkerFrame) error
	Recv() (*sandboxv1.ServerFrame, error)
}

// Config describes the worker. Zero values take the defaults above;
// Arch defaults to runtime.GOARCH and Logger to a discarding logger.
type Config struct {
	SandboxID    string
	Capacity     int // pool size N, reported as capacity_max
	QueueSize    int
	CacheSize    int
	Capabilities []string
	Arch         string
	Image        string
	Trust        string
	Labels       map[string]string
	// Isolation is Hello's isolation: runner.IsolationNamespace when the
	// runner boxes Execs carrying a Box, "" (IsolationNote says why)
	// when it cannot. Egress is Hello's egress.
	Isolation     string
	IsolationNote string
	Egress        bool
	Heartbeat     time.Duration
	Logger        *slog.Logger
}

// Session is a worker's state that outlives connections: its
// configuration and the dedup cache.
type Session struct {
	cfg    Config
	runner runner.Runner
	log    *slog.Logger

	mu    sync.Mutex // guards cache and every conn's inflight map
	cache *lru
}

// New returns a Session running execs with r.
func New(cfg Config, r runner.Runner) (*Session, error) {
	if r == nil {
		return nil, ErrNilRunner
	}
	if cfg.Capacity < 0 || cfg.QueueSize < 0 || cfg.CacheSize < 0 || cfg.Heartbeat < 0 {
		return nil, fmt.Errorf("session: negative size or interval in config")
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Arch == "" {
		cfg.Arch = runtime.GOARCH
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Capabilities = slices.Clone(cfg.Capabilities)
	cfg.Labels = maps.Clone(cfg.Labels)
	return &Session{cfg: cfg, runner: r, log: cfg.Logger, cache: newLRU(cfg.CacheSize)}, nil
}

// Hello returns the frame that opens every connection.
func (s *Session) Hello() *sandboxv1.Hello {
	return &sandboxv1.Hello{
		SandboxId:     s.cfg.SandboxID,
		CapacityMax:   uint32(s.cfg.Capacity),
		Capabilities:  slices.Clone(s.cfg.Capabilities),
		Arch:          s.cfg.Arch,
		Image:         s.cfg.Image,
		Trust:         s.cfg.Trust,
		Labels:        maps.Clone(s.cfg.Labels),
		Isolation:     s.cfg.Isolation,
		IsolationNote: s.cfg.IsolationNote,
		Egress:        s.cfg.Egress,
	}
}

// Serve runs one connection until st.Recv fails, then kills that
// connection's execs, waits for its goroutines and returns the receive
// error. The dedup cache survives for the next Serve.
func (s *Session) Serve(ctx context.Context, st Stream) error {
	connCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(ErrDisconnected)
	c := &conn{
		s:        s,
		ctx:      connCtx,
		snd:      &sender{st: st, onErr: func(err error) { cancel(fmt.Errorf("%w: send: %w", ErrDisconnected, err)) }},
		queue:    make(chan *job, s.cfg.QueueSize),
		inflight: make(map[uint64]*job),
	}
	if err := c.snd.send(&sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Hello{Hello: s.Hello()}}); err != nil {
		return fmt.Errorf("session: send hello: %w", err)
	}
	// Sending Hello says nothing of the relay's answer: a relay that
	// refuses the token does so on the stream's first receive. The
	// caller, which sees that answer, says when the worker is attached.
	s.log.Debug("hello sent", "sandbox_id", s.cfg.SandboxID, "capacity", s.cfg.Capacity)

	var wg sync.WaitGroup
	wg.Go(c.heartbeat)
	for range s.cfg.Capacity {
		wg.Go(c.work)
	}
	err := c.receive()
	cancel(ErrDisconnected)
	close(c.queue) // only receive enqueues, and it has returned
	wg.Wait()
	s.log.Debug("stream ended", "err", err)
	return err
}

type job struct {
	spec   runner.Spec
	fp     fingerprint
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// conn is the state of one Serve call.
type conn struct {
	s        *Session
	ctx      context.Context
	snd      *sender
	queue    chan *job
	inflight map[uint64]*job // guarded by s.mu; from enqueue to terminal frame
}

func (c *conn) receive() error {
	for {
		f, err := c.snd.st.Recv()
		if err != nil {
			return fmt.Errorf("session: recv: %w", err)
		}
		c.handle(f)
	}
}

// handle dispatches one frame from the relay. It never blocks on the pool.
func (c *conn) handle(f *sandboxv1.ServerFrame) {
	switch fr := f.GetFrame().(type) {
	case *sandboxv1.ServerFrame_Exec:
		if fr.Exec != nil {
			c.exec(fr.Exec)
		}
	case *sandboxv1.ServerFrame_Abort:
		if fr.Abort != nil {
			c.abort(fr.Abort.GetReqId())
		}
	default:
		// A frame type from a newer relay: ignoring it keeps the
		// connection usable.
		c.s.log.Debug("ignoring unknown frame")
	}
}

func (c *conn) exec(e *sandboxv1.Exec) {
	s, id := c.s, e.GetReqId()
	fp := fingerprintOf(e.GetCommand(), e.GetStdin(), e.GetBox())

	s.mu.Lock()
	// In-flight first: a duplicate arriving while the original runs must
	// not be answered a second time from the cache once it completes.
	if j, ok := c.inflight[id]; ok {
		s.mu.Unlock()
		if j.fp == fp {
			s.log.Debug("redelivery of a running exec; its terminal frame answers both", "req_id", id)
			return
		}
		s.log.Warn("req_id collision with a running exec; refusing", "req_id", id)
		c.snd.send(execError(id, MsgDuplicate))
		return
	}
	if ent, ok := s.cache.get(id); ok {
		if ent.fp == fp {
			s.mu.Unlock()
			s.log.Info("redelivery of a completed exec; re-sending its terminal frame", "req_id", id)
			c.snd.send(ent.terminal)
			return
		}
		s.log.Warn("req_id collision with a completed exec; running the new command", "req_id", id)
	}
	jctx, jcancel := context.WithCancelCause(c.ctx)
	j := &job{
		spec: runner.Spec{
			ReqID:     id,
			Command:   e.GetCommand(),
			Stdin:     e.GetStdin(),
			TimeoutS:  e.GetTimeoutS(),
			Streaming: e.GetStreaming(),
			Box:       e.GetBox(),
		},
		fp:     fp,
		ctx:    jctx,
		cancel: jcancel,
	}
	select {
	case c.queue <- j:
		c.inflight[id] = j
		s.mu.Unlock()
	default:
		s.mu.Unlock()
		jcancel(nil)
		s.log.Warn("queue full; refusing exec", "req_id", id)
		c.snd.send(execError(id, MsgBusy))
	}
}

func (c *conn) abort(id uint64) {
	c.s.mu.Lock()
	j, ok := c.inflight[id]
	c.s.mu.Unlock()
	if !ok {
		return // unknown or finished: nothing to do
	}
	c.s.log.Info("abort", "req_id", id)
	j.cancel(errAbort)
}

func (c *conn) work() {
	for j := range c.queue {
		c.run(j)
	}
}

func (c *conn) run(j *job) {
	s, id := c.s, j.spec.ReqID
	if j.ctx.Err() != nil {
		// Aborted or disconnected while queued: never start it.
		c.finish(j, c.terminalFor(j, -1, runner.ErrAborted))
		return
	}
	sink := &chunkSink{snd: c.snd, reqID: id}
	code, err := s.runner.Run(j.ctx, j.spec, sink)
	if err != nil && !errors.Is(err, runner.ErrTimeout) {
		s.log.Debug("exec ended with error", "req_id", id, "err", err)
	}
	terminal := c.terminalFor(j, code, err)
	if end := terminal.GetEnd(); end != nil && sink.extra != nil {
		end.Network, end.NetworkDropped, end.Termination = sink.extra.Network, sink.extra.NetworkDropped, sink.extra.Termination
	}
	c.finish(j, terminal)
}

// terminalFor maps a runner outcome to the exec's terminal frame, or nil
// when there is no one left to send it to.
func (c *conn) terminalFor(j *job, code int32, err error) *sandboxv1.WorkerFrame {
	id := j.spec.ReqID
	switch {
	case errors.Is(err, runner.ErrSink):
		return nil // the stream is gone
	case err == nil:
		return &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_End{End: &sandboxv1.End{ReqId: id, ExitCode: code}}}
	case errors.Is(err, runner.ErrTimeout):
		return execError(id, fmt.Sprintf("timeout:%d", j.spec.TimeoutS))
	case errors.Is(err, runner.ErrAborted) || errors.Is(err, context.Canceled):
		if errors.Is(context.Cause(j.ctx), errAbort) {
			return &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_End{End: &sandboxv1.End{ReqId: id, ExitCode: -1}}}
		}
		return nil // killed because the connection ended
	default:
		return execError(id, err.Error())
	}
}

// finish records the terminal frame, releases the req_id and sends the
// frame. Cache and in-flight change under one lock, so a redelivery sees
// either the running exec or its cached result, never neither.
func (c *conn) finish(j *job, terminal *sandboxv1.WorkerFrame) {
	s, id := c.s, j.spec.ReqID
	s.mu.Lock()
	if terminal != nil {
		s.cache.put(id, j.fp, terminal)
	}
	if c.inflight[id] == j {
		delete(c.inflight, id)
	}
	s.mu.Unlock()
	j.cancel(nil)
	if terminal != nil {
		c.snd.send(terminal)
	}
}

func (c *conn) heartbeat() {
	t := time.NewTicker(c.s.cfg.Heartbeat)
	defer t.Stop()
	hb := &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Heartbeat{Heartbeat: &sandboxv1.Heartbeat{}}}
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			if c.snd.send(hb) != nil {
				return
			}
		}
	}
}

func execError(id uint64, msg string) *sandboxv1.WorkerFrame {
	return &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_ExecError{ExecError: &sandboxv1.ExecError{ReqId: id, Message: msg}}}
}

// sender serialises Sends: gRPC streams are not safe for concurrent Send,
// and the heartbeat and every running exec share one stream. After the
// first error it fails fast and tells the connection.
type sender struct {
	mu    sync.Mutex
	st    Stream
	err   error
	onErr func(error)
}

func (s *sender) send(f *sandboxv1.WorkerFrame) error {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	err := s.st.Send(f)
	if err != nil {
		s.err = err
	}
	s.mu.Unlock()
	if err != nil && s.onErr != nil {
		s.onErr(err)
	}
	return err
}

// chunkSink turns runner output into Chunk frames, and keeps what a
// boxed exec adds to its End (runner.Reporter).
type chunkSink struct {
	snd   *sender
	reqID uint64
	extra *sandboxv1.End
}

// Report implements runner.Reporter; Run calls it before it returns.
func (k *chunkSink) Report(extra *sandboxv1.End) { k.extra = extra }

func (k *chunkSink) Chunk(stream sandboxv1.Stream, data []byte) error {
	return k.snd.send(&sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Chunk{Chunk: &sandboxv1.Chunk{ReqId: k.reqID, Stream: stream, Data: data}}})
}
