package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// Process submissions (protocol.FeatureProcess): the command is started
// with a handle, so that while it runs a client can write its input
// (stdin), signal it, resize its terminal and dial ports inside its
// sandbox. Each of these is scoped to the tenant that submitted it, as
// every action is: another tenant's execution answers NOT_FOUND.

// errNotStarted: a process submission whose command does not run yet.
var errNotStarted = errors.New("the process has not started")

// newProcessState is the state of a process submission under network.
func newProcessState(network policy.NetworkPolicy) *processState {
	pr, pw := io.Pipe()
	return &processState{network: network, stdin: &stdinFeed{w: pw}, stdinR: pr}
}

// processState is what a process submission keeps besides an
// execution's.
type processState struct {
	// network is the execution's network policy: its expose list bounds
	// the ports a dial may reach.
	network policy.NetworkPolicy
	stdin   *stdinFeed
	stdinR  *io.PipeReader

	mu   sync.Mutex
	proc backend.Process // set once the command runs
}

func (ps *processState) handle() (backend.Process, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.proc == nil {
		return nil, errNotStarted
	}
	return ps.proc, nil
}

// features lists what this server honours: protocol.Features, and the
// process features when its executor can.
func (s *Server) features() []string {
	f := append([]string(nil), protocol.Features...)
	if ps, ok := s.exec.(ProcessStarter); ok && ps.StartsProcesses() {
		f = append(f, protocol.FeatureProcess, protocol.FeatureDial)
		if ps.StartsTerminals() {
			f = append(f, protocol.FeatureTTY)
		}
	}
	return f
}

// processRefusal says why a process submission cannot run here, "" when
// it can.
func (s *Server) processRefusal(req *protocol.SubmitRequest) string {
	if !req.Process {
		return ""
	}
	ps, ok := s.exec.(ProcessStarter)
	if !ok || !ps.StartsProcesses() {
		return fmt.Sprintf("executor %s runs no processes with a handle", s.exec.Name())
	}
	if req.TTY != nil && !ps.StartsTerminals() {
		return fmt.Sprintf("executor %s makes no terminals", s.exec.Name())
	}
	return ""
}

// startProcess runs a process submission's command to its end, as Exec
// would. ack is called once: with nil as soon as the command runs, or
// with the error that kept it from starting.
func (s *Server) startProcess(ctx context.Context, e *execution, req *backend.Request, ack func(error)) (*backend.Result, error) {
	ps := s.exec.(ProcessStarter) // checked by submit (processRefusal)
	req.Stdin = e.proc.stdinR
	// Blocked stdin writers return once the command is over.
	defer e.proc.stdinR.CloseWithError(backend.ErrProcessDone)
	p, err := ps.Start(ctx, req)
	if err != nil {
		ack(err)
		return nil, err
	}
	e.proc.mu.Lock()
	e.proc.proc = p
	e.proc.mu.Unlock()
	ack(nil)
	return p.Wait()
}

// ackProcess answers a process submission on c: STARTING, then the
// events printed meanwhile, and c subscribed — under the execution's
// lock, so that every event follows the acknowledgement exactly once —
// or, when the command did not start, an error frame with its class.
func (e *execution) ackProcess(c *conn, requestID string, starting []byte, err error) {
	if err != nil {
		msg := protocol.MsgInternal
		if errors.Is(err, backend.ErrUnsupported) || errors.Is(err, backend.ErrInvalidRequest) {
			msg = err.Error()
		}
		c.out.push(protocol.ErrorFrame(requestID, msg, protocol.CodeOf(err)))
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.subs == nil || !c.out.push(starting) || len(e.subs) > 0 {
		// The submitter went away, and may have reattached on another
		// connection already: that one follows the execution.
		return
	}
	for _, ev := range e.events {
		c.out.push(ev.frame)
	}
	e.subs[c] = struct{}{}
}

// stdinFeed is a process's standard input: the bytes received so far,
// written to the command's stdin pipe in order.
type stdinFeed struct {
	// busy is held while one request writes; a second is refused rather
	// than queued, so a command that does not read cannot pile up
	// goroutines and buffers.
	busy     sync.Mutex
	w        *io.PipeWriter
	received int64 // only under busy
	closed   bool  // only under busy
}

var (
	errStdinBusy   = errors.New("stdin busy")
	errStdinClosed = errors.New("stdin closed")
)

// write delivers what r holds beyond what was received already, and
// closes the input at r's end when r says EOF. It returns the count
// received.
func (f *stdinFeed) write(r *protocol.StdinRequest) (int64, error) {
	if !f.busy.TryLock() {
		return 0, errStdinBusy
	}
	defer f.busy.Unlock()
	if r.Offset > f.received {
		return f.received, fmt.Errorf("stdin offset %d is past the %d bytes received: %w", r.Offset, f.received, protocol.ErrInvalid)
	}
	data := r.Data
	if skip := f.received - r.Offset; skip < int64(len(data)) {
		data = data[skip:]
	} else {
		data = nil
	}
	if len(data) > 0 && f.closed {
		return f.received, errStdinClosed
	}
	if len(data) > 0 {
		n, err := f.w.Write(data)
		f.received += int64(n)
		if err != nil {
			return f.received, backend.ErrProcessDone
		}
	}
	if r.EOF && !f.closed && r.Offset+int64(len(r.Data)) == f.received {
		f.closed = true
		f.w.Close()
	}
	return f.received, nil
}

// process finds the process submission of the payload's execution for
// one of the process actions, answering for it (and returning nil) when
// there is none to act on.
func (c *conn) process(ctx context.Context, requestID, id string) (*execution, backend.Process) {
	e := c.live(ctx, requestID, id, protocol.MsgNotFound)
	if e == nil {
		return nil, nil
	}
	if e.proc == nil {
		c.out.push(protocol.ErrorFrame(requestID, protocol.MsgNotProcess, protocol.CodeUnsupported))
		return nil, nil
	}
	p, err := e.proc.handle()
	if err != nil {
		c.out.push(protocol.ErrorFrame(requestID, "Execution is not running: "+protocol.StatusStarting, protocol.CodeNotRunning))
		return nil, nil
	}
	return e, p
}

// answerProcessErr answers a process action that the backend refused.
func (c *conn) answerProcessErr(requestID, action string, e *execution, err error) {
	switch {
	case errors.Is(err, backend.ErrProcessDone):
		c.out.push(protocol.ErrorFrame(requestID, "Execution is not running: "+protocol.StatusCompleted, protocol.CodeNotRunning))
	case errors.Is(err, backend.ErrUnsupported):
		c.out.push(protocol.ErrorFrame(requestID, err.Error(), protocol.CodeUnsupported))
	default:
		c.s.log.Error("process action failed", "action", action, "execution_id", e.id, "err", err)
		c.out.push(protocol.ErrorFrame(requestID, protocol.MsgInternal, protocol.CodeInternal))
	}
}

func (c *conn) signal(ctx context.Context, m *protocol.Message) error {
	r, err := protocol.ParseSignal(m.Payload)
	if err != nil {
		return err
	}
	c.act(ctx, m, r.ExecutionID, protocol.StatusSignalled, func(e *execution, p backend.Process) error {
		err := p.Signal(r.Signal)
		if err == nil {
			c.s.log.Info("process signalled", "execution_id", e.id, "tenant", c.tenant, "signal", r.Signal.String())
		}
		return err
	})
	return nil
}

func (c *conn) resize(ctx context.Context, m *protocol.Message) error {
	r, err := protocol.ParseResize(m.Payload)
	if err != nil {
		return err
	}
	c.act(ctx, m, r.ExecutionID, protocol.StatusResized, func(_ *execution, p backend.Process) error {
		return p.Resize(r.Rows, r.Cols)
	})
	return nil
}

// act does one thing to a running process and answers status, or why it
// could not.
func (c *conn) act(ctx context.Context, m *protocol.Message, id, status string, do func(*execution, backend.Process) error) {
	e, p := c.process(ctx, m.RequestID, id)
	if p == nil {
		return
	}
	if err := do(e, p); err != nil {
		c.answerProcessErr(m.RequestID, m.Action, e, err)
		return
	}
	c.out.push(protocol.ResponseFrame(m.RequestID, status, map[string]any{"execution_id": e.id}))
}

// stdin writes input to a process. The write waits for the command to
// read it, so it runs beside the connection's read loop, and the reply
// comes once the bytes are in the pipe.
func (c *conn) stdin(ctx context.Context, m *protocol.Message) error {
	r, err := protocol.ParseStdin(m.Payload)
	if err != nil {
		return err
	}
	e, p := c.process(ctx, m.RequestID, r.ExecutionID)
	if p == nil {
		return nil
	}
	go func() {
		n, err := e.proc.stdin.write(r)
		switch {
		case err == nil:
			c.out.push(protocol.ResponseFrame(m.RequestID, protocol.StatusStdin, map[string]any{"execution_id": e.id, "received": n}))
		case errors.Is(err, errStdinBusy):
			c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgBusy, protocol.CodeBusy))
		case errors.Is(err, errStdinClosed):
			c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgStdinEnded, protocol.CodeInvalid))
		case errors.Is(err, protocol.ErrInvalid):
			c.out.push(protocol.ErrorFrame(m.RequestID, protocol.MsgInvalid, protocol.CodeInvalid))
		default:
			c.answerProcessErr(m.RequestID, m.Action, e, err)
		}
	}()
	return nil
}

// dialTimeout bounds the connection to a port inside a sandbox.
const dialTimeout = 10 * time.Second

// serveDial answers a dial (protocol.HeaderDialExecution): it connects
// to the port inside the tenant's running process submission, then
// upgrades and relays the connection's bytes in binary messages. A dial
// refused before the upgrade is an HTTP error whose JSON body carries
// the code.
func (s *Server) serveDial(w http.ResponseWriter, r *http.Request, tenant string) {
	s.m.action("dial")
	refuse := func(status int, code, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(protocol.ErrorFrame("", msg, code))
	}
	id, port, err := protocol.ParseDial(r.Header.Get(protocol.HeaderDialExecution), r.Header.Get(protocol.HeaderDialPort))
	if err != nil {
		refuse(http.StatusBadRequest, protocol.CodeInvalid, protocol.MsgInvalid)
		return
	}
	e := s.lookup(id, tenant)
	if e == nil {
		refuse(http.StatusNotFound, protocol.CodeNotFound, protocol.MsgNotFound)
		return
	}
	if e.proc == nil {
		refuse(http.StatusConflict, protocol.CodeUnsupported, protocol.MsgNotProcess)
		return
	}
	if !e.proc.network.Exposes(port) {
		s.log.Warn("dial to a port the execution does not expose refused", "execution_id", id, "tenant", tenant, "port", port)
		refuse(http.StatusForbidden, protocol.CodeNotExposed, protocol.MsgNotExposed)
		return
	}
	p, err := e.proc.handle()
	if err != nil {
		refuse(http.StatusConflict, protocol.CodeNotRunning, "Execution is not running: "+protocol.StatusStarting)
		return
	}
	dctx, cancel := context.WithTimeout(r.Context(), dialTimeout)
	nc, err := p.DialPort(dctx, port)
	cancel()
	switch {
	case errors.Is(err, backend.ErrProcessDone):
		refuse(http.StatusConflict, protocol.CodeNotRunning, "Execution is not running: "+protocol.StatusCompleted)
		return
	case errors.Is(err, backend.ErrUnsupported):
		refuse(http.StatusNotImplemented, protocol.CodeUnsupported, err.Error())
		return
	case err != nil:
		s.log.Info("dial into the sandbox failed", "execution_id", id, "tenant", tenant, "port", port, "err", err)
		refuse(http.StatusBadGateway, protocol.CodeDialFailed, protocol.MsgDialFailed)
		return
	}
	defer nc.Close()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		s.log.Warn("websocket upgrade failed", "remote", r.RemoteAddr, "err", err)
		return
	}
	defer ws.CloseNow()
	s.log.Info("port dialled", "execution_id", id, "tenant", tenant, "port", port, "remote", r.RemoteAddr)
	// The relay ends with the process, and at shutdown.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		select {
		case <-e.done:
		case <-s.ctx.Done():
		case <-ctx.Done():
		}
		stop()
		nc.Close()
	}()
	pipeBoth(websocket.NetConn(ctx, ws, websocket.MessageBinary), nc)
}

// pipeBoth copies both ways between a and b until both directions are done:
// a side that ends its output half-closes the other when it can.
func pipeBoth(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(b, a)
		if cw, ok := b.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			b.Close()
		}
	}()
	io.Copy(a, b)
	a.Close()
	<-done
}
