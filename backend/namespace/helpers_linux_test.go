package namespace

import (
	"errors"
	"net"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// helpers each try one thing the sandbox must forbid; nil means it worked.
var helpers = map[string]func(args []string) error{
	"mount": func([]string) error {
		return unix.Mount("tmpfs", "/tmp", "tmpfs", 0, "")
	},
	"ptrace": func([]string) error {
		// Attaching to our own parent (bash, pid 1) needs ptrace rights.
		_, _, e := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_ATTACH, uintptr(os.Getppid()), 0)
		if e != 0 {
			return e
		}
		return nil
	},
	"userns": func([]string) error {
		// unshare is refused outright; clone with CLONE_NEWUSER is the
		// other door.
		if err := unix.Unshare(unix.CLONE_NEWUSER); err == nil {
			return nil
		}
		pid, _, e := unix.RawSyscall(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0)
		if e != 0 {
			return e
		}
		if pid == 0 {
			unix.Exit(0)
		}
		return nil
	},
	"clone3": func([]string) error {
		// clone3's flags live in memory seccomp cannot read, so the
		// filter refuses the call outright (ENOSYS, for libc to fall
		// back to clone, whose flags it checks).
		args := struct {
			flags, pidfd, childTID, parentTID, exitSignal, stack, stackSize, tls uint64
		}{flags: unix.CLONE_NEWUSER, exitSignal: uint64(unix.SIGCHLD)}
		pid, _, e := unix.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args), 0)
		if e != 0 {
			return e
		}
		if pid == 0 {
			unix.Exit(0)
		}
		return nil
	},
	"dial": func(args []string) error {
		c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
		if err != nil {
			return err
		}
		c.Close()
		return nil
	},
	"bpf": func([]string) error {
		_, _, e := unix.Syscall(unix.SYS_BPF, 0, 0, 0)
		if e != 0 {
			return e
		}
		return nil
	},
	"keyctl": func([]string) error {
		_, err := unix.KeyctlJoinSessionKeyring("pulse")
		return err
	},
	"caps": func([]string) error {
		var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return err
		}
		if data[0].Effective|data[0].Permitted|data[1].Effective|data[1].Permitted != 0 {
			return nil
		}
		return errors.New("no capabilities")
	},
}
