package boxrt

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// runTTY is the terminal step: the process of the exec the host gave a
// terminal for a command of the exec step (PULSE_TTY=1), as root only
// until it has entered the command's directory and set the terminal's
// size: DIR UID GID FSIZE PGID TIME ROWS COLS KILLED, then the command's
// environment and argv. KILLED exists once the command was killed (the
// kill step): a terminal exec that starts only after that runs nothing.
// It then becomes, in place, the command's uid with no capabilities
// (dropTo, as the cmd step does for the exec step) and the ttycmd step, so
// the exec's process stays the leader of the terminal's session.
func runTTY(a []string) int {
	if len(a) < 10 {
		return usage()
	}
	dir, uid, gid, fsize, pgid, timef, rows, cols, killed := a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]
	u, err1 := strconv.Atoi(uid)
	g, err2 := strconv.Atoi(gid)
	r, err3 := strconv.ParseUint(rows, 10, 16)
	c, err4 := strconv.ParseUint(cols, 10, 16)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || u < firstUID {
		return usage()
	}
	if exists(killed) {
		return 137
	}
	if os.Chdir(dir) != nil {
		return 125
	}
	_ = unix.IoctlSetWinsize(0, unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(r), Col: uint16(c)})
	self, err := os.Executable()
	if err != nil {
		self = toolsDir + "/" + Name
	}
	argv := append([]string{self, "ttycmd", fsize, pgid, timef, envProgram()}, a[9:]...)
	if err = dropTo(u, g); err == nil {
		err = unix.Exec(self, argv, []string{})
	}
	fmt.Fprintf(os.Stderr, "%s tty: %v\n", Name, err)
	return 126
}

// runTTYCmd is the ttycmd step, as the command's uid: FSIZE PGID TIME
// ENV-PROGRAM, then the command's environment and argv for env -i. It
// records its pid (the group leader's) in PGID, runs the command as its
// child in its own process group (the terminal's foreground one),
// ignoring the terminal's interrupt and quit as time(1) does, and writes
// how the command ended and its usage to TIME, as the exec step does.
func runTTYCmd(a []string) int {
	if len(a) < 5 {
		return usage()
	}
	fsize, err := strconv.ParseInt(a[0], 10, 64)
	if err != nil {
		return usage()
	}
	if err := os.WriteFile(a[1], []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		fmt.Fprintf(os.Stderr, "%s ttycmd: %v\n", Name, err)
		return 126
	}
	if fsize > 0 {
		lim := &unix.Rlimit{Cur: uint64(fsize) * 512, Max: uint64(fsize) * 512}
		if err := unix.Setrlimit(unix.RLIMIT_FSIZE, lim); err != nil {
			fmt.Fprintf(os.Stderr, "%s ttycmd: file size limit: %v\n", Name, err)
			return 126
		}
	}
	c := &exec.Cmd{Path: a[3], Args: append([]string{"env", "-i"}, a[4:]...), Env: []string{},
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	start := time.Now()
	if err := c.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s ttycmd: %v\n", Name, err)
		return 126
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
	_ = c.Wait()
	rc, usage := exitAndUsage(c.ProcessState, time.Since(start))
	_ = os.WriteFile(a[2], []byte(usage), 0o600)
	return rc
}
