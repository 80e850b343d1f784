package docker

import (
	"encoding/json"
	"sync"

	"github.com/pulse-agent/pulse/backend/internal/denylist"
)

// The container's seccomp profile replaces the engine's default one with
// the deny list the namespace backend's filter is built from
// (denylist): the engine's default allows ptrace (kernels from 4.8 on) and,
// in the engine versions distributions ship, io_uring, and never filters
// TIOCSTI. Everything not listed is allowed, as in the namespace backend;
// what else the engine's default refuses needs capabilities the container
// does not have. Only the native architecture is listed, so a syscall of
// a foreign ABI (int 0x80 on x86_64) is refused whatever its number.

// seccompRule is one entry of the engine's profile format (the
// "syscalls" array of a Docker/OCI seccomp profile).
type seccompRule struct {
	Names    []string     `json:"names"`
	Action   string       `json:"action"`
	ErrnoRet *uint        `json:"errnoRet,omitempty"`
	Args     []seccompArg `json:"args,omitempty"`
}

type seccompArg struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo"`
	Op       string `json:"op"`
}

type seccompProfile struct {
	DefaultAction string        `json:"defaultAction"`
	Syscalls      []seccompRule `json:"syscalls"`
}

const (
	errnoEPERM  = 1
	errnoENOSYS = 38
)

// seccompJSON is the profile, as SecurityOpt "seccomp=" takes it.
var seccompJSON = sync.OnceValue(func() string {
	eperm, enosys := uint(errnoEPERM), uint(errnoENOSYS)
	p := seccompProfile{
		DefaultAction: "SCMP_ACT_ALLOW",
		Syscalls: []seccompRule{
			{Names: denylist.Syscalls, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm},
			// clone3's flags are out of a filter's reach: ENOSYS makes libc
			// fall back to clone, whose flags the rules below check.
			{Names: []string{"clone3"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &enosys},
		},
	}
	for _, f := range denylist.CloneNamespaceFlags {
		p.Syscalls = append(p.Syscalls, seccompRule{
			Names: []string{"clone"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
			Args: []seccompArg{{Index: 0, Value: f, ValueTwo: f, Op: "SCMP_CMP_MASKED_EQ"}},
		})
	}
	for _, req := range denylist.TerminalIoctls {
		// The kernel reads the request as an int: compare its low 32 bits.
		p.Syscalls = append(p.Syscalls, seccompRule{
			Names: []string{"ioctl"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
			Args: []seccompArg{{Index: 1, Value: 0xFFFFFFFF, ValueTwo: uint64(req), Op: "SCMP_CMP_MASKED_EQ"}},
		})
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic("docker: seccomp profile: " + err.Error()) // a constant structure
	}
	return string(b)
})
