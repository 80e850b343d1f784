package sandbox

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/remote"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// startRemote serves a real pulse-server on a 127.0.0.1 socket whose
// executor is exec (reading back at most maxOverlay bytes of changes; 0 is
// the server's default), with the given default policies, and returns a
// probed remote backend connected to it. Everything is closed with t.
func startRemote(t *testing.T, exec backend.Backend, maxOverlay int64, net0 policy.NetworkPolicy, sec secrets.Policy) *remote.Backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startRemoteOn(t, ln, exec, maxOverlay, net0, sec)
}

// startRemoteOn is startRemote serving on ln.
func startRemoteOn(t *testing.T, ln net.Listener, exec backend.Backend, maxOverlay int64, net0 policy.NetworkPolicy, sec secrets.Policy) *remote.Backend {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "db.sqlite3"))
	if err != nil {
		t.Fatal(err)
	}
	const token = "sandbox-remote-test-token"
	srv, err := server.New(context.Background(), server.NewLocal(exec, maxOverlay, nil), st,
		server.WithTokens(token), server.WithWorkspaceRoot(filepath.Join(dir, "workspaces")),
		server.WithDefaultPolicies(net0, sec))
	if err != nil {
		st.Close()
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
	return rb
}
