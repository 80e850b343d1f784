package main

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/sandbox"
)

// TestDaemonHoldServesAWorkspacesSandboxToItsReviewOnly: in the daemon
// the review page takes the sandbox held for its workspace (no second
// store or audit writer), never that of another workspace, and a retired
// sandbox is closed by its last user.
func TestDaemonHoldServesAWorkspacesSandboxToItsReviewOnly(t *testing.T) {
	ws, other := t.TempDir(), t.TempDir()
	hold := newSandboxHold(time.Minute)
	defer hold.close()
	sb, release, err := hold.open("k", workspaceID(ws), func() (*sandbox.Sandbox, error) {
		return sandbox.New(t.Context(), ws, sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	})
	must(t, err)
	refs := func() int {
		hold.mu.Lock()
		defer hold.mu.Unlock()
		for _, e := range hold.held {
			if e.sb == sb {
				return e.refs
			}
		}
		return -1
	}
	env := &cliEnv{hold: hold, getenv: os.Getenv, stdout: io.Discard, stderr: io.Discard}
	r, done, err := openReview(t.Context(), env, ws, "s", nil)
	must(t, err)
	if n := refs(); n != 2 {
		t.Fatalf("the held sandbox has %d users with the review open, want 2 (the review shares it)", n)
	}
	if r.AuditPath() != sb.AuditPath() {
		t.Errorf("the review writes %s, the sandbox %s", r.AuditPath(), sb.AuditPath())
	}
	done()
	if got, _ := hold.lookup(workspaceID(other)); got != nil {
		t.Fatal("another workspace's review got the held sandbox")
	}
	if got, _ := hold.lookup(""); got != nil {
		t.Fatal("a workspace that cannot be told apart got a held sandbox")
	}
	hold.retire(sb)
	if got, _ := hold.lookup(workspaceID(ws)); got != nil {
		t.Fatal("a retired sandbox was handed out")
	}
	must(t, release())
	if _, err := sb.Execute(t.Context(), sandbox.Command{Args: []string{"true"}}); err == nil {
		t.Fatal("the retired sandbox still runs commands after its last user released it")
	}
}
