package runner

import (
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
)

// TestHostConformance runs the backend conformance suite on the host
// backend exactly as New configures it for the worker (shell, wait delay,
// logger): every process-group, cgroup, stdin, timeout and cancellation
// promise Run relies on is that backend's, so it is checked here in the
// form the worker runs it.
func TestHostConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		r := needBash(t)
		return r.host
	})
}
