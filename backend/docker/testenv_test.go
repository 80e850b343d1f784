package docker

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// scripts/testenv.sh must not fail `make test` for a user who cannot
// start an engine: it says why and exits 0, and the Docker tests skip.
func TestTestenvWithoutEngineAsNonRootExitsZero(t *testing.T) {
	testenv.MustHaveRoot(t, "drops to an unprivileged user with setpriv")
	setpriv := testenv.MustHaveCommand(t, testenv.Root, "setpriv", "util-linux: runs the script as another user")
	// A copy the unprivileged user can read wherever the checkout is.
	body, err := os.ReadFile("../../scripts/testenv.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pulse-testenv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "testenv.sh")
	if err := os.WriteFile(script, body, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "bash", script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DOCKER_HOST=unix:///nonexistent/docker.sock", "HOME=/tmp"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("testenv.sh as nobody without an engine: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "not root") || !strings.Contains(string(out), "skip") {
		t.Fatalf("testenv.sh did not say why nothing was prepared:\n%s", out)
	}
}
