package sandbox

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// The session loop through a real pulse-server (internal/server on a
// 127.0.0.1 socket) whose executor is the namespace backend: the client
// uploads the workspace with the pending view over it, and the overlay
// comes back relative to that.
func TestSessionRemote(t *testing.T) {
	checkSession(t, newRemoteNamespace(t, WithPolicy(sessionPolicy(t))), 30)
}

// newRemoteNamespace opens a sandbox of a new workspace on the remote
// backend, through a real pulse-server on 127.0.0.1 whose executor is the
// namespace backend (no network, no secrets by default).
func newRemoteNamespace(t *testing.T, opts ...Option) *Sandbox {
	t.Helper()
	nb, err := namespace.New(namespace.WithStateDir(filepath.Join(t.TempDir(), "ns")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nb.Close() })
	testenv.MustHaveNamespace(t, nb.Probe)
	rb := startRemote(t, nb, 0, policy.DenyAllNetwork(), secrets.DenyAllSecrets())
	sb, err := New(context.Background(), t.TempDir(), append([]Option{withGetenv(noEnv), WithBackend(rb)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb
}
