package docker

import (
	"fmt"
	"net"
	"os"

	"github.com/pulse-agent/pulse/backend/internal/netns"
)

// egressCapable reports whether this process can bridge the proxy into a
// container: only root may enter the engine's network namespaces.
func egressCapable() bool { return os.Geteuid() == 0 }

// listenInNetns listens on 127.0.0.1 (a free port) in the network
// namespace of process pid (see backend/internal/netns for how the thread
// enters and comes back).
func listenInNetns(pid int) (net.Listener, error) { return listenInNetnsOn(pid, "127.0.0.1:0") }

// listenInNetnsOn listens on addr in the network namespace of pid.
func listenInNetnsOn(pid int, addr string) (net.Listener, error) {
	var l net.Listener
	var lerr error
	if err := netns.Do(pid, func() { l, lerr = net.Listen("tcp4", addr) }); err != nil {
		if l != nil {
			l.Close()
		}
		return nil, fmt.Errorf("the container's network namespace: %w", err)
	}
	return l, lerr
}
