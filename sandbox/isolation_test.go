package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

func strongPolicy() *policy.Policy {
	p := policy.Default()
	p.Isolation = policy.IsolationStrong
	return p
}

// TestIsolationStrongRefusesDowngrade: a policy asking for isolation:
// strong is never run on a backend that shares the host kernel, whether
// it was passed in or named; the refusal is ErrIsolationDowngrade, of
// class ErrUnsupportedPolicy.
func TestIsolationStrongRefusesDowngrade(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		opts []Option
	}{
		{"passed in", []Option{WithBackend(hostBackend(t)), WithUnsafeHostExecution()}},
		{"named host", []Option{WithBackendName("host"), WithUnsafeHostExecution()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sb, err := New(ctx, t.TempDir(), append(tt.opts, WithPolicy(strongPolicy()))...)
			if err == nil {
				sb.Close()
				t.Fatal("New ran a strong-isolation policy on the host backend")
			}
			if !errors.Is(err, ErrIsolationDowngrade) || !errors.Is(err, ErrUnsupportedPolicy) {
				t.Fatalf("New = %v; want ErrIsolationDowngrade", err)
			}
		})
	}
}

// TestIsolationStrongSelectsOnlyStrong: unnamed, a strong policy tries
// only backends of strong isolation: New gets gvisor, or fails naming
// gvisor alone, never falling back to another backend.
func TestIsolationStrongSelectsOnlyStrong(t *testing.T) {
	sb, err := New(context.Background(), t.TempDir(), WithPolicy(strongPolicy()), WithUnsafeHostExecution())
	if err == nil {
		defer sb.Close()
		if got := sb.backend.Capabilities().Isolation; got != backend.IsolationGVisor {
			t.Fatalf("selected %s (isolation %s) for isolation: strong", sb.backend.Name(), got)
		}
		return
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("New = %v; want a gvisor backend or UnavailableError", err)
	}
	for _, l := range ue.Tried {
		if !strings.HasPrefix(l, "gvisor:") {
			t.Errorf("selection for isolation: strong tried %q", l)
		}
	}
}

// TestTriesStrongOnlyWhenAsked: without the policy asking, selection
// never tries a strong-isolation driver unnamed; with it, only those.
func TestTriesStrongOnlyWhenAsked(t *testing.T) {
	strong := backend.Driver{Name: "gvisor", StrongIsolation: true}
	plain := backend.Driver{Name: "namespace"}
	for _, tt := range []struct {
		name              string
		o                 options
		strongOK, plainOK bool
	}{
		{"auto", options{}, false, true},
		{"auto strong", options{policy: strongPolicy()}, true, false},
		{"named gvisor", options{backendName: "gvisor"}, true, false},
		{"named namespace strong", options{backendName: "namespace", policy: strongPolicy()}, false, true},
	} {
		if got := tt.o.tries(strong); got != tt.strongOK {
			t.Errorf("%s: tries(gvisor) = %v", tt.name, got)
		}
		if got := tt.o.tries(plain); got != tt.plainOK {
			t.Errorf("%s: tries(namespace) = %v", tt.name, got)
		}
	}
}
