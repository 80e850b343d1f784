//go:build linux

package host

import (
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Where no cgroup can be made (no writable v2 hierarchy, or
// PULSE_HOST_NO_CGROUP=1), a command's processes are tracked by a child
// subreaper instead: this same program, re-executed through
// /proc/self/exe (the binary that is running, even if it has been
// replaced on disk since), sets PR_SET_CHILD_SUBREAPER and starts the
// command as its child. A process that leaves the command's process group
// and is orphaned (setsid, then its parent exits) is reparented to the
// reaper, not to init; when the command ends, or the reaper is told to
// stop (reaperStop: a timeout, a cancel, Close, or its owner's death
// through PR_SET_PDEATHSIG), it SIGKILLs every descendant it has, reaps
// them, and exits as the command did. Other signals it gets are passed
// on to the command. No binary has to call anything for this: the
// package's init runs the reaper when the program is started as one.
//
// It is weaker than a cgroup: the command runs as the same user as its
// reaper, so a command that kills or stops its reaper (its parent) first
// gets away, and a descendant is found through /proc, so the kill races
// with a pid reused in between. The cgroup is used wherever it can be.

// NoCgroupEnv set to 1 makes the backend track commands with the child
// subreaper even where a cgroup could be made (for tests, and for
// machines whose cgroup hierarchy must not be touched).
const NoCgroupEnv = "PULSE_HOST_NO_CGROUP"

const (
	// reaperArg0 and reaperEnv mark a start of this program as a reaper;
	// the command's environment never has reaperEnv.
	reaperArg0 = "pulse-host-reaper"
	reaperEnv  = "PULSE_HOST_REAPER"
	// reaperRace keeps a race-enabled build from sleeping a second at
	// each exit (the command's environment never has it either, unless it
	// asked for its own GORACE).
	reaperRace = "GORACE=atexit_sleep_ms=0"
	// reaperStop tells the reaper to kill the command's processes and
	// end (a timeout, a cancel, Close; its owner's death, as its
	// PR_SET_PDEATHSIG). A real-time signal the Go runtime leaves alone
	// and no one sends by chance, so that every usual signal a caller
	// sends (Start's Signal goes to the reaper's pid) is forwarded to the
	// command as it is.
	reaperStop = syscall.Signal(40) // SIGRTMIN+6 of the C library
	// reaperStopGrace bounds how long a reaper that was told to stop may
	// take before its process group is SIGKILLed as it would be without
	// one.
	reaperStopGrace = 10 * time.Second
)

func init() {
	if len(os.Args) >= 4 && os.Args[0] == reaperArg0 && os.Getenv(reaperEnv) == "1" {
		os.Exit(runReaper(os.Args[1], os.Args[2], os.Args[3:]))
	}
}

// useCgroup says whether commands are tracked with a cgroup here.
func useCgroup() bool { return os.Getenv(NoCgroupEnv) != "1" }

// reaperAvailable says whether the subreaper can be started: this
// program must be executable again through /proc/self/exe, and be a Go
// program of its own, whose init is this package's. Built as a library
// for another program (c-shared, c-archive, plugin), /proc/self/exe is
// that program, which knows nothing of the reaper.
var reaperAvailable = sync.OnceValue(func() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, st := range bi.Settings {
			if st.Key == "-buildmode" && st.Value != "exe" && st.Value != "pie" {
				return false
			}
		}
	}
	return unix.Access("/proc/self/exe", unix.X_OK) == nil
})

// underReaper makes cmd start the reaper, which starts what cmd would
// have started. A gate on fd 3 (ExtraFiles) is waited for by the reaper
// first, so that the rlimits the caller puts on the started process are
// in place before the command exists, and is then handed on to the
// command (at its end) so that its prologue passes at once.
func underReaper(cmd *exec.Cmd) {
	gate := "0"
	if len(cmd.ExtraFiles) > 0 {
		gate = "1"
	}
	env := append([]string{}, cmd.Env...)
	env = append(env, reaperEnv+"=1")
	if !hasVar(cmd.Env, "GORACE") {
		env = append(env, reaperRace)
	}
	cmd.Args = append([]string{reaperArg0, gate, cmd.Path}, cmd.Args...)
	cmd.Path = "/proc/self/exe"
	cmd.Env = env
	// The reaper outlives a dead owner only long enough to kill the
	// command's processes.
	cmd.SysProcAttr.Pdeathsig = reaperStop
}

// stopReaper tells the reaper pid to kill the command's processes and
// waits, a bounded time, until it has exited (ended).
func stopReaper(pid int, ended <-chan struct{}) {
	_ = syscall.Kill(pid, reaperStop)
	t := time.NewTimer(reaperStopGrace)
	defer t.Stop()
	select {
	case <-ended:
	case <-t.C:
	}
}

func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, name+"=") {
			return true
		}
	}
	return false
}

// runReaper is the reaper's main: gate "1" when fd 3 is the caller's
// gate, path and argv the command. It returns only when it cannot die as
// the command did.
func runReaper(gate, path string, argv []string) int {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, reaperStop)
	// Signals for the command: held until it runs, then passed on. One
	// the reaper was started with ignored (nohup) stays ignored, and so
	// the command inherits it ignored as it would without a reaper.
	fwd := make(chan os.Signal, 16)
	for _, sig := range forwarded {
		if !signal.Ignored(sig) {
			signal.Notify(fwd, sig)
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		os.Stderr.WriteString("pulse: cannot track the command's processes: " + err.Error() + "\n")
		return 126
	}
	files := []uintptr{0, 1, 2}
	if gate == "1" {
		_, _ = io.Copy(io.Discard, os.NewFile(3, "gate"))
		files = append(files, 3)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, reaperEnv+"=") && kv != reaperRace {
			env = append(env, kv)
		}
	}
	select {
	case <-stop:
		return 128 + int(reaperStop) // stopped before the command started
	default:
	}
	// syscall's, not os's: os would first probe for pidfds with a process
	// of its own, a cost on every command. A group of its own, so that the
	// command's `kill 0` does not reach the reaper; killed should the
	// reaper die.
	sys := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// On a terminal (Request.TTY) the reaper leads the terminal's
	// session: the command's group becomes its foreground group, so that
	// the command reads from it (a background group is stopped by
	// SIGTTIN) and gets what the terminal sends (SIGWINCH, ^C).
	if _, err := unix.IoctlGetInt(0, unix.TIOCGPGRP); err == nil {
		sys.Foreground, sys.Ctty = true, 0
	}
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: env, Files: files, Sys: sys})
	if err != nil {
		os.Stderr.WriteString("pulse: " + path + ": " + err.Error() + "\n")
		return 127
	}
	if gate == "1" {
		unix.Close(3)
	}
	go func() {
		<-stop
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}()
	go func() {
		for sig := range fwd {
			_ = syscall.Kill(pid, sig.(syscall.Signal))
		}
	}()
	var status unix.WaitStatus
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			break // ECHILD: cannot happen before the command is reaped
		}
		if wpid == pid {
			status = ws
			break
		}
	}
	signal.Stop(fwd)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	killDescendants()
	if status.Signaled() {
		dieBy(status.Signal())
	}
	return status.ExitStatus()
}

// forwarded are the signals the reaper passes on to the command: those a
// caller sends that can be caught, but SIGURG and SIGPROF (the Go
// runtime's own: preemption and profiling would reach the command),
// SIGPIPE (the runtime's handling of it would change) and SIGCHLD (the
// reaper's children's).
var forwarded = []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGTERM, syscall.SIGALRM, syscall.SIGCONT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
	syscall.SIGWINCH, syscall.SIGVTALRM, syscall.SIGXCPU, syscall.SIGXFSZ}

// killDescendants SIGKILLs every descendant of this process and reaps
// them, until none is left or a few seconds have passed. One that forks
// meanwhile leaves a child that is reparented here and found next round.
func killDescendants() {
	self := os.Getpid()
	deadline := time.Now().Add(5 * time.Second)
	for {
		// No child left means no descendant: each has a parent chain up to
		// here. The usual end, found without reading /proc.
		if !reapExited() {
			return
		}
		for _, p := range descendants(self) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// reapExited reaps the children that have exited and says whether any
// child is left.
func reapExited() bool {
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case err == unix.EINTR:
		case err != nil:
			return false // ECHILD
		case wpid == 0:
			return true
		}
	}
}

// descendants lists the processes below pid: from the kernel's children
// lists where it keeps them, else from every process's parent in /proc.
func descendants(pid int) []int {
	if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/children"); err != nil {
		return descendantsByScan(pid)
	}
	var out []int
	queue := childrenOf(pid)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, p)
		queue = append(queue, childrenOf(p)...)
	}
	return out
}

// childrenOf reads the children of every thread of pid.
func childrenOf(pid int) []int {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func descendantsByScan(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	queue := children[pid]
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, p)
		queue = append(queue, children[p]...)
	}
	return out
}

// dieBy ends this process by sig with the default action, so that its
// parent sees the wait status the command had; no core file is written.
// The Go runtime's handler is bypassed (it would print a traceback, or
// exit 2, for some signals).
func dieBy(sig syscall.Signal) {
	_ = unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	runtime.LockOSThread()
	var dfl [4]uint64 // a zeroed kernel sigaction: SIG_DFL, no flags, no mask
	_, _, _ = unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl[0])), 0, 8, 0, 0)
	set := uint64(1) << (uint(sig) - 1)
	_, _, _ = unix.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_UNBLOCK, uintptr(unsafe.Pointer(&set)), 0, 8, 0, 0)
	_ = unix.Tgkill(os.Getpid(), unix.Gettid(), sig)
	time.Sleep(100 * time.Millisecond)
	os.Exit(128 + int(sig))
}
