package sandbox

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestGitOptionalLocksOffForCapturingBackends: a capturing backend's
// command gets GIT_OPTIONAL_LOCKS=0 (so a read-only git status stages no
// .git/index), unless its own Env says otherwise.
func TestGitOptionalLocksOffForCapturingBackends(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	be := &ovBackend{ov: &backend.Overlay{}}
	sb, err := New(context.Background(), ws, WithBackend(be))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	if got := be.req.Env["GIT_OPTIONAL_LOCKS"]; got != "0" {
		t.Errorf("GIT_OPTIONAL_LOCKS = %q, want 0", got)
	}
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"x"}, Env: map[string]string{"GIT_OPTIONAL_LOCKS": "1"}}); err != nil {
		t.Fatal(err)
	}
	if got := be.req.Env["GIT_OPTIONAL_LOCKS"]; got != "1" {
		t.Errorf("the command's own GIT_OPTIONAL_LOCKS = %q, want 1", got)
	}
}
