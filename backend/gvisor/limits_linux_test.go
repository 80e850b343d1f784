//go:build linux

package gvisor

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// TestMemoryLimit: with limits.memory_bytes the sandbox is bounded by
// it: gVisor's kernel reports it as the memory there is, and a command
// that holds more does not finish.
func TestMemoryLimit(t *testing.T) {
	b := newBackend(t)
	if b.Capabilities().Limits[policy.LimitMemoryBytes] != policy.Strong {
		t.Skip("runsc cannot make a memory cgroup here: the memory limit is not listed, and a policy setting one is refused")
	}
	const limit = 96 << 20
	var out bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Limits: policy.ResourceLimits{MemoryBytes: limit},
		Shell: "head -1 /proc/meminfo; python3 -c \"x = b'a' * (400 << 20); print('held', len(x))\"", Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "MemTotal:          98304 kB") {
		t.Errorf("MemTotal inside is not the limit: %q", out.String())
	}
	t.Logf("exit %d (%s), output %q", res.ExitCode, res.Termination, out.String())
	if strings.Contains(out.String(), "not found") {
		t.Skipf("no python3 in the sandbox to hold memory with: %q", out.String())
	}
	if strings.Contains(out.String(), "held") || res.ExitCode == 0 {
		t.Errorf("a command held 400 MiB under a 96 MiB limit: exit %d, %q", res.ExitCode, out.String())
	}
}
