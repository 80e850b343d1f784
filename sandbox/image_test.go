package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/policy"
)

// TestWithImageRunsOnlyOnDocker: an image asked for is never silently
// dropped by running on a backend that has no images.
func TestWithImageRunsOnlyOnDocker(t *testing.T) {
	_, err := New(context.Background(), t.TempDir(), WithImage("pulse-sandbox:latest"), WithBackendName("namespace"))
	if err == nil || !strings.Contains(err.Error(), "only on the docker backend") {
		t.Fatalf("WithImage with the namespace backend: %v", err)
	}
	if _, err := New(context.Background(), t.TempDir(), WithImage(" ")); err == nil {
		t.Fatal("WithImage of a blank reference accepted")
	}
}

// TestImageFromPolicyOrOption: WithImage wins over the policy's image:,
// which wins over the backend's own default.
func TestImageFromPolicyOrOption(t *testing.T) {
	p, err := policy.Parse([]byte("image: from-policy:1\n"))
	if err != nil {
		t.Fatal(err)
	}
	o, err := buildOptions([]Option{WithPolicy(p)})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.dockerImage(); got != "from-policy:1" {
		t.Errorf("policy image: %q", got)
	}
	o, err = buildOptions([]Option{WithPolicy(p), WithImage("from-option:2")})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.dockerImage(); got != "from-option:2" {
		t.Errorf("option over policy: %q", got)
	}
	o, err = buildOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.dockerImage(); got != "" {
		t.Errorf("no image asked for: %q", got)
	}
}
