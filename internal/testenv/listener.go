package testenv

import (
	"net"
	"sync"
)

// Listener is a net.Listener that remembers the connections it accepted,
// so that a test can cut them all at once — a crash, a lost route — while
// the server behind it runs on. (http.Server.Close leaves hijacked
// connections such as WebSockets open.)
type Listener struct {
	net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	accepted int
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.accepted++
		l.mu.Unlock()
	}
	return c, err
}

// DropAll closes every connection accepted so far and returns how many
// there were.
func (l *Listener) DropAll() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	n := len(l.conns)
	l.conns = nil
	return n
}

// Accepted is how many connections were accepted so far, dropped ones
// included.
func (l *Listener) Accepted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accepted
}
