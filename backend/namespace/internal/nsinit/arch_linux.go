package nsinit

import "runtime"

// auditArch is the AUDIT_ARCH_* value seccomp reports for native syscalls.
func auditArch() (uint32, bool) {
	switch runtime.GOARCH {
	case "amd64":
		return 0xc000003e, true
	case "arm64":
		return 0xc00000b7, true
	case "riscv64":
		return 0xc00000f3, true
	case "ppc64le":
		return 0xc0000015, true
	case "s390x":
		return 0x80000016, true
	}
	return 0, false
}
