//go:build !linux

package host

import (
	"context"
	"fmt"

	"github.com/pulse-agent/pulse/backend"
)

// supported says Exec works on this system.
const supported = false

// Exec is available on Linux only: it relies on prlimit(2) and on waitid
// with WNOWAIT to kill a process group safely.
func (b *Backend) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	if req != nil {
		defer closeReader(req.Stdin)
	}
	return nil, fmt.Errorf("%w: host: only Linux is supported", backend.ErrUnavailable)
}

// treeBase and reconcileTrees: cgroups are Linux's.
func treeBase() string { return "" }

func reconcileTrees(string) error { return nil }

func trackingNote(string) string { return "commands run on Linux only" }
