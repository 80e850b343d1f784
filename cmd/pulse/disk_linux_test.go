package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// `pulse exec` of a command that writes past the policy's disk_bytes on
// namespace: it is stopped, the summary names the limit and how to raise
// it, and the files it wrote are staged for review.
func TestExecStopsAtTheDiskBound(t *testing.T) {
	nb, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := nb.Probe(t.Context()); err != nil {
		nb.Close()
		testenv.Missing(t, testenv.Namespace, fmt.Sprintf("namespace backend unavailable here: %v", err))
	}
	nb.Close()
	ws := t.TempDir()
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	must(t, os.WriteFile(pol, []byte("defaults: {write: allow}\nlimits:\n  disk_bytes: 4MiB\n  timeout: 20s\n"), 0o644))
	code, stdout, stderr := runCLI(t, "exec", "--backend", "namespace", "--policy", pol, "--workspace", ws, "--",
		"sh", "-c", "echo kept > a.txt; head -c 32M /dev/zero > big; sleep 15")
	if code != exitKilled {
		t.Errorf("exit %d, want %d (killed)", code, exitKilled)
	}
	if !strings.Contains(stderr, "(disk_limit)") || !strings.Contains(stderr, "raise limits.disk_bytes") {
		t.Fatalf("summary does not name the disk bound:\n%s\n%s", stdout, stderr)
	}
	if !strings.Contains(stderr, "a.txt") || !strings.Contains(stderr, "big") {
		t.Fatalf("the files written before the bound are not staged:\n%s", stderr)
	}
	// The bound the command reached is the policy's: the summary names
	// its size and never calls it the default.
	if !strings.Contains(stderr, "limits.disk_bytes of the policy, 4.0MiB") || strings.Contains(stderr, "default") {
		t.Fatalf("the summary does not name the policy's bound:\n%s", stderr)
	}
}

// A command that writes more than its memory allows on namespace (its
// writes are held in memory) ends as out of memory, and the summary says
// how much its writes took and which limit to raise.
func TestExecOOMNamesTheWrites(t *testing.T) {
	nb, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := nb.Probe(t.Context()); err != nil {
		nb.Close()
		testenv.Missing(t, testenv.Namespace, fmt.Sprintf("namespace backend unavailable here: %v", err))
	}
	lim := nb.Capabilities().Limits
	nb.Close()
	if lim["memory_bytes"] != "strong" || lim["disk_bytes"] != "strong" {
		t.Skipf("needs a memory cgroup and the disk bound: limits %v", lim)
	}
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	must(t, os.WriteFile(pol, []byte("limits:\n  memory_bytes: 48MiB\n  disk_bytes: 512MiB\n  timeout: 20s\n"), 0o644))
	code, stdout, stderr := runCLI(t, "exec", "--backend", "namespace", "--policy", pol, "--workspace", t.TempDir(), "--",
		"sh", "-c", "exec head -c 256M /dev/zero > big")
	if code != exitKilled || !strings.Contains(stderr, "(oom)") || !strings.Contains(stderr, "raise limits.memory_bytes") {
		t.Fatalf("exit %d, summary:\n%s\n%s", code, stdout, stderr)
	}
}
