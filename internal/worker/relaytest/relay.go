// Package relaytest is an in-process relay for tests: a real gRPC
// SandboxWorker server on 127.0.0.1 that parks each worker's Attach stream
// and lets the test drive it, sending Exec and Abort frames and collecting
// the worker's answers per req_id. It misbehaves on purpose when asked
// (Drop, resending a req_id), which is how dedup and reconnect are tested;
// a production relay never needs to.
//
// It is the reference of the relay side of the contract: the real relay in
// pulse-server must accept what this accepts and send what this sends.
package relaytest

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

var (
	// ErrClosed is returned once the relay or the connection has ended.
	ErrClosed = errors.New("relaytest: closed")
	// ErrPending is returned by Exec for a req_id whose earlier call on the
	// same connection has not ended yet.
	ErrPending = errors.New("relaytest: req_id already pending on this connection")
)

// Relay is a running test relay.
type Relay struct {
	token string
	lis   net.Listener
	srv   *grpc.Server
	conns chan *Conn

	mu      sync.Mutex
	attachN int
	reject  int
}

// Start serves a relay on 127.0.0.1:0 that accepts workers presenting
// "Bearer <token>". Close stops it.
func Start(token string) (*Relay, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("relaytest: listen: %w", err)
	}
	r := &Relay{token: token, lis: lis, srv: grpc.NewServer(), conns: make(chan *Conn, 16)}
	sandboxv1.RegisterSandboxWorkerServer(r.srv, &service{r: r})
	go r.srv.Serve(lis) //nolint:errcheck // returns when Close stops it
	return r, nil
}

// Addr is the host:port workers dial.
func (r *Relay) Addr() string { return r.lis.Addr().String() }

// Attaches counts the Attach calls that passed authentication.
func (r *Relay) Attaches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attachN
}

// Rejected counts the Attach calls refused for a bad or missing token.
func (r *Relay) Rejected() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reject
}

// Close stops the relay and ends every connection.
func (r *Relay) Close() { r.srv.Stop() }

// Accept waits for the next worker connection whose Hello has arrived.
func (r *Relay) Accept(ctx context.Context) (*Conn, error) {
	select {
	case c := <-r.conns:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type service struct {
	sandboxv1.UnimplementedSandboxWorkerServer
	r *Relay
}

func (s *service) Attach(stream sandboxv1.SandboxWorker_AttachServer) error {
	if err := s.r.authorize(stream.Context()); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "first frame must be Hello")
	}
	s.r.mu.Lock()
	s.r.attachN++
	s.r.mu.Unlock()

	ctx, cancel := context.WithCancelCause(stream.Context())
	c := &Conn{
		hello:  hello,
		stream: stream,
		ctx:    ctx,
		cancel: cancel,
		calls:  make(map[uint64]*Call),
	}
	go c.receive()
	select {
	case s.r.conns <- c:
	case <-ctx.Done():
	}
	<-ctx.Done()
	if errors.Is(context.Cause(ctx), errDropped) {
		return status.Error(codes.Unavailable, "relaytest: connection dropped")
	}
	return nil
}

func (r *Relay) authorize(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	want := "Bearer " + r.token
	for _, v := range md.Get("authorization") {
		if subtle.ConstantTimeCompare([]byte(v), []byte(want)) == 1 {
			return nil
		}
	}
	r.mu.Lock()
	r.reject++
	r.mu.Unlock()
	return status.Error(codes.Unauthenticated, "bad or missing bearer token")
}

var errDropped = errors.New("dropped by test")

// Conn is one attached worker.
type Conn struct {
	hello  *sandboxv1.Hello
	stream sandboxv1.SandboxWorker_AttachServer
	ctx    context.Context
	cancel context.CancelCauseFunc

	sendMu sync.Mutex

	mu         sync.Mutex
	calls      map[uint64]*Call
	stray      []*sandboxv1.WorkerFrame
	heartbeats int
}

// Hello is the worker's first frame.
func (c *Conn) Hello() *sandboxv1.Hello { return c.hello }

// Done is closed when the connection ends.
func (c *Conn) Done() <-chan struct{} { return c.ctx.Done() }

// Drop ends the Attach call with an Unavailable error, as a relay restart
// or network cut would.
func (c *Conn) Drop() { c.cancel(errDropped) }

// Heartbeats counts the heartbeats received so far.
func (c *Conn) Heartbeats() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heartbeats
}

// Stray returns frames that named no pending call: a worker answering
// twice, or after its terminal frame.
func (c *Conn) Stray() []*sandboxv1.WorkerFrame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*sandboxv1.WorkerFrame(nil), c.stray...)
}

// Exec sends an Exec frame and returns the call that collects its answer.
func (c *Conn) Exec(e *sandboxv1.Exec) (*Call, error) {
	call := &Call{ReqID: e.GetReqId(), notify: make(chan struct{}, 1)}
	c.mu.Lock()
	if old, ok := c.calls[call.ReqID]; ok && !old.ended() {
		c.mu.Unlock()
		return nil, ErrPending
	}
	c.calls[call.ReqID] = call
	c.mu.Unlock()
	if err := c.send(&sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Exec{Exec: e}}); err != nil {
		return nil, err
	}
	return call, nil
}

// Abort sends an Abort frame.
func (c *Conn) Abort(reqID uint64) error {
	return c.send(&sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Abort{Abort: &sandboxv1.Abort{ReqId: reqID}}})
}

func (c *Conn) send(f *sandboxv1.ServerFrame) error {
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.stream.Send(f); err != nil {
		return fmt.Errorf("relaytest: send: %w", err)
	}
	return nil
}

func (c *Conn) receive() {
	for {
		f, err := c.stream.Recv()
		if err != nil {
			c.cancel(err)
			c.mu.Lock()
			for _, call := range c.calls {
				call.close()
			}
			c.mu.Unlock()
			return
		}
		c.route(f)
	}
}

func (c *Conn) route(f *sandboxv1.WorkerFrame) {
	var id uint64
	switch {
	case f.GetHeartbeat() != nil:
		c.mu.Lock()
		c.heartbeats++
		c.mu.Unlock()
		return
	case f.GetChunk() != nil:
		id = f.GetChunk().GetReqId()
	case f.GetEnd() != nil:
		id = f.GetEnd().GetReqId()
	case f.GetExecError() != nil:
		id = f.GetExecError().GetReqId()
	default:
		c.mu.Lock()
		c.stray = append(c.stray, f)
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	call, ok := c.calls[id]
	if !ok || call.ended() {
		c.stray = append(c.stray, f)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	call.add(f)
}

// Call collects the frames the worker sends for one req_id.
type Call struct {
	ReqID uint64

	mu     sync.Mutex
	frames []*sandboxv1.WorkerFrame
	read   int
	term   bool
	closed bool
	notify chan struct{}
}

func (k *Call) add(f *sandboxv1.WorkerFrame) {
	k.mu.Lock()
	k.frames = append(k.frames, f)
	if f.GetEnd() != nil || f.GetExecError() != nil {
		k.term = true
	}
	k.mu.Unlock()
	k.wake()
}

func (k *Call) close() {
	k.mu.Lock()
	k.closed = true
	k.mu.Unlock()
	k.wake()
}

func (k *Call) wake() {
	select {
	case k.notify <- struct{}{}:
	default:
	}
}

func (k *Call) ended() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.term
}

// Next returns the next frame of this call (Chunk, End or ExecError).
func (k *Call) Next(ctx context.Context) (*sandboxv1.WorkerFrame, error) {
	for {
		k.mu.Lock()
		if k.read < len(k.frames) {
			f := k.frames[k.read]
			k.frames[k.read] = nil // a long stream must not pile up
			k.read++
			k.mu.Unlock()
			return f, nil
		}
		closed := k.closed
		k.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		select {
		case <-k.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Result is everything a call received.
type Result struct {
	Stdout, Stderr []byte
	// StdoutChunks and StderrChunks count the Chunk frames per stream.
	StdoutChunks, StderrChunks int
	// Exactly one of End and Error is set.
	End   *sandboxv1.End
	Error *sandboxv1.ExecError
}

// Wait reads the frames Next has not returned yet, up to the terminal one.
func (k *Call) Wait(ctx context.Context) (*Result, error) {
	res := &Result{}
	for {
		f, err := k.Next(ctx)
		if err != nil {
			return res, err
		}
		switch {
		case f.GetChunk() != nil:
			ch := f.GetChunk()
			if ch.GetStream() == sandboxv1.Stream_STDERR {
				res.Stderr = append(res.Stderr, ch.GetData()...)
				res.StderrChunks++
			} else {
				res.Stdout = append(res.Stdout, ch.GetData()...)
				res.StdoutChunks++
			}
		case f.GetEnd() != nil:
			res.End = f.GetEnd()
			return res, nil
		case f.GetExecError() != nil:
			res.Error = f.GetExecError()
			return res, nil
		}
	}
}

// WaitTimeout is Wait bounded by d, for tests.
func (k *Call) WaitTimeout(d time.Duration) (*Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return k.Wait(ctx)
}
