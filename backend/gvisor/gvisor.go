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
// memCgroup says each sandbox is in a memory cgroup of the limit, and
// cpuCgroup that it can be in a cpu cgroup too; coldWhy is why commands
// run in a sandbox each ("": in the warm sandbox).
func capabilities(platform string, memCgroup, cpuCgroup bool, coldWhy string) backend.Capabilities {
	if platform == "" {
		platform = "systrap or ptrace"
	}
	c := backend.Capabilities{
		Isolation: backend.IsolationGVisor,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{
			policy.NetworkDenyAll:  policy.Strong,
			policy.NetworkAllowAll: policy.Strong,
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
			"",
			"workspace seen through a host overlayfs mounted into the sandbox (through runsc's gofer); writes captured from its upper layer",
			"network: none (loopback of gVisor's netstack); allowlist refused; allow-all in a sandbox of its own on the host's network (runsc --network=host)",
			"what a command writes is held in a size-limited tmpfs (limits.disk_bytes)",
		},
	}
	mem := "each sandbox (gVisor's kernel and the command)"
	if coldWhy == "" {
		c.Network[policy.NetworkAllowlist] = policy.Strong
		c.Notes[3] = "network: none (loopback of gVisor's netstack, each command its own); allowlist through the egress proxy, " +
			"relayed by the runtime from 127.0.0.1:3128 in the command's network namespace to the proxy's socket; " +
			"allow-all in a sandbox of its own on the host's network (runsc --network=host), as cold"
		c.Notes[1] = "warm: one runsc sandbox started at the first command and kept until the sandbox closes (pulse-runtime its init); " +
			"each command in pid, mount, network (its own loopback) and IPC namespaces of its own inside it, its own root, /tmp and devpts (terminals), no capabilities, no_new_privs; what it leaves running ends with it; " +
			"ports of background processes reached through the runtime, which connects in the command's network namespace"
		mem = "the warm sandbox (gVisor's kernel and the commands running in it together)"
	} else {
		c.Notes[1] = "cold: a fresh runsc sandbox per command (" + coldWhy + "): own pid, ipc, uts, mount and network stack; no capabilities, no_new_privs; terminals made by runsc on the host; ports of background processes refused, but allow-all's (the host's own)"
	}
	// The pids limit is not listed: gVisor's kernel has a pids cgroup of
	// its own, but after it refuses a fork it lets later ones through
	// (a limit of 8 held 37 processes, the 4 refused forks aside), and
	// the host's pids cgroup of a sandbox counts the Sentry's threads and
	// its stubs (21 tasks idle, 34 more for 20 processes), not the
	// command's processes, and kills the sandbox when the Sentry needs a
	// thread past it.
	pids := "pids limit: not enforced (gVisor's own pids cgroup lets forks past its limit once it has refused one; the host's counts gVisor's threads, not the command's processes); a policy setting one is refused"
	if !memCgroup {
		c.Notes = append(c.Notes, "memory and cpus limits: not enforced (runsc cannot make a memory cgroup here)", pids)
		return c
	}
	c.Limits[policy.LimitMemoryBytes] = policy.Strong
	c.Notes = append(c.Notes, fmt.Sprintf("memory: %s in a memory cgroup of limits.memory_bytes, %d MiB without one; going over it kills the sandbox (signal 9)", mem, policy.DefaultMemoryBytes>>20))
	if cpuCgroup {
		c.Limits[policy.LimitCPUs] = policy.Strong
		cpu := "each sandbox (gVisor's kernel and the command)"
		if coldWhy == "" {
			cpu = "the warm sandbox (one per memory and cpus limits; gVisor's kernel and the commands running in it together, so each command gets at most that)"
		}
		c.Notes = append(c.Notes, "cpus: "+cpu+" in a cpu cgroup of limits.cpus (a CFS quota on the host), unbounded without one")
	} else {
		c.Notes = append(c.Notes, "cpus limit: not enforced (the host has no cpu cgroup controller); a policy setting one is refused")
	}
	c.Notes = append(c.Notes, pids)
	return c
}
