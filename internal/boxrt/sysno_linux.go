//go:build linux && !386 && !arm

package boxrt

import "golang.org/x/sys/unix"

// The 32-bit-id system calls; 386 and arm name them apart (sysno32_linux.go).
const (
	sysSetgroups = unix.SYS_SETGROUPS
	sysSetresgid = unix.SYS_SETRESGID
	sysSetresuid = unix.SYS_SETRESUID
)
