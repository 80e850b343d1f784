//go:build linux

package gvisor

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

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

// TestCPULimit: with limits.cpus the sandbox that runs the command is in
// a host cpu cgroup of that quota, read from the host's side: the warm
// sandbox of the command's limits, and a cold command's own sandbox
// while it runs.
func TestCPULimit(t *testing.T) {
	for _, cold := range []bool{false, true} {
		t.Run(map[bool]string{false: "warm", true: "cold"}[cold], func(t *testing.T) {
			var opts []Option
			if cold {
				opts = append(opts, WithCold())
			}
			b := newBackend(t, opts...)
			if b.Capabilities().Limits[policy.LimitCPUs] != policy.Strong {
				t.Skip("runsc cannot make cgroups here: the cpus limit is not listed, and a policy setting one is refused")
			}
			done := make(chan error, 1)
			go func() {
				_, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "sleep 2",
					Limits: policy.ResourceLimits{CPUs: 0.5, Timeout: time.Minute}})
				done <- err
			}()
			// Until the command ends; the warm sandbox outlives it.
			var quota string
			var err error
			for ended := false; quota == "" && !ended; {
				select {
				case err = <-done:
					ended = true
				case <-time.After(50 * time.Millisecond):
				}
				for _, id := range sandboxIDs(b, cold) {
					if q := cpuQuota(id); q != "" && q != "-1" && !strings.HasPrefix(q, "max") {
						quota = q
					}
				}
			}
			if quota != "" {
				err = <-done
			}
			if err != nil {
				t.Fatal(err)
			}
			if quota != "50000" && quota != "50000 100000" {
				t.Fatalf("the sandbox's cpu quota is %q, want 50000 of 100000 µs", quota)
			}
		})
	}
}

// sandboxIDs are the runsc ids of b's running sandboxes: its warm ones,
// or the cold executions' under its state dir.
func sandboxIDs(b *Backend, cold bool) []string {
	var ids []string
	if !cold {
		b.warmMu.Lock()
		for _, w := range b.warms {
			ids = append(ids, w.id)
		}
		b.warmMu.Unlock()
		return ids
	}
	ents, _ := os.ReadDir(b.o.stateDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), execPrefix) {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// cpuQuota is the CFS quota of runsc's cgroup for sandbox id: cgroup v2's
// cpu.max, else v1's cpu.cfs_quota_us ("" when there is none).
func cpuQuota(id string) string {
	for _, f := range []string{"/sys/fs/cgroup/pulse-gvisor/" + id + "/cpu.max", "/sys/fs/cgroup/cpu/pulse-gvisor/" + id + "/cpu.cfs_quota_us"} {
		if b, err := os.ReadFile(f); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}
