package gvisor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/policy"
)

func TestCPUController(t *testing.T) {
	mk := func(t *testing.T, files map[string]string) string {
		root := t.TempDir()
		for f, data := range files {
			p := filepath.Join(root, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return root
	}
	for _, c := range []struct {
		name  string
		files map[string]string
		want  bool
	}{
		{"v2 with cpu", map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n"}, true},
		{"v2 without cpu", map[string]string{"cgroup.controllers": "cpuset io memory pids\n"}, false},
		// A v2 root answers for itself, whatever else lies below it.
		{"v2 without cpu, a cpu dir", map[string]string{"cgroup.controllers": "memory", "cpu/cpu.cfs_quota_us": "-1"}, false},
		{"v1 cpu", map[string]string{"cpu/cpu.cfs_quota_us": "-1", "memory/memory.limit_in_bytes": "0"}, true},
		{"v1 cpu,cpuacct", map[string]string{"cpu,cpuacct/cpu.cfs_quota_us": "-1"}, true},
		{"v1 memory only", map[string]string{"memory/memory.limit_in_bytes": "0", "cpuacct/cpuacct.usage": "0"}, false},
		{"nothing", nil, false},
	} {
		if got := cpuController(mk(t, c.files)); got != c.want {
			t.Errorf("%s: cpuController = %v, want %v", c.name, got, c.want)
		}
	}
}

// A host with a memory controller and no cpu one lists the memory limit,
// not the cpus one (which the facade then refuses), and says why.
func TestCapabilitiesWithoutCPUController(t *testing.T) {
	c := capabilities("systrap", true, false, "")
	if c.Limits[policy.LimitMemoryBytes] != policy.Strong {
		t.Errorf("memory limit %q, want strong", c.Limits[policy.LimitMemoryBytes])
	}
	if lvl, ok := c.Limits[policy.LimitCPUs]; ok {
		t.Errorf("cpus limit listed (%q) without a cpu controller", lvl)
	}
	if c := capabilities("systrap", true, true, ""); c.Limits[policy.LimitCPUs] != policy.Strong {
		t.Errorf("cpus limit %q with both controllers, want strong", c.Limits[policy.LimitCPUs])
	}
	if c := capabilities("systrap", false, true, ""); len(c.Limits) != 4 {
		t.Errorf("without a memory cgroup: limits %v, want the four that need none", c.Limits)
	}
}
