package docker

import (
	"net"
	"sync"
)

// relays are the listeners a command's egress bridge opens inside its
// container's network namespace and the connections they relay. The
// container outlives the command: stop closes the listeners and every
// connection a leftover process still holds open, so none is left
// relaying after the command.
type relays struct {
	mu      sync.Mutex
	ls      []net.Listener
	conns   map[net.Conn]struct{}
	stopped bool
}

// serve accepts on l until it is closed, handing each connection to relay
// (which returns when the connection is done).
func (r *relays) serve(l net.Listener, relay func(net.Conn)) {
	r.mu.Lock()
	r.ls = append(r.ls, l)
	if r.conns == nil {
		r.conns = map[net.Conn]struct{}{}
	}
	r.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			if r.stopped {
				r.mu.Unlock()
				c.Close()
				return
			}
			r.conns[c] = struct{}{}
			r.mu.Unlock()
			go func() {
				relay(c)
				r.mu.Lock()
				delete(r.conns, c)
				r.mu.Unlock()
			}()
		}
	}()
}

// stop closes the listeners and the connections still open.
func (r *relays) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, l := range r.ls {
		l.Close()
	}
	for c := range r.conns {
		c.Close()
	}
}
