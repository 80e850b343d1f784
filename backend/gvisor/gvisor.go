package gvisor

import (
	"fmt"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Name is the backend's name on the command line and in audit events.
const Name = "gvisor"

// capabilities is what the backend enforces; platform names runsc's,
// memCgroup says each sandbox is in a memory cgroup of the limit.
func capabilities(platform string, memCgroup bool) backend.Capabilities {
	if platform == "" {
		platform = "systrap or ptrace"
	}
	c := backend.Capabilities{
		Isolation: backend.IsolationGVisor,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{
			policy.NetworkDenyAll: policy.Strong,
		},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{
			secrets.DenyAll:   policy.Strong,
			secrets.Allowlist: policy.Strong,
			secrets.AllowAll:  policy.Strong,
		},
		CapturesWrites: true,
		HidesPaths:     true,
		StacksPending:  true,
		MountsCaches:   true,
		Limits: map[policy.LimitKey]policy.EnforcementLevel{
			policy.LimitTimeout:       policy.Strong,
			policy.LimitOutputBytes:   policy.Strong,
			policy.LimitFileSizeBytes: policy.Strong,
			policy.LimitDiskBytes:     policy.Strong,
		},
		Notes: []string{
			"system calls served by gVisor's user-space kernel (runsc, platform " + platform + "), not the host kernel",
			"a fresh runsc sandbox per command: own pid, ipc, uts, mount and network stack; no capabilities, no_new_privs",
			"workspace seen through a host overlayfs bound in by runsc's gofer; writes captured from its upper layer",
			"network: none (loopback of gVisor's netstack); allow-all and allowlist refused",
			"what a command writes is held in a size-limited tmpfs (limits.disk_bytes)",
		},
	}
	if memCgroup {
		c.Limits[policy.LimitMemoryBytes] = policy.Strong
		c.Notes = append(c.Notes, fmt.Sprintf("memory: each sandbox (gVisor's kernel and the command) in a memory cgroup of limits.memory_bytes, %d MiB without one; going over it kills the sandbox (signal 9)", policy.DefaultMemoryBytes>>20),
			"pids and cpus limits: not enforced")
	} else {
		c.Notes = append(c.Notes, "memory, pids and cpus limits: not enforced (runsc cannot make a memory cgroup here)")
	}
	return c
}
