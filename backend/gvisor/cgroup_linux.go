package gvisor

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// cgroupRoot is where the host's cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cpuController reports whether the host under root (its cgroup mount
// point) has the cpu controller runsc needs for a sandbox's CFS quota:
// listed in cgroup.controllers where root is a unified (v2) hierarchy,
// else a v1 hierarchy of it at root/cpu or root/cpu,cpuacct (where
// runsc looks for it).
func cpuController(root string) bool {
	if b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err == nil {
		return slices.Contains(strings.Fields(string(b)), "cpu")
	}
	for _, d := range []string{"cpu", "cpu,cpuacct", "cpuacct,cpu"} {
		if _, err := os.Stat(filepath.Join(root, d, "cpu.cfs_quota_us")); err == nil {
			return true
		}
	}
	return false
}
