package docker

import (
	"context"
	"testing"

	"github.com/pulse-agent/pulse/egress/bypass"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestDockerEgressBypassSuite runs every attack of the egress bypass suite
// in this backend's containers: network=none, with the proxy bridged into
// the container's namespace on 127.0.0.1.
func TestDockerEgressBypassSuite(t *testing.T) {
	testenv.MustHaveRoot(t, "the egress bridge enters the container's network namespace")
	b := newDocker(t)
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
