package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
)

// ErrPortNotExposed: Expose was asked for a port the policy does not list
// (network: {expose: [...]}). It is also ErrPolicyDenied; the error is an
// *ExposeError.
var ErrPortNotExposed = errors.New("sandbox: port not listed in the policy's network.expose")

// ExposeError is Expose's refusal of a port.
type ExposeError struct {
	Port int
}

func (e *ExposeError) Error() string {
	return fmt.Sprintf("sandbox: expose port %d: the policy does not list it in network.expose", e.Port)
}

// Unwrap makes the error both ErrPortNotExposed and ErrPolicyDenied.
func (e *ExposeError) Unwrap() []error { return []error{ErrPortNotExposed, ErrPolicyDenied} }

// exposeTable is the sandbox's forwarded ports.
type exposeTable struct {
	mu     sync.Mutex
	byPort map[int]*forwarder
	closed bool
}

// forwarder listens on the host's loopback and relays each connection to
// the port inside the sandbox.
type forwarder struct {
	s    *Sandbox
	port int
	ln   net.Listener
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// Expose makes the TCP port a process of the sandbox listens on (on the
// loopback address of the sandbox's own network) reachable from the
// host at the address it returns, on 127.0.0.1. Only ports the policy
// lists in network.expose — as a port, or within a range FROM-TO
// (NetworkPolicy.ExposeRanges) — are exposed, in any network mode
// (deny-all included): another port is refused with an *ExposeError
// (ErrPortNotExposed, ErrPolicyDenied). Both the exposure and a refusal
// are audited.
//
// Each connection to the address is relayed to the newest live process
// (see Start) that accepts one on that port; with none, the connection
// is closed. Exposing a port again returns the same address. The address
// stays open until the sandbox closes; ctx bounds only the set-up. A
// backend that cannot reach into its sandboxes' network fails the
// connections, not Expose (see backend.Process.DialPort).
func (s *Sandbox) Expose(ctx context.Context, port int) (string, error) {
	addr, err := s.expose(ctx, port)
	return addr, s.scrubErr(err)
}

func (s *Sandbox) expose(ctx context.Context, port int) (string, error) {
	if err := s.enter(); err != nil {
		return "", err
	}
	defer s.running.Done()
	target := "127.0.0.1:" + strconv.Itoa(port)
	if port < 1 || port > 65535 || s.o.network == nil || !s.o.network.Exposes(port) {
		s.record(ctx, audit.Event{Action: "expose", Target: target, Destination: target, Protocol: "tcp", Decision: "deny",
			Backend: s.backend.Name(), Detail: "port not listed in the policy's network.expose"})
		return "", &ExposeError{Port: port}
	}
	if _, ok := s.backend.(backend.Starter); !ok {
		s.record(ctx, audit.Event{Action: "expose", Target: target, Protocol: "tcp", Decision: "deny",
			Backend: s.backend.Name(), Detail: "backend runs no background processes"})
		return "", fmt.Errorf("%w: backend %q runs no background processes to expose a port of", ErrUnsupported, s.backend.Name())
	}
	t := &s.exposed
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", errClosed
	}
	if f := t.byPort[port]; f != nil {
		return f.ln.Addr().String(), nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("sandbox: expose port %d: %w", port, err)
	}
	f := &forwarder{s: s, port: port, ln: ln, conns: map[net.Conn]struct{}{}}
	if t.byPort == nil {
		t.byPort = map[int]*forwarder{}
	}
	t.byPort[port] = f
	addr := ln.Addr().String()
	s.record(ctx, audit.Event{Action: "expose", Target: target, Destination: addr, Protocol: "tcp", Decision: "allow",
		Backend: s.backend.Name(), Detail: fmt.Sprintf("sandbox port %d reachable at %s on the host", port, addr)})
	f.wg.Add(1)
	go f.serve()
	return addr, nil
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(c)
			f.relay(c)
		}()
	}
}

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

// relay connects c to the port in the newest live process that accepts,
// and copies both ways until either side is done.
func (f *forwarder) relay(c net.Conn) {
	ps := f.s.Processes()
	var in net.Conn
	var last error
	for i := len(ps) - 1; i >= 0 && in == nil; i-- {
		var err error
		if in, err = ps[i].bp.DialPort(context.Background(), f.port); err != nil {
			in, last = nil, err
		}
	}
	if in == nil {
		f.s.log.Debug("expose: no process accepts the connection", "port", f.port, "err", last)
		return
	}
	defer in.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(in, c)
	go pipe(c, in)
	<-done
	<-done
}

// close stops listening and cuts the relayed connections.
func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}

// closeExposed ends every forwarder (Close).
func (s *Sandbox) closeExposed() {
	t := &s.exposed
	t.mu.Lock()
	t.closed = true
	fs := t.byPort
	t.byPort = nil
	t.mu.Unlock()
	for _, f := range fs {
		f.close()
	}
}
