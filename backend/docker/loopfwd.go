package docker

import (
	"errors"
	"net"
	"syscall"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/bridge"
)

// forwardLoopback listens, in the network namespace of the container's
// process pid, on each loopback target of req's allowlist
// (backend.LoopbackForwards) and tunnels every connection to it through
// the proxy on sock, for clients that never use a proxy for a loopback
// address. A port another command of the same container forwards already
// is left to it (while that command runs). The listeners and their
// connections join rs, whose stop ends them.
func (b *Backend) forwardLoopback(rs *relays, pid int, req *backend.Request, sock string) {
	for _, target := range backend.LoopbackForwards(req.Network, 0) {
		l, err := listenInNetnsOn(pid, target)
		if err != nil {
			if !errors.Is(err, syscall.EADDRINUSE) {
				b.log.Warn("forwarding an allowed loopback port into the container", "target", target, "err", err)
			}
			continue
		}
		rs.serve(l, func(c net.Conn) { bridge.Tunnel(c, sock, target) })
	}
}
