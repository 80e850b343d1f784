package sandbox

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/backend/remote"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// The session loop through a real pulse-server (internal/server on a
// 127.0.0.1 socket) whose executor is the namespace backend: the client
// uploads the workspace with the pending view over it, and the overlay
// comes back relative to that.
func TestSessionRemote(t *testing.T) {
	nb, err := namespace.New(namespace.WithStateDir(filepath.Join(t.TempDir(), "ns")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nb.Close() })
	// The namespace backend is the server's executor here.
	testenv.MustHaveNamespace(t, nb.Probe)
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "db.sqlite3"))
	if err != nil {
		t.Fatal(err)
	}
	const token = "session-remote-test-token"
	srv, err := server.New(context.Background(), server.NewLocal(nb, 0, nil), st,
		server.WithTokens(token), server.WithWorkspaceRoot(filepath.Join(dir, "workspaces")),
		server.WithDefaultPolicies(policy.DenyAllNetwork(), secrets.DenyAllSecrets()))
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
		st.Close()
	})
	rb, err := remote.New(remote.WithURL("ws://"+ln.Addr().String()+"/"), remote.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rb.Close() })
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rb.Probe(pctx); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	sb, err := New(context.Background(), t.TempDir(), withGetenv(noEnv), WithBackend(rb), WithPolicy(sessionPolicy(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	checkSession(t, sb, 30)
}
