package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/daemon"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// daemonRig is a built pulse binary, a workspace to run it in and the
// environment its runs share: its own runtime dir (so its own daemons),
// cache dir and keep-warm time.
type daemonRig struct {
	t    *testing.T
	bin  string
	rt   string
	ws   string
	env  []string
	args []string // the backend flags
}

// newDaemonRig builds cmd/pulse: these tests run the real binary, whose
// main hands exec and cow to the daemon (the test binary as pulse does
// not).
func newDaemonRig(t *testing.T) *daemonRig {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the pulse binary; skipped with -short")
	}
	// Short, and open to other users (the two-user test runs the binary
	// as another uid): a socket path must fit a socket address.
	root, err := os.MkdirTemp("/tmp", "pd")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	must(t, os.Chmod(root, 0o755))
	bin := filepath.Join(root, "pulse")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	r := &daemonRig{t: t, bin: bin, rt: filepath.Join(root, "rt"), ws: filepath.Join(root, "ws")}
	must(t, os.Mkdir(r.rt, 0o700))
	must(t, os.Mkdir(r.ws, 0o755))
	must(t, os.WriteFile(filepath.Join(r.ws, "README"), []byte("hello\n"), 0o644))
	r.env = append(os.Environ(), "XDG_RUNTIME_DIR="+r.rt, "XDG_CACHE_HOME="+filepath.Join(root, "cache"),
		"PULSE_KEEP_WARM=1m", noDaemonEnv+"=")
	r.args = []string{"--backend", "namespace"}
	if code, _, stderr := r.run(true, "", "exec", "--", "true"); code != 0 {
		t.Logf("namespace backend unavailable here (%s); the host backend runs the commands", strings.TrimSpace(stderr))
		r.args = []string{"--backend", "host", "--unsafe-host=network,secrets"}
	}
	t.Cleanup(func() {
		// Every daemon of the rig's runtime dir: stop it.
		r.run(true, "", "daemon", "stop")
	})
	return r
}

// command returns pulse ARGS in the rig's workspace and environment;
// inProcess sets PULSE_NO_DAEMON.
func (r *daemonRig) command(inProcess bool, args ...string) *exec.Cmd {
	return r.commandIn(r.ws, inProcess, args...)
}

func (r *daemonRig) commandIn(dir string, inProcess bool, args ...string) *exec.Cmd {
	if len(args) > 0 && args[0] == "exec" {
		args = append(append([]string{"exec"}, r.args...), args[1:]...)
	}
	cmd := exec.Command(r.bin, args...)
	cmd.Dir = dir
	cmd.Env = r.env
	if inProcess {
		cmd.Env = append(cmd.Env[:len(cmd.Env):len(cmd.Env)], noDaemonEnv+"=1")
	}
	return cmd
}

func (r *daemonRig) run(inProcess bool, stdin string, args ...string) (int, string, string) {
	return r.runIn(r.ws, inProcess, stdin, args...)
}

func (r *daemonRig) runIn(dir string, inProcess bool, stdin string, args ...string) (int, string, string) {
	cmd := r.commandIn(dir, inProcess, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		r.t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// serve starts the daemon of the rig's workspace and environment in the
// foreground, as the first pulse exec would start it, and waits until it
// answers.
func (r *daemonRig) serve() *exec.Cmd {
	r.t.Helper()
	cmd := r.command(false, "daemon", "serve", "--log")
	var log testenv.SyncBuffer
	cmd.Stderr = &log
	must(r.t, cmd.Start())
	r.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if r.t.Failed() {
			r.t.Logf("daemon log:\n%s", log.String())
		}
	})
	testenv.Eventually(r.t, 30*time.Second, func() error {
		if _, err := r.status(); err != nil {
			return err
		}
		return nil
	})
	return cmd
}

type daemonStatus struct {
	Running bool  `json:"running"`
	Pid     int   `json:"pid"`
	Served  int64 `json:"served"`
	Active  int   `json:"active"`
}

func (r *daemonRig) status() (daemonStatus, error) {
	code, out, stderr := r.run(true, "", "daemon", "status", "--json")
	var st daemonStatus
	if code != 0 {
		return st, fmt.Errorf("pulse daemon status: exit %d: %s", code, stderr)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return st, err
	}
	if !st.Running {
		return st, errors.New("no daemon runs")
	}
	return st, nil
}

// volatile matches what differs between two runs of the same command:
// durations, times, transaction and execution ids.
var volatile = regexp.MustCompile(`\b[0-9a-f]{16,32}\b|in [0-9.]+(ms|s|µs)\b|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d`)

// TestDaemonRunsCommandsAsAProcessOfItsOwnWould runs a sequence of
// commands in pulse processes of their own (PULSE_NO_DAEMON=1) in one
// workspace, and the same sequence through the daemon in a copy of it,
// and compares exit code, stdout and stderr of each, byte for byte once
// durations, ids and the workspace's path are masked.
func TestDaemonRunsCommandsAsAProcessOfItsOwnWould(t *testing.T) {
	r := newDaemonRig(t)
	r.serve()
	alone := filepath.Join(filepath.Dir(r.ws), "alone")
	must(t, os.Mkdir(alone, 0o755))
	must(t, os.WriteFile(filepath.Join(alone, "README"), []byte("hello\n"), 0o644))
	rows := []struct {
		name  string
		stdin string
		args  []string
	}{
		{"stdout and stderr", "", []string{"exec", "--", "sh", "-c", "echo out; echo err >&2"}},
		{"stdin", "line 1\nline 2\n", []string{"exec", "--", "cat"}},
		{"exit code", "", []string{"exec", "--", "sh", "-c", "echo before; exit 3"}},
		{"script with a pipe", "", []string{"exec", "printf 'b\\na\\n' | sort"}},
		{"binary output", "", []string{"exec", "--", "printf", "\\000\\377\\033[31m"}},
		{"a write", "", []string{"exec", "--", "sh", "-c", "echo made >> made.txt"}},
		{"cow list", "", []string{"cow", "list"}},
		{"cow diff", "", []string{"cow", "diff"}},
		{"usage error", "", []string{"exec"}},
		{"unknown flag", "", []string{"exec", "--no-such-flag", "--", "true"}},
		{"timeout", "", []string{"exec", "--timeout", "1s", "--", "sleep", "30"}},
		{"cow discard", "", []string{"cow", "discard", "--all"}},
	}
	before, err := r.status()
	must(t, err)
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			code1, out1, err1 := r.runIn(alone, true, row.stdin, row.args...)
			code2, out2, err2 := r.run(false, row.stdin, row.args...)
			out1, err1 = strings.ReplaceAll(out1, alone, "WS"), strings.ReplaceAll(err1, alone, "WS")
			out2, err2 = strings.ReplaceAll(out2, r.ws, "WS"), strings.ReplaceAll(err2, r.ws, "WS")
			if code1 != code2 {
				t.Errorf("exit code: in-process %d, daemon %d", code1, code2)
			}
			if m1, m2 := volatile.ReplaceAllString(out1, "X"), volatile.ReplaceAllString(out2, "X"); m1 != m2 {
				t.Errorf("stdout differs:\nin-process: %q\ndaemon:     %q", out1, out2)
			}
			if m1, m2 := volatile.ReplaceAllString(err1, "X"), volatile.ReplaceAllString(err2, "X"); m1 != m2 {
				t.Errorf("stderr differs:\nin-process: %q\ndaemon:     %q", m1, m2)
			}
		})
	}
	after, err := r.status()
	must(t, err)
	if got := after.Served - before.Served; got != int64(len(rows)) {
		t.Errorf("the daemon served %d of the %d commands", got, len(rows))
	}
}

// startedRun starts pulse exec of script, which prints "started" once it
// runs, and waits for that line.
func (r *daemonRig) startedRun(inProcess bool, script string) (*exec.Cmd, *testenv.SyncBuffer) {
	r.t.Helper()
	cmd := r.command(inProcess, "exec", "--", "sh", "-c", script)
	out, err := cmd.StdoutPipe()
	must(r.t, err)
	var errOut testenv.SyncBuffer
	cmd.Stderr = &errOut
	must(r.t, cmd.Start())
	r.t.Cleanup(func() { cmd.Process.Kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "started\n" {
		cmd.Process.Kill()
		r.t.Fatalf("did not start: %q %v; stderr: %s", line, err, errOut.String())
	}
	go io.Copy(io.Discard, out)
	return cmd, &errOut
}

func waitExit(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	err := testenv.Recv(t, done, time.Minute, "pulse's exit")
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode()
}

func TestDaemonForwardsInterrupt(t *testing.T) {
	r := newDaemonRig(t)
	r.serve()
	for _, inProcess := range []bool{true, false} {
		cmd, errOut := r.startedRun(inProcess, "echo started; exec sleep 60")
		must(t, cmd.Process.Signal(syscall.SIGINT))
		if code := waitExit(t, cmd); code != 130 {
			t.Errorf("in-process=%v: exit %d after SIGINT, want 130; stderr: %s", inProcess, code, errOut.String())
		}
	}
	// The daemon lives on and serves the next command.
	if code, out, stderr := r.run(false, "", "exec", "--", "echo", "next"); code != 0 || out != "next\n" {
		t.Fatalf("after the interrupt: exit %d %q %s", code, out, stderr)
	}
}

func TestDaemonKilledMidCommandIsReported(t *testing.T) {
	r := newDaemonRig(t)
	d := r.serve()
	// A transaction pending before the kill, made through the daemon:
	// it must come through the kill as it was.
	if code, _, stderr := r.run(false, "", "exec", "--", "sh", "-c", "echo kept > pending.txt"); code != 0 {
		t.Fatalf("the first command: exit %d: %s", code, stderr)
	}
	code, pendingBefore, stderr := r.run(true, "", "cow", "list", "--json")
	if code != 0 || !strings.Contains(pendingBefore, "pending.txt") {
		t.Fatalf("cow list before the kill: exit %d %q %s", code, pendingBefore, stderr)
	}
	// The command's own marker: no process of it may outlive the kill.
	marker := fmt.Sprintf("%d", 7_000_000+os.Getpid()%1_000_000)
	cmd, errOut := r.startedRun(false, "echo written > half.txt; echo started; exec sleep "+marker)
	st, err := r.status()
	must(t, err)
	if st.Active != 1 || st.Pid != d.Process.Pid {
		t.Fatalf("status %+v: want the command running in daemon %d", st, d.Process.Pid)
	}
	must(t, d.Process.Kill())
	if code := waitExit(t, cmd); code != exitSandbox {
		t.Errorf("exit %d, want %d", code, exitSandbox)
	}
	msg := errOut.String()
	if !strings.Contains(msg, "daemon that ran the command ended before the command did") || !strings.Contains(msg, "pulse cow list") {
		t.Errorf("stderr does not say what happened: %q", msg)
	}
	// Nothing half made: the workspace untouched, and the review state
	// readable, holding the transaction pending before and none of the
	// lost command.
	for _, name := range []string{"half.txt", "pending.txt"} {
		if _, err := os.Stat(filepath.Join(r.ws, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s in the workspace before any commit: %v", name, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(r.ws, "README")); err != nil || string(got) != "hello\n" {
		t.Errorf("README after the kill: %q %v", got, err)
	}
	code, out, stderr := r.run(true, "", "cow", "list", "--json")
	if code != 0 || out != pendingBefore {
		t.Errorf("cow list after the kill: exit %d %q %s; before it: %q", code, out, stderr, pendingBefore)
	}
	// The lost command is not left running (it could write on).
	testenv.Eventually(t, 30*time.Second, func() error {
		if pid := processWithArg(marker); pid != 0 {
			return fmt.Errorf("process %d of the lost command still runs", pid)
		}
		return nil
	})
	// The pending transaction commits as it would have.
	if code, _, stderr := r.run(true, "", "cow", "commit", "--all"); code != 0 {
		t.Fatalf("cow commit --all after the kill: exit %d: %s", code, stderr)
	}
	if got, err := os.ReadFile(filepath.Join(r.ws, "pending.txt")); err != nil || string(got) != "kept\n" {
		t.Errorf("pending.txt once committed: %q %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(r.ws, "half.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half.txt in the workspace after the commit: %v", err)
	}
	// The next command runs (in-process, starting a new daemon).
	if code, out, stderr := r.run(false, "", "exec", "--", "echo", "again"); code != 0 || out != "again\n" {
		t.Fatalf("after the kill: exit %d %q %s", code, out, stderr)
	}
}

// TestDaemonOfAnotherUserIsNotReached runs pulse as another uid pointed
// at this user's runtime dir: it must not reach this user's daemon (the
// directory is not its own), and runs its command itself.
func TestDaemonOfAnotherUserIsNotReached(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as another uid")
	}
	r := newDaemonRig(t)
	r.args = []string{"--backend", "host", "--unsafe-host=network,secrets"}
	r.serve()
	before, err := r.status()
	must(t, err)
	const nobody = 65534
	home := filepath.Join(filepath.Dir(r.bin), "home")
	must(t, os.Mkdir(home, 0o700))
	must(t, os.Chown(home, nobody, nobody))
	ws := filepath.Join(home, "ws")
	must(t, os.Mkdir(ws, 0o755))
	must(t, os.Chown(ws, nobody, nobody))
	// The runtime dir the daemon's socket is in: reachable by path.
	must(t, os.Chmod(r.rt, 0o755))
	cmd := exec.Command(r.bin, "exec", "--backend", "host", "--unsafe-host=network,secrets", "--", "sh", "-c", "id -u")
	cmd.Dir = ws
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_RUNTIME_DIR=" + r.rt, "PULSE_KEEP_WARM=1m"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("pulse as uid %d: %v: %s", nobody, err, errOut.String())
	}
	if got := strings.TrimSpace(out.String()); got != fmt.Sprint(nobody) {
		t.Errorf("the command ran as uid %q, want %d", got, nobody)
	}
	after, err := r.status()
	must(t, err)
	if after.Served != before.Served {
		t.Errorf("this user's daemon served a command of uid %d", nobody)
	}
	if ents, _ := filepath.Glob(filepath.Join(r.rt, "pulse-daemon", "*")); len(ents) != 2 {
		t.Errorf("the runtime dir holds %v: uid %d left something in it", ents, nobody)
	}
}

// TestDaemonFrontHandsOffAndFallsBack: the thin front end
// (internal/daemon/front), installed as make build installs it (pulse,
// the binary beside it as pulse-full), hands exec to the binary's daemon,
// and executes the binary for the rest and where it must not.
func TestDaemonFrontHandsOffAndFallsBack(t *testing.T) {
	r := newDaemonRig(t)
	inst := filepath.Join(filepath.Dir(r.bin), "inst")
	must(t, os.Mkdir(inst, 0o755))
	front := filepath.Join(inst, "pulse")
	build := exec.Command("go", "build", "-o", front, "../../internal/daemon/front")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// A hard link: the very executable the rig's daemon runs, which the
	// front end checks its daemon against.
	must(t, os.Link(r.bin, filepath.Join(inst, "pulse-full")))
	r.serve()
	runFront := func(extra []string, args ...string) (int, string, string) {
		cmd := exec.Command(front, args...)
		cmd.Dir, cmd.Env = r.ws, append(r.env[:len(r.env):len(r.env)], extra...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
	}
	backend := append([]string{"exec"}, r.args...)
	for _, tc := range []struct {
		name   string
		extra  []string
		args   []string
		served int64
		code   int
		out    string
	}{
		{"exec through the daemon", nil, append(backend, "--", "sh", "-c", "echo hi; exit 4"), 1, 4, "hi\n"},
		{"PULSE_NO_DAEMON runs it in-process", []string{noDaemonEnv + "=1"}, append(backend, "--", "echo", "alone"), 0, 0, "alone\n"},
		{"cow through the daemon", nil, []string{"cow", "list", "--json"}, 1, 0, "[]\n"},
		{"another command runs in the binary", nil, []string{"version", "--json"}, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := r.status()
			must(t, err)
			code, out, stderr := runFront(tc.extra, tc.args...)
			if code != tc.code || (tc.out != "" && out != tc.out) {
				t.Fatalf("exit %d, stdout %q, want %d %q; stderr: %s", code, out, tc.code, tc.out, stderr)
			}
			after, err := r.status()
			must(t, err)
			if got := after.Served - before.Served; got != tc.served {
				t.Errorf("the daemon served %d command(s), want %d", got, tc.served)
			}
		})
	}
	// Without the full binary beside it, or with the front end itself
	// under that name, the front end says so and exits 3 (not a loop of
	// execs of itself).
	for _, tc := range []struct{ name, full, want string }{
		{"no pulse-full beside it", "", "pulse-full is missing"},
		{"itself as pulse-full", "self", "is this front end itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Beside the rig's binary: a hard link stays in one file system.
			dir, err := os.MkdirTemp(filepath.Dir(r.bin), "lone")
			must(t, err)
			lone := filepath.Join(dir, "pulse")
			must(t, os.Link(front, lone))
			if tc.full == "self" {
				must(t, os.Link(front, filepath.Join(dir, "pulse-full")))
			}
			cmd := exec.Command(lone, "version")
			cmd.Dir, cmd.Env = r.ws, r.env
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), tc.want) {
				t.Fatalf("got %v, output %q; want exit 3 and %q", err, out, tc.want)
			}
		})
	}
}

// processWithArg returns the pid of a process one of whose arguments is
// arg, 0 when none.
func processWithArg(arg string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(cmdline), "\x00"), arg) {
			return pid
		}
	}
	return 0
}

// TestDaemonDirOfAnotherUserIsNeverUsed is the other side of the two
// users: this user's runtime dir holds a pulse-daemon directory that
// another uid made, and a daemon of that uid listens in it on the very
// socket this user's command would dial (the same binary, directory and
// environment give the same name). pulse must not hand it anything: the
// command runs in its own process, as this user, and the other uid's
// daemon never sees a request.
func TestDaemonDirOfAnotherUserIsNeverUsed(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as another uid")
	}
	const nobody = 65534
	r := newDaemonRig(t)
	r.args = []string{"--backend", "host", "--unsafe-host=network,secrets"}
	// A runtime dir that both can pass through, and its pulse-daemon
	// directory made by uid 65534 first.
	rt := filepath.Join(filepath.Dir(r.bin), "shared-rt")
	must(t, os.Mkdir(rt, 0o755))
	must(t, os.Mkdir(filepath.Join(rt, "pulse-daemon"), 0o700))
	must(t, os.Chown(filepath.Join(rt, "pulse-daemon"), nobody, nobody))
	cache := filepath.Join(filepath.Dir(r.bin), "cache-nobody")
	must(t, os.Mkdir(cache, 0o700))
	must(t, os.Chown(cache, nobody, nobody))
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "XDG_RUNTIME_DIR=" + rt,
		"XDG_CACHE_HOME=" + cache, "PULSE_KEEP_WARM=1m"}
	// The other uid's daemon, serving this directory and environment.
	other := exec.Command(r.bin, "daemon", "serve", "--log")
	other.Dir, other.Env = r.ws, env
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	var log testenv.SyncBuffer
	other.Stdout, other.Stderr = &log, &log
	must(t, other.Start())
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	testenv.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(log.String(), "daemon: listening") {
			return fmt.Errorf("the daemon of uid %d is not listening: %s", nobody, log.String())
		}
		return nil
	})
	socks, _ := filepath.Glob(filepath.Join(rt, "pulse-daemon", "*.sock"))
	if want := filepath.Join(rt, "pulse-daemon", daemon.NameFor(r.bin, r.ws, env)+".sock"); len(socks) != 1 || socks[0] != want {
		t.Fatalf("sockets of uid %d: %v, want the one uid 0 dials, %s", nobody, socks, want)
	}
	if st, err := os.Stat(socks[0]); err != nil || st.Sys().(*syscall.Stat_t).Uid != nobody {
		t.Fatalf("the socket is not uid %d's: %v", nobody, err)
	}
	for i := range 2 {
		cmd := exec.Command(r.bin, "exec", "--backend", "host", "--unsafe-host=network,secrets", "--", "sh", "-c", "id -u")
		cmd.Dir, cmd.Env = r.ws, env
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("run %d: pulse as uid 0 beside a daemon of uid %d: %v: %s", i, nobody, err, errOut.String())
		}
		if got := strings.TrimSpace(out.String()); got != "0" {
			t.Errorf("run %d: the command ran as uid %q, want 0", i, got)
		}
		if strings.Contains(errOut.String(), "daemon") {
			t.Errorf("run %d: falling back said something: %s", i, errOut.String())
		}
	}
	if strings.Contains(log.String(), "daemon: running") {
		t.Errorf("the daemon of uid %d ran a command of uid 0:\n%s", nobody, log.String())
	}
	// And the directory is still the other uid's alone: nothing of uid
	// 0's in it (no socket, no lock of a daemon it started there).
	ents, _ := os.ReadDir(filepath.Join(rt, "pulse-daemon"))
	for _, e := range ents {
		info, err := e.Info()
		if err == nil && info.Sys().(*syscall.Stat_t).Uid != nobody {
			t.Errorf("%s in the directory of uid %d is uid %d's", e.Name(), nobody, info.Sys().(*syscall.Stat_t).Uid)
		}
	}
}
