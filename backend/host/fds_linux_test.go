package host_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
)

// outerEnv makes TestHostOuterProcess the caller of the backend (the role
// `pulse exec` plays): it runs the script in outerScriptEnv in the
// workspace outerWSEnv and prints what it wrote.
const (
	outerEnv       = "PULSE_HOST_TEST_OUTER"
	outerScriptEnv = "PULSE_HOST_TEST_OUTER_SCRIPT"
	outerWSEnv     = "PULSE_HOST_TEST_OUTER_WS"
)

// TestHostOuterProcess is not a test: it is the caller that other tests
// start under the conditions they examine.
func TestHostOuterProcess(t *testing.T) {
	if os.Getenv(outerEnv) == "" {
		t.Skip("helper process for tests that start a caller of the backend")
	}
	b, err := host.New()
	if err != nil {
		fmt.Println("outer:", err)
		os.Exit(125)
	}
	res, err := b.Exec(context.Background(), &backend.Request{
		Workspace: os.Getenv(outerWSEnv), Shell: os.Getenv(outerScriptEnv),
		Stdout: os.Stdout, Stderr: os.Stdout, Network: policy.NetworkPolicy{Mode: policy.NetworkAllowAll},
		Limits: policy.ResourceLimits{Timeout: time.Minute},
	})
	if err != nil {
		fmt.Println("outer:", err)
		os.Exit(125)
	}
	os.Exit(res.ExitCode)
}

// outerCmd starts the test binary as a caller of the backend (see
// TestHostOuterProcess) running script, from a bash that first runs pre.
func outerCmd(t *testing.T, pre, script string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", append([]string{"-c", pre + `; exec "$0" -test.run='^TestHostOuterProcess$'`, exe}, args...)...)
	cmd.Env = append(os.Environ(), outerEnv+"=1", outerScriptEnv+"="+script, outerWSEnv+"="+t.TempDir(), "GORACE=atexit_sleep_ms=0")
	return cmd
}

// TestInheritedDescriptorsDoNotReachCommand: a caller started from a
// shell that did `exec 8>>file; exec 9</dir` holds both without
// close-on-exec; the command sees neither.
func TestInheritedDescriptorsDoNotReachCommand(t *testing.T) {
	newBackend(t)
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "hostfile")
	secretDir := filepath.Join(dir, "secret")
	if err := os.Mkdir(secretDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secretDir, "shadow"), []byte("SECRET-CONTENT\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := outerCmd(t, `exec 8>>"$1"; exec 9<"$2"`,
		`echo WRITTEN >&8; cat /proc/self/fd/9/shadow; ls /proc/self/fd | tr '\n' ' '`, hostFile, secretDir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Logf("caller: %v", err)
	}
	if got, _ := os.ReadFile(hostFile); len(got) != 0 {
		t.Errorf("the command wrote through a descriptor its caller inherited: %q", got)
	}
	if strings.Contains(string(out), "SECRET-CONTENT") {
		t.Errorf("the command read through a directory descriptor its caller inherited: %q", out)
	}
	if !strings.Contains(string(out), "0 1 2 3 ") || strings.Contains(string(out), " 8 ") || strings.Contains(string(out), " 9 ") {
		t.Errorf("the command's descriptors: %q, want 0 1 2 and the one ls reads with", out)
	}
}

// TestCommandCannotOpenCallersTerminal: a caller on a terminal (an
// interactive `pulse exec --unsafe-host`) runs a command that tries to
// open that terminal to type into it; it has no controlling terminal.
func TestCommandCannotOpenCallersTerminal(t *testing.T) {
	newBackend(t)
	_, s := testenv.OpenPTY(t)
	cmd := outerCmd(t, "true", `if exec 3<>/dev/tty; then echo TTY-OPENED; else echo no-tty; fi 2>/dev/null`)
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s, &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Run(); err != nil {
		t.Logf("caller: %v", err)
	}
	if !strings.Contains(out.String(), "no-tty") {
		t.Fatalf("the command opened its caller's terminal: %q", out.String())
	}
}
