package namespace

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
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
	// tiocsti makes a terminal of its own its controlling terminal (a
	// new session, then a pty of the sandbox's devpts opened without
	// O_NOCTTY), so that the kernel alone would let it push input, and
	// tries TIOCSTI on it: plainly, and with high bits set in the request,
	// which the kernel drops. Only seccomp stands in the way.
	"tiocsti": func([]string) error {
		_, _ = unix.Setsid()
		ptmx, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY, 0)
		if err != nil {
			return err
		}
		if err := unix.IoctlSetPointerInt(ptmx, unix.TIOCSPTLCK, 0); err != nil {
			return err
		}
		n, err := unix.IoctlGetInt(ptmx, unix.TIOCGPTN)
		if err != nil {
			return err
		}
		pts, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR, 0)
		if err != nil {
			return err
		}
		return tryInject(pts)
	},
	// ttyinject tries to type into the controlling terminal it would
	// share with the caller if the sandbox kept the caller's session.
	"ttyinject": func([]string) error {
		fd, err := unix.Open("/dev/tty", unix.O_RDWR, 0)
		if err != nil {
			return err
		}
		return tryInject(fd)
	},
	// alloc holds args[0] MiB, every page touched; nil when it could.
	"alloc": func(args []string) error {
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return err
		}
		b := make([]byte, n<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		return nil
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

// tryInject pushes "echo INJECTED" and a newline into the terminal fd one
// byte at a time, as TIOCSTI takes them; nil when any byte went in.
func tryInject(fd int) error {
	var first error
	for _, req := range []uintptr{unix.TIOCSTI, unix.TIOCSTI | 1<<32} {
		if ^uint(0)>>32 == 0 && req>>32 != 0 {
			continue // a 32-bit ABI has no high bits to set
		}
		for _, c := range []byte("echo INJECTED\n") {
			_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(&c)))
			if e == 0 {
				return nil
			}
			if first == nil {
				first = e
			}
		}
	}
	return first
}

// outerEnv makes the test binary act as the caller of the backend (the
// role `pulse exec` plays) instead of running tests: it runs the shell
// script in outerScriptEnv on a namespace backend whose state lives in
// outerStateEnv, with its own stdin, stdout and stderr, and exits with the
// command's status. Tests start it under conditions a caller may be in: on
// a terminal, holding descriptors open.
const (
	outerEnv       = "PULSE_NS_TEST_OUTER"
	outerScriptEnv = "PULSE_NS_TEST_OUTER_SCRIPT"
	outerStateEnv  = "PULSE_NS_TEST_OUTER_STATE"
	outerWSEnv     = "PULSE_NS_TEST_OUTER_WS"
)

func runOuter() int {
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outer:", err)
		return 125
	}
	b, err := New(WithStateDir(os.Getenv(outerStateEnv)), WithReadOnlyBind(filepath.Dir(exe)), WithoutPrestart())
	if err != nil {
		fmt.Fprintln(os.Stderr, "outer:", err)
		return 125
	}
	defer b.Close()
	res, err := b.Exec(context.Background(), &backend.Request{
		Workspace: os.Getenv(outerWSEnv),
		Shell:     os.Getenv(outerScriptEnv),
		Env:       map[string]string{"PULSE_TEST_EXE": exe, "GORACE": "atexit_sleep_ms=0"},
		Stdin:     os.Stdin, // a terminal, when the test made it one
		Stdout:    os.Stdout,
		Stderr:    os.Stderr,
		Limits:    policy.ResourceLimits{Timeout: time.Minute},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "outer:", err)
		return 125
	}
	return res.ExitCode
}
