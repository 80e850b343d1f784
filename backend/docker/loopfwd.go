package docker

import (
	"errors"
	"net"
	"sync"
	"syscall"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/internal/bridge"
)

// forwardLoopback listens, in the network namespace of the container's
// process pid, on each loopback target of req's allowlist
// (backend.LoopbackForwards) and tunnels every connection to it through
// the proxy on sock, for clients that never use a proxy for a loopback
// address. A port another command of the same container forwards already
// is left to it (while that command runs). stop closes the listeners and
// the connections still open.
func (b *Backend) forwardLoopback(pid int, req *backend.Request, sock string) (stop func()) {
	targets := backend.LoopbackForwards(req.Network, 0)
	if len(targets) == 0 {
		return func() {}
	}
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	stopped := false
	var ls []net.Listener
	for _, target := range targets {
		l, err := listenInNetnsOn(pid, target)
		if err != nil {
			if !errors.Is(err, syscall.EADDRINUSE) {
				b.log.Warn("forwarding an allowed loopback port into the container", "target", target, "err", err)
			}
			continue
		}
		ls = append(ls, l)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				if stopped {
					mu.Unlock()
					c.Close()
					return
				}
				conns[c] = struct{}{}
				mu.Unlock()
				go func() {
					bridge.Tunnel(c, sock, target)
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
				}()
			}
		}()
	}
	return func() {
		for _, l := range ls {
			l.Close()
		}
		mu.Lock()
		stopped = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}
}
