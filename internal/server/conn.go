package server

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/protocol"
)

// outbox queues frames for one client without ever blocking the producer.
// Producers are executions publishing under their own lock, so a slow
// client must not stall them: past a byte budget the outbox gives up and
// the connection is closed; the client reattaches with after_seq and loses
// nothing.
type outbox struct {
	mu       sync.Mutex
	frames   [][]byte
	bytes    int
	limit    int
	closed   bool
	overflow bool
	notify   chan struct{}
}

func newOutbox(limit int) *outbox {
	return &outbox{limit: limit, notify: make(chan struct{}, 1)}
}

// push queues f and reports whether it was accepted.
func (o *outbox) push(f []byte) bool {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return false
	}
	if o.bytes+len(f) > o.limit {
		o.closed, o.overflow = true, true
		o.frames, o.bytes = nil, 0
		o.mu.Unlock()
		o.wake()
		return false
	}
	o.frames = append(o.frames, f)
	o.bytes += len(f)
	o.mu.Unlock()
	o.wake()
	return true
}

func (o *outbox) wake() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// take returns the queued frames, and whether the outbox overflowed.
func (o *outbox) take() ([][]byte, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f := o.frames
	o.frames, o.bytes = nil, 0
	return f, o.overflow
}

func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.wake()
}

// conn is one authenticated client connection.
type conn struct {
	s      *Server
	ws     *websocket.Conn
	tenant string
	out    *outbox
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	attached map[string]struct{} // executions this connection is subscribed to
	closing  bool
}

func (c *conn) track(id string) {
	c.mu.Lock()
	c.attached[id] = struct{}{}
	c.mu.Unlock()
}

// shutdown flushes what is queued and closes the connection normally.
func (c *conn) shutdown() {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.out.close()
}

func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) {
	tenant, ok := s.auth.check(r.Header.Get("Authorization"))
	if !ok {
		s.log.Warn("unauthorized connection attempt", "remote", r.RemoteAddr)
		s.m.unauthorized.Add(1)
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	if s.draining.Load() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	if r.Header.Get(protocol.HeaderDialExecution) != "" || r.Header.Get(protocol.HeaderDialPort) != "" {
		s.serveDial(w, r, tenant) // process.go
		return
	}
	// Origin checks defend cookie-authenticated endpoints against
	// cross-site pages; a browser cannot set the Authorization header on a
	// WebSocket handshake, so the bearer check above already excludes
	// them, and non-browser clients that send an Origin must not be
	// refused.
	if r.Header.Get(protocol.HeaderCapabilities) == protocol.CapabilitiesAsk {
		// The answer to the first request of almost every connection,
		// given before it is asked: one round trip less.
		a := s.capabilitiesAnswer()
		a["status"] = protocol.StatusCapabilities
		// An answer too large for a header (ErrHeaderTooLarge) is left
		// out: the client asks with the action then.
		if v, err := protocol.CapabilitiesHeader(a); err == nil {
			w.Header().Set(protocol.HeaderCapabilities, v)
		}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		s.log.Warn("websocket upgrade failed", "remote", r.RemoteAddr, "err", err)
		return
	}
	ws.SetReadLimit(s.o.maxMessage)
	// Not derived from the server's context: at shutdown the connection
	// must outlive the executions it watches, to deliver their results;
	// Shutdown closes it after that.
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{s: s, ws: ws, tenant: tenant, out: newOutbox(s.o.outboxBytes), ctx: ctx, cancel: cancel,
		attached: map[string]struct{}{}}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		ws.Close(websocket.StatusGoingAway, "server shutting down")
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	s.m.connections.Add(1)
	s.log.Debug("client connected", "tenant", tenant, "remote", r.RemoteAddr)

	writerDone := make(chan struct{})
	go c.writeLoop(writerDone)
	go c.pingLoop()
	c.readLoop()

	// Detach but never cancel: an execution outlives the connection that
	// started it, and a client reattaches with after_seq.
	c.mu.Lock()
	ids := make([]string, 0, len(c.attached))
	for id := range c.attached {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	s.mu.Lock()
	for _, id := range ids {
		if e := s.active[id]; e != nil {
			defer e.detach(c)
		}
	}
	delete(s.conns, c)
	s.mu.Unlock()
	c.out.close()
	cancel()
	<-writerDone
	ws.CloseNow()
	s.m.connections.Add(-1)
	s.log.Debug("client disconnected", "tenant", tenant)
}

func (c *conn) readLoop() {
	for {
		typ, data, err := c.ws.Read(c.ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageText {
			c.out.push(protocol.ErrorFrame("", protocol.MsgInvalid, protocol.CodeInvalid))
			continue
		}
		c.handle(data)
	}
}

func (c *conn) writeLoop(done chan struct{}) {
	defer close(done)
	for {
		frames, overflow := c.out.take()
		for _, f := range frames {
			wctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
			err := c.ws.Write(wctx, websocket.MessageText, f)
			cancel()
			if err != nil {
				c.cancel()
				return
			}
		}
		if overflow {
			c.s.log.Warn("client too slow, disconnecting", "tenant", c.tenant)
			c.ws.Close(websocket.StatusPolicyViolation, "outbox full: reattach with after_seq")
			c.cancel()
			return
		}
		c.out.mu.Lock()
		closed, empty := c.out.closed, len(c.out.frames) == 0
		c.out.mu.Unlock()
		if closed && empty {
			c.mu.Lock()
			graceful := c.closing
			c.mu.Unlock()
			if graceful {
				c.ws.Close(websocket.StatusGoingAway, "server shutting down")
			}
			c.cancel()
			return
		}
		select {
		case <-c.out.notify:
		case <-c.ctx.Done():
			return
		}
	}
}

func (c *conn) pingLoop() {
	if c.s.o.pingInterval <= 0 {
		return
	}
	t := time.NewTicker(c.s.o.pingInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(c.ctx, c.s.o.pingInterval)
			err := c.ws.Ping(pctx)
			cancel()
			if err != nil && !errors.Is(err, context.Canceled) {
				c.s.log.Info("client ping failed, disconnecting", "tenant", c.tenant, "err", err)
				c.cancel()
				return
			}
		}
	}
}
