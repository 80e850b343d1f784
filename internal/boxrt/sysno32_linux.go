//go:build linux && (386 || arm)

package boxrt

import "golang.org/x/sys/unix"

// The 32-bit-id system calls, which 386 and arm name apart from their
// 16-bit ones.
const (
	sysSetgroups = unix.SYS_SETGROUPS32
	sysSetresgid = unix.SYS_SETRESGID32
	sysSetresuid = unix.SYS_SETRESUID32
)
