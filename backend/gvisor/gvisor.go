package gvisor

import (
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Name is the backend's name on the command line and in audit events.
const Name = "gvisor"

// capabilities is what the backend enforces; platform names runsc's.
func capabilities(platform string) backend.Capabilities {
	if platform == "" {
		platform = "systrap or ptrace"
	}
	return backend.Capabilities{
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
			"memory, pids and cpus limits: not enforced per command",
		},
	}
}
