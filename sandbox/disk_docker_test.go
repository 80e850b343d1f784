package sandbox

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// dockerWithPolicy is a sandbox on a Docker backend the facade makes
// itself, so that the policy's limits become its container's.
func dockerWithPolicy(t *testing.T, ws, yaml string) *Sandbox {
	t.Helper()
	newDockerSandbox(t, t.TempDir()).Close() // skips without Docker
	p, err := policy.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackendName("docker"), WithPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb
}

// TestDockerLargeFileUnderSmallMemoryLimit: a command that writes more
// than the container's memory holds, and a small file beside it, fills
// the container's workspace space (half its memory, no disk_bytes being
// set), which the kernel refuses with ENOSPC; the result names the limit
// and what it wrote is staged. The container's files are on tmpfs,
// charged to its memory: the scratch used to be larger than the memory,
// the wrapper copied what changed twice more on it, was OOM-killed
// reading it back, and every write was lost with "was the container
// removed?".
func TestDockerLargeFileUnderSmallMemoryLimit(t *testing.T) {
	ws := t.TempDir()
	sb := dockerWithPolicy(t, ws, "version: 1\ndefaults: {shell: allow, write: allow}\nlimits: {memory_bytes: 96MiB}\n")
	res, err := sb.Execute(context.Background(), Command{Shell: `echo small > small.txt; head -c 150000000 /dev/zero > big; echo "rc=$?"`})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if res.Termination != backend.DiskLimit || !strings.Contains(res.Stdout, "rc=1") {
		t.Fatalf("termination %s, exit %d, stdout %q, want disk_limit; stderr %q", res.Termination, res.ExitCode, res.Stdout, res.Stderr)
	}
	if !strings.Contains(res.Stderr, "half of limits.memory_bytes") || !strings.Contains(res.Stderr, "raise limits.disk_bytes") {
		t.Errorf("stderr does not name the limit and how to raise it: %q", res.Stderr)
	}
	if !slices.Contains(res.Staged, "small.txt") || !slices.Contains(res.Staged, "big") {
		t.Fatalf("staged %v, refused %v; want small.txt and what was written of big", res.Staged, res.Refused)
	}
	if big, err := sb.ReadFile(context.Background(), "big"); err != nil || len(big) == 0 || len(big) >= 48<<20 {
		t.Fatalf("big: %d bytes, %v; want what fit in half of 96 MiB", len(big), err)
	}
}

// TestDockerDiskLimitNamedAndWritesKept: limits.disk_bytes bounds what
// the container's commands may write, as they write: a command that
// writes past it gets the kernel's ENOSPC, its result says disk_limit and
// how to raise it, and what it wrote up to the bound is staged, the
// small file beside it too. The next command runs on a container whose
// baseline is still what the workspace and the stack hold.
func TestDockerDiskLimitNamedAndWritesKept(t *testing.T) {
	ws := t.TempDir()
	if err := os.WriteFile(ws+"/kept.txt", []byte("in the workspace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := dockerWithPolicy(t, ws, "version: 1\ndefaults: {shell: allow, write: allow}\nlimits: {disk_bytes: 32MiB}\n")
	ctx := context.Background()
	res, err := sb.Execute(ctx, Command{Shell: `echo small > small.txt; head -c 200000000 /dev/zero > big; echo "rc=$?"`})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if res.Termination != backend.DiskLimit || !strings.Contains(res.Stdout, "rc=1") {
		t.Fatalf("termination %s, exit %d, stdout %q, want disk_limit after the write failed; stderr %q", res.Termination, res.ExitCode, res.Stdout, res.Stderr)
	}
	if !strings.Contains(res.Stderr, "limits.disk_bytes") || !strings.Contains(res.Stderr, "raise limits.disk_bytes") {
		t.Errorf("stderr does not name the limit and how to raise it: %q", res.Stderr)
	}
	if !slices.Contains(res.Staged, "small.txt") || !slices.Contains(res.Staged, "big") {
		t.Fatalf("staged %v, refused %v; want small.txt and the part of big written", res.Staged, res.Refused)
	}
	big, err := sb.ReadFile(ctx, "big")
	if err != nil || len(big) == 0 || len(big) >= 32<<20 {
		t.Fatalf("big: %d bytes, %v; want what fit under the bound", len(big), err)
	}
	// What it wrote was not merged into the container's baseline (which
	// could not hold it): once it is discarded, the next command sees
	// the workspace as it is.
	if _, err := sb.DiscardAll(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = sb.Execute(ctx, Command{Shell: `cat kept.txt; ls`})
	if err != nil {
		t.Fatalf("the next command: %v", err)
	}
	if want := "in the workspace\nkept.txt\n"; res.Stdout != want || res.Termination != backend.Exited {
		t.Fatalf("the next command: %s exit %d, stdout %q, want %q; stderr %q", res.Termination, res.ExitCode, res.Stdout, want, res.Stderr)
	}
}
