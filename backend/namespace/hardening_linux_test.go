package namespace

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestTerminalInjectionRefusedBySeccomp: a command that makes a terminal
// its controlling terminal, where the kernel alone would let it push
// input, is refused TIOCSTI (also with high bits set in the request).
func TestTerminalInjectionRefusedBySeccomp(t *testing.T) {
	b, exe := helperBackend(t)
	out := runHelperIn(t, b, exe, "tiocsti")
	if !strings.HasPrefix(out, "refused: operation not permitted") {
		t.Fatalf("TIOCSTI on the sandbox's own terminal: %q, want refused with EPERM", out)
	}
}

// outerCmd is the test binary started as a caller of the backend (see
// runOuter) that runs script.
func outerCmd(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), outerEnv+"=1", outerScriptEnv+"="+script,
		outerStateEnv+"="+filepath.Join(t.TempDir(), "state"), outerWSEnv+"="+t.TempDir(),
		"GORACE=atexit_sleep_ms=0")
	return cmd
}

// TestTerminalOfCallerUnreachable runs the caller on a terminal of its
// own, as `pulse exec` runs in an interactive shell, with that terminal as
// the command's stdin: the command cannot open it (/dev/tty) nor push
// input into it, and nothing lands in its input queue for the shell that
// reads it after pulse exits.
func TestTerminalOfCallerUnreachable(t *testing.T) {
	newBackend(t) // skips where namespaces are unavailable
	master, slave := testenv.OpenPTY(t)
	cmd := outerCmd(t, helperEnv+`=ttyinject "$PULSE_TEST_EXE"; true`)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	var out bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(&out, master) }()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	werr := cmd.Wait()
	// What the command typed, if anything, waits in the input queue.
	queued, err := unix.IoctlGetInt(int(slave.Fd()), unix.TIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	// Reading the master ends with EIO once no one holds the slave.
	slave.Close()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		master.Close()
		<-done
	}
	if werr != nil {
		t.Fatalf("caller: %v: %s", werr, out.String())
	}
	if queued != 0 {
		t.Fatalf("the command pushed %d bytes into the caller's terminal: %s", queued, out.String())
	}
	if !strings.Contains(out.String(), "refused:") {
		t.Fatalf("the command reached the caller's terminal: %q", out.String())
	}
}

// TestInheritedDescriptorsDoNotReachCommand: a caller started from a
// shell that did `exec 8>>file; exec 9</dir` holds both without
// close-on-exec; the command must see neither (no write to the host file
// past the overlay, no walk of the host's tree through /proc/self/fd/9).
func TestInheritedDescriptorsDoNotReachCommand(t *testing.T) {
	newBackend(t)
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "hostfile")
	secretDir := filepath.Join(dir, "secret")
	writeFile(t, filepath.Join(secretDir, "shadow"), "SECRET-CONTENT\n")
	writeFile(t, hostFile, "")
	script := `echo WRITTEN >&8; cat /proc/self/fd/9/shadow; ls /proc/self/fd | tr '\n' ' '`
	outer := outerCmd(t, script)
	sh := exec.Command("bash", "-c", `exec 8>>"$1"; exec 9<"$2"; exec "$3"`, "bash", hostFile, secretDir, outer.Path)
	sh.Env = outer.Env
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Logf("caller: %v", err)
	}
	got, _ := os.ReadFile(hostFile)
	if len(got) != 0 {
		t.Errorf("the command wrote the host file through an inherited descriptor: %q", got)
	}
	if strings.Contains(string(out), "SECRET-CONTENT") {
		t.Errorf("the command read a host file through an inherited directory descriptor: %q", out)
	}
	if !strings.Contains(string(out), "0 1 2 3 ") || strings.Contains(string(out), " 8 ") || strings.Contains(string(out), " 9 ") {
		t.Errorf("the command's descriptors: %q, want 0 1 2 and the one ls reads with", out)
	}
}

// TestDefaultLimitsBoundForkBombAndMemory: with no limits asked for, a
// command can neither start 1,200 processes (a fork bomb would take the
// host's pid space) nor hold 1 GiB, wherever a cgroup can enforce it (on
// this machine's v1 controllers as on a pure v2 host).
func TestDefaultLimitsBoundForkBombAndMemory(t *testing.T) {
	b, exe := helperBackend(t)
	caps := b.Capabilities()
	if caps.Limits["pids"] != "strong" || caps.Limits["memory_bytes"] != "strong" {
		t.Skipf("no writable pids and memory cgroups here: %v", caps.Limits)
	}
	res, out, errs := runCmd(t, b, &backend.Request{
		Workspace: t.TempDir(),
		Shell:     `n=0; while [ $n -lt 1200 ]; do sleep 600 & [ $? = 0 ] || break; n=$((n+1)); done 2>/dev/null; echo started=$n`,
	})
	if strings.Contains(out, "started=1200") {
		t.Errorf("1,200 processes started under the default limits: %q %q (%s)", out, errs, res.Termination)
	}
	res, out, errs = runCmd(t, b, &backend.Request{
		Workspace: t.TempDir(),
		Shell:     strconv.Quote(exe) + " 1100; true",
		Env:       map[string]string{helperEnv: "alloc", "GORACE": "atexit_sleep_ms=0"},
	})
	if strings.Contains(out, "ESCAPED") {
		t.Errorf("1.1 GiB held under the default limits: %q %q (%s)", out, errs, res.Termination)
	}
}
