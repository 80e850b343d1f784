package nsinit

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend/internal/denylist"
)

// restrictSelf is the last step before execve, on the thread that will
// exec: landlock (needs the capabilities it is about to lose for nothing,
// but must come before seccomp, which does not refuse it), then the
// capabilities, then no_new_privs and seccomp.
func restrictSelf(cfg *Config) error {
	if err := applyLandlock(cfg); err != nil {
		return err
	}
	if err := dropCapabilities(cfg.LastCap); err != nil {
		return err
	}
	if err := loadSeccomp(cfg.Seccomp); err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	if err := loadArchFilter(); err != nil {
		return fmt.Errorf("seccomp (arch filter): %w", err)
	}
	return nil
}

// Securebits that take root's special treatment away for good: after
// execve a uid 0 process gains no capability back.
const (
	secbitNoroot                 = 1 << 0
	secbitNorootLocked           = 1 << 1
	secbitNoSetuidFixup          = 1 << 2
	secbitNoSetuidFixupLocked    = 1 << 3
	secbitKeepCapsLocked         = 1 << 5
	secbitNoCapAmbientRaise      = 1 << 6
	secbitNoCapAmbientRaiseLockd = 1 << 7
)

// LastCap is the highest capability number the kernel knows (63 when
// it cannot be read). The backend reads it once and sends it in every
// init's static config; an init not told reads it itself.
func LastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 && n < 64 {
			return n
		}
	}
	return 63
}

func dropCapabilities(last int) error {
	if last <= 0 || last >= 64 {
		last = LastCap()
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	bits := secbitNoroot | secbitNorootLocked | secbitNoSetuidFixup | secbitNoSetuidFixupLocked |
		secbitKeepCapsLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseLockd
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil {
		return fmt.Errorf("setting securebits: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// loadSeccomp sets no_new_privs and installs prog (the backend's compiledSeccomp), as
// the library's LoadFilter does with NoNewPrivs and no flags. An empty or oversized
// program is refused: the init never runs a command unfiltered.
func loadSeccomp(prog []unix.SockFilter) error {
	if len(prog) == 0 || len(prog) > 4096 {
		return fmt.Errorf("no usable filter program (%d instructions)", len(prog))
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return e
	}
	return nil
}

// loadArchFilter adds what the library's filter cannot say: every syscall
// of a foreign ABI (int 0x80 on x86_64) fails, since the deny list above
// only matches native numbers; clone3, whose flags live in memory a
// filter cannot read, fails with ENOSYS so that libc falls back to clone,
// which the deny list checks; and ioctl with a terminal-injecting request
// (denylist.TerminalIoctls) fails with EPERM, compared on the low 32 bits
// of the request only, which the library cannot express. When two filters
// both return an errno the kernel keeps the most recently installed one's
// value.
func loadArchFilter() error {
	archID, ok := auditArch()
	if !ok {
		return nil // the library filter alone, on an architecture we do not know
	}
	const (
		ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retK = unix.BPF_RET | unix.BPF_K
	)
	// struct seccomp_data: nr at 0, arch at 4, args from 16, 8 bytes
	// each; the low word of args[1] comes first on a little-endian ABI.
	reqLow := uint32(24)
	if runtime.GOARCH == "s390x" {
		reqLow = 28
	}
	ioctls := denylist.TerminalIoctls
	n := uint8(len(ioctls))
	prog := []unix.SockFilter{
		{Code: ldW, K: 4},                    // arch
		{Code: jeq, K: archID, Jt: 1, Jf: 0}, // native: go on
		{Code: retK, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: ldW, K: 0}, // syscall number
		{Code: jeq, K: unix.SYS_CLONE3, Jt: 0, Jf: 1},
		{Code: retK, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: jeq, K: unix.SYS_IOCTL, Jt: 0, Jf: n + 1}, // not ioctl: allow
		{Code: ldW, K: reqLow},
	}
	for i, req := range ioctls {
		// Each match jumps to the EPERM return after the list.
		prog = append(prog, unix.SockFilter{Code: jeq, K: req, Jt: n - uint8(i), Jf: 0})
	}
	prog = append(prog,
		unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: retK, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
	)
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		return e
	}
	return nil
}

// LandlockABI is the kernel's landlock ABI version, 0 when it has none.
func LandlockABI() int {
	r, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0
	}
	return int(r)
}

// applyLandlock confines writes to the places the mount layout already
// makes writable, so that a mount mistake is not an escape. Best effort:
// nothing happens on a kernel without landlock.
func applyLandlock(cfg *Config) error {
	abi := LandlockABI()
	if abi < 1 {
		return nil
	}
	fileRights := uint64(unix.LANDLOCK_ACCESS_FS_WRITE_FILE)
	dirRights := uint64(unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR | unix.LANDLOCK_ACCESS_FS_MAKE_REG |
		unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM)
	if abi >= 2 {
		dirRights |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		fileRights |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	handled := fileRights | dirRights
	// Only the first field of struct landlock_ruleset_attr: every ABI
	// accepts it, and it does not depend on how x/sys names the others.
	attr := struct{ handledAccessFS uint64 }{handled}
	r, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if e != 0 {
		return fmt.Errorf("landlock_create_ruleset: %w", e)
	}
	ruleset := int(r)
	defer unix.Close(ruleset)
	writable := append([]string{cfg.Workspace, "/tmp", cfg.Home, "/dev"}, cfg.ReadWrite...)
	for _, c := range cfg.Caches {
		writable = append(writable, c.Dst)
	}
	for _, p := range writable {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		rights := handled
		if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			rights = fileRights
		}
		pb := landlockPathBeneath{allowedAccess: rights, parentFd: int32(fd)}
		_, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(ruleset), unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&pb)), 0, 0, 0)
		unix.Close(fd)
		if e != 0 {
			return fmt.Errorf("landlock_add_rule %s: %w", p, e)
		}
	}
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(ruleset), 0, 0); e != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", e)
	}
	return nil
}

// landlockPathBeneath is struct landlock_path_beneath_attr, which the
// kernel declares packed.
type landlockPathBeneath struct {
	allowedAccess uint64
	parentFd      int32
}
