//go:build !linux

package docker

import (
	"fmt"
	"net"

	"github.com/pulse-agent/pulse/backend"
)

// egressCapable is false off Linux: the engine runs in a virtual machine
// whose network namespaces this process cannot enter, so the allowlist is
// reported unsupported (Capabilities) and refused before a command runs.
func egressCapable() bool { return false }

func listenInNetns(int) (net.Listener, error) {
	return nil, fmt.Errorf("docker: entering a container's network namespace needs Linux: %w", backend.ErrUnsupported)
}

func listenInNetnsOn(int, string) (net.Listener, error) { return listenInNetns(0) }
