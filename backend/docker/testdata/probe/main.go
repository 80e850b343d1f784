// Command probe is built statically by the Docker backend's tests and run
// inside the sandbox container: each mode tries one thing the sandbox
// must refuse and prints "refused: <error>" or "ESCAPED".
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe MODE [ARG]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "tiocsti":
		err = tiocsti()
	case "ttyinject":
		err = ttyInject()
	case "ptrace":
		err = ptrace(os.Args[2])
	case "iouring":
		var params [120]byte // struct io_uring_params
		_, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
		err = errnoErr(e)
	case "mem":
		err = readMem(os.Args[2])
	case "alloc":
		n, _ := strconv.Atoi(os.Args[2])
		b := make([]byte, n<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		fmt.Println("allocated", n, "MiB")
		return
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Println("refused:", err)
		return
	}
	fmt.Println("ESCAPED")
}

func errnoErr(e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// tiocsti makes a pty of the container its controlling terminal, where
// the kernel alone would allow TIOCSTI, and tries it plainly and with high
// bits set in the request.
func tiocsti() error {
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
	var first error
	for _, req := range []uintptr{unix.TIOCSTI, unix.TIOCSTI | 1<<32} {
		c := byte('x')
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pts), req, uintptr(unsafe.Pointer(&c)))
		if e == 0 {
			return nil
		}
		if first == nil {
			first = e
		}
	}
	return first
}

// ttyInject types into the controlling terminal the command was given
// (a command started with a terminal).
func ttyInject() error {
	fd, err := unix.Open("/dev/tty", unix.O_RDWR, 0)
	if err != nil {
		return err
	}
	c := byte('x')
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	return errnoErr(e)
}

func ptrace(pid string) error {
	p, err := strconv.Atoi(pid)
	if err != nil {
		return err
	}
	// SEIZE, not ATTACH: it does not stop the tracee, so that where it
	// succeeds the wrapper is not left stopped; exiting detaches.
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(p), 0, 0, 0, 0)
	return errnoErr(e)
}

// readMem reads a page of another process's memory through /proc, the
// door that needs no ptrace system call.
func readMem(pid string) error {
	maps, err := os.ReadFile("/proc/" + pid + "/maps")
	if err != nil {
		return err
	}
	var start uint64
	if _, err := fmt.Sscanf(string(maps), "%x-", &start); err != nil {
		return errors.New("no mapping to read")
	}
	f, err := os.Open("/proc/" + pid + "/mem")
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 64)
	_, err = f.ReadAt(buf, int64(start))
	return err
}
