package boxrt

import (
	"bufio"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The kill and signal steps act on a running command of the exec step,
// from another exec, as root. Both wait for the command to have started
// (its uid in out/ID/uid, which only root can write, and its group
// leader in ID.t/pgid) a bounded time, and act as the command's uid, so
// nothing else can be reached.

// runKill is the kill step (ID): every process of the command's uid, a
// process that left the command's group by setsid included. It leaves
// out/ID/killed behind, which keeps a terminal exec that starts later
// from running the command at all.
func runKill(a []string) int {
	if len(a) != 1 || !hexID(a[0]) {
		return usage()
	}
	o, t := workDir+"/out/"+a[0], workDir+"/run/"+a[0]+".t"
	s := &execStep{errw: os.Stderr}
	for range 1000 {
		if isDir(o) && !exists(o+"/killed") {
			_ = touch(o + "/killed")
		}
		if u, err := strconv.Atoi(firstLine(o + "/uid")); err == nil && u >= firstUID && exists(t+"/pgid") {
			_ = s.as(u, u, -1, "", nil, nil, "kill", "-9", "-1")
			return 0
		}
		if exists(o + "/status") {
			return 0
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0
}

// runSignal is the signal step (ID SIGNAL): the signal to the command's
// main process; exit 3 when it has ended. The group leader is the
// command itself, or, on a terminal, the runtime's ttycmd step that
// measures it, whose child the signal then goes to.
func runSignal(a []string) int {
	if len(a) != 2 || !hexID(a[0]) {
		return usage()
	}
	sig, err := strconv.Atoi(a[1])
	if err != nil || sig <= 0 || sig > 64 {
		return usage()
	}
	o, t := workDir+"/out/"+a[0], workDir+"/run/"+a[0]+".t"
	s := &execStep{errw: os.Stderr}
	for range 1000 {
		if exists(o + "/status") {
			return 3
		}
		u, uerr := strconv.Atoi(firstLine(o + "/uid"))
		g, gerr := strconv.Atoi(firstLine(t + "/pgid"))
		if uerr == nil && gerr == nil && u >= firstUID && g > 0 {
			p := strconv.Itoa(g)
			if comm, _ := os.ReadFile("/proc/" + p + "/comm"); strings.TrimSpace(string(comm)) == Name {
				p = firstChild(p)
			}
			if p == "" {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if s.as(u, u, -1, "", nil, nil, "kill", "-"+a[1], p) != nil {
				return 3
			}
			return 0
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 3
}

// runLoop is a pooled exec's step: it reads one request a line (the
// exec step's arguments, NUL-separated, base64) and runs the exec step
// for each, in turn, its output on this exec's. A warm command then
// costs a line written to a stream that is already open, instead of a
// new exec, whose set-up in the engine is most of the cost of running
// `true`. The command's stdin is empty; commands with stdin get an exec
// of their own.
func runLoop(a []string) int {
	if len(a) != 0 {
		return usage()
	}
	self, err := os.Executable()
	if err != nil {
		self = toolsDir + "/" + Name
	}
	r := bufio.NewReaderSize(os.Stdin, 64<<10)
	for {
		line, err := r.ReadString('\n')
		if line = strings.TrimSuffix(line, "\n"); line != "" {
			// A line that does not decode runs nothing, and its job gets
			// no report: the host gives the stream up.
			if b, derr := base64.StdEncoding.DecodeString(line); derr == nil {
				c := exec.Command(self, append([]string{"exec"}, strings.Split(string(b), "\x00")...)...)
				c.Stdout, c.Stderr = os.Stdout, os.Stderr
				_ = c.Run()
			}
		}
		if err != nil {
			return 0
		}
	}
}

// firstChild is the first child process of pid p, or "". A child is
// listed under the thread that started it, and the runtime is a Go
// program, which starts a process from whichever of its threads the
// goroutine is on: every thread's list is read, not only the main one's.
func firstChild(p string) string {
	tasks, _ := filepath.Glob("/proc/" + p + "/task/[0-9]*/children")
	for _, f := range tasks {
		kids, _ := os.ReadFile(f)
		if c, _, _ := strings.Cut(strings.TrimSpace(string(kids)), " "); c != "" {
			return c
		}
	}
	return ""
}
