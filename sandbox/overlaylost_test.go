package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// A command that ran but whose writes the backend lost is audited as
// having run and returns its Result with backend.ErrOverlayLost; nothing
// is staged. The loss is real: a pulse-server (127.0.0.1) whose executor
// runs the host backend and reads back at most 4 bytes of changes.
func TestOverlayLostIsAuditedAsRun(t *testing.T) {
	rb := startRemote(t, hostBackend(t), 4, policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, secrets.AllowAllSecrets())
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
