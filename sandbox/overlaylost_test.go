package sandbox

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/backend/remote"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// A command that ran but whose writes the backend lost is audited as
// having run and returns its Result with backend.ErrOverlayLost; nothing
// is staged. The loss is real: a pulse-server (127.0.0.1) whose executor
// runs the host backend and reads back at most 4 bytes of changes.
func TestOverlayLostIsAuditedAsRun(t *testing.T) {
	hb, err := host.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hb.Close() })
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "db.sqlite3"))
	if err != nil {
		t.Fatal(err)
	}
	const token = "overlay-lost-test-token"
	srv, err := server.New(context.Background(), server.NewLocal(hb, 4, nil), st,
		server.WithTokens(token), server.WithWorkspaceRoot(filepath.Join(dir, "workspaces")),
		server.WithDefaultPolicies(policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, secrets.AllowAllSecrets()))
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
	if err := rb.Probe(context.Background()); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	// The server's executor runs on the bare host, so only allow-all
	// network and secrets are enforced (strongly) there.
	pol, err := policy.Parse([]byte("version: 1\ndefaults: {shell: allow, network: allow, secrets: allow}\nnetwork: {mode: allow-all}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackend(rb), WithPolicy(pol), WithSecretPolicy(secrets.AllowAllSecrets()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })

	res, err := sb.Execute(context.Background(), Command{Shell: "echo ran; echo 0123456789 > lost.txt; exit 3"})
	if !errors.Is(err, backend.ErrOverlayLost) {
		t.Fatalf("error %v; want backend.ErrOverlayLost", err)
	}
	if res == nil || res.ExitCode != 3 || res.Stdout != "ran\n" || res.Transaction != "" {
		t.Fatalf("result %+v; want exit 3, its output and no transaction", res)
	}
	if _, err := os.Stat(filepath.Join(ws, "lost.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the lost write reached the workspace: %v", err)
	}
	var ran bool
	for _, e := range reviewEvents(t, ws)["shell"] {
		if e.Decision == "allow" && e.ExitCode != nil && *e.ExitCode == 3 && strings.Contains(e.Detail, "writes were lost") {
			ran = true
		}
		if e.Decision == "deny" {
			t.Errorf("the command that ran was audited as refused: %+v", e)
		}
	}
	if !ran {
		t.Fatal("no audit event records the command as run with its writes lost")
	}
}
