package namespace

import (
	"context"
	"testing"

	"github.com/pulse-agent/pulse/egress/bypass"
)

// TestEgressBypassSuite runs every attack of the egress bypass suite in
// this backend's sandboxes: allowed destinations work through the proxy
// bridged into the empty network namespace, nothing else is reachable.
func TestEgressBypassSuite(t *testing.T) {
	b := newBackend(t)
	results, err := bypass.Run(context.Background(), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		switch {
		case r.Skipped != "":
			t.Logf("SKIP %s: %s", r.Name, r.Skipped)
		case !r.Held:
			t.Errorf("FAILED %s: %s", r.Name, r.Detail)
		default:
			t.Logf("held %s: %s", r.Name, r.Detail)
		}
	}
}
