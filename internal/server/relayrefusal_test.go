package server

import (
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/protocol"
)

// A relay refuses a policy its workers cannot enforce and says how to
// allow the fleet.
func TestRelayRefusalSaysHowToAllowTheFleet(t *testing.T) {
	rh := startRelay(t)
	rh.startWorker(t, "refusal-worker", workerToken, "1")
	rh.waitWorkers(t, 1)
	c := rh.dial(tokenA)
	r := c.submit("deny-net", "true", map[string]any{"network": map[string]any{"mode": "deny-all"}})
	if r.Type != protocol.TypeError || r.str("code") != protocol.CodeUnsupported {
		t.Fatalf("deny-all network on the relay: %s", r.raw)
	}
	if msg := r.str("message"); !strings.Contains(msg, "--policy examples/fleet-policy.yaml") {
		t.Fatalf("the refusal does not say how to allow the fleet: %q", msg)
	}
}
