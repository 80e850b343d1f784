package docker

import (
	"context"
	"io"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/syncio"
	"github.com/pulse-agent/pulse/policy"
)

// TestDockerTTYCommandIsolated: a command on a terminal keeps what every
// command of the backend has: a uid of its own (20000+), the shared group
// only, no capability (an empty bounding set too), the seccomp filter (TIOCSTI into the terminal it
// controls is refused), its writes reported; and a concurrent command's
// uid can neither read nor write its terminal.
func TestDockerTTYCommandIsolated(t *testing.T) {
	b := newDocker(t)
	ws := probeWorkspace(t)
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	out := &syncio.Buffer{}
	p, err := b.Start(context.Background(), &backend.Request{
		ExecutionID: "tty", Workspace: ws, Stdin: stdinR, Stdout: out,
		TTY:     &backend.TTY{Rows: 24, Cols: 80},
		Network: policy.DenyAllNetwork(), Limits: policy.ResourceLimits{Timeout: 2 * time.Minute},
		Shell: `echo "uid=$(id -u) groups=$(id -G)"; grep -E 'CapEff|CapBnd' /proc/self/status; ./probe ttyinject
echo "tty=$(tty)"; echo made >made.txt; read -r l; echo "got $l"`,
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	var tty string
	for time.Now().Before(deadline) {
		if m := regexp.MustCompile(`tty=(/dev/pts/[0-9]+)\r\n`).FindStringSubmatch(out.String()); m != nil {
			tty = m[1]
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if tty == "" {
		_ = p.Kill()
		t.Fatalf("the command did not report its terminal: %q", out.String())
	}
	// Another command, another uid: the terminal is not its to open.
	r := execShell(t, b, t.TempDir(), `if echo OTHER >`+tty+`; then echo wrote; fi 2>/dev/null; if head -c1 `+tty+`; then echo read; fi 2>/dev/null; echo checked`)
	if strings.Contains(r.stdout, "wrote") || strings.Contains(r.stdout, "read") || !strings.Contains(r.stdout, "checked") {
		t.Errorf("a concurrent command reached the terminal %s: %q (stderr %q)", tty, r.stdout, r.stderr)
	}
	if _, err := io.WriteString(stdinW, "fine\n"); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if res.ExitCode != 0 || !strings.Contains(got, "got fine\r\n") {
		t.Fatalf("exit %d, terminal %q", res.ExitCode, got)
	}
	if m := regexp.MustCompile(`uid=(\d+) groups=(\d+)\r\n`).FindStringSubmatch(got); m == nil || len(m[1]) != 5 || m[1] < "20000" || m[2] != "19999" {
		t.Errorf("the command's ids: %q, want a uid of 20000 and up and group 19999 only", got)
	}
	if !strings.Contains(got, "CapEff:\t0000000000000000") {
		t.Errorf("the command has capabilities: %q", got)
	}
	if !strings.Contains(got, "CapBnd:\t0000000000000000") {
		t.Errorf("the command's bounding set is not empty: %q", got)
	}
	if !strings.Contains(got, "refused: operation not permitted") || strings.Contains(got, "ESCAPED") {
		t.Errorf("TIOCSTI into its terminal was not refused: %q", got)
	}
	if strings.Contains(got, "OTHER") {
		t.Errorf("a concurrent command wrote to the terminal: %q", got)
	}
	if res.Overlay == nil || !hasFile(res.Overlay, "made.txt") {
		t.Errorf("the command's write is not in its overlay: %+v", res.Overlay)
	}
}

func hasFile(ov *backend.Overlay, name string) bool {
	for _, f := range ov.Files {
		if f.Path == name {
			return true
		}
	}
	return false
}

// TestDockerTTYKilledBeforeItsTerminal: a command killed while its
// terminal exec has not started yet (the engine slower than the kill
// script waits) never runs: the kill leaves a mark the terminal exec
// checks first.
func TestDockerTTYKilledBeforeItsTerminal(t *testing.T) {
	b := newDocker(t)
	ws := t.TempDir()
	// The hook below holds the kill's wait open for as long as the
	// engine takes to run its scripts; the grace stands for an engine
	// slower than the hook, not for the default.
	grace := killGrace
	killGrace = 5 * time.Minute
	t.Cleanup(func() { killGrace = grace })
	// The kill is sent once the terminal exec is about to be created
	// (reached), and the exec is held until the kill script has marked
	// the command and given up waiting for it.
	reached := make(chan struct{}) // the test's one terminal command reaches it once
	ttyBeforeLaunch = func(containerID, id string) {
		close(reached)
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			code, err := b.runScript(context.Background(), containerID,
				`[ -e /work/out/$1/killed ] && ! ps | grep -v grep | grep -q pulse-kill`, "gone", id)
			if err == nil && code == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("the kill script of %s neither marked it nor ended in two minutes", id)
	}
	t.Cleanup(func() { ttyBeforeLaunch = nil })
	out := &syncio.Buffer{}
	p, err := b.Start(context.Background(), &backend.Request{
		ExecutionID: "tty-kill", Workspace: ws, Stdout: out, TTY: &backend.TTY{Rows: 24, Cols: 80},
		Network: policy.DenyAllNetwork(), Limits: policy.ResourceLimits{Timeout: 2 * time.Minute},
		Shell: `touch /tmp/tty-ran-marker; sleep 600`,
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-reached:
	case <-time.After(2 * time.Minute):
		t.Fatal("the terminal exec was not about to start in two minutes")
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.Termination != backend.Cancelled {
		t.Errorf("termination %q, want %q", res.Termination, backend.Cancelled)
	}
	ttyBeforeLaunch = nil
	r := execShell(t, b, ws, `if [ -e /tmp/tty-ran-marker ]; then echo RAN; else echo absent; fi`)
	if !strings.Contains(r.stdout, "absent") {
		t.Fatalf("the killed command ran: %q (terminal %q)", r.stdout, out.String())
	}
}

// runScript runs a root script of the backend's in the container and
// returns its exit code.
func (b *Backend) runScript(ctx context.Context, containerID, script string, args ...string) (int, error) {
	return b.runCmd(ctx, containerID, append([]string{b.shell(), "-c", script}, args...)...)
}

// A signal reaches a command on a terminal, not the runtime that
// measures it (the tty step's child), and ^C-style signals the runtime
// ignores do not end the measuring before the command.
func TestDockerTTYSignalReachesTheCommand(t *testing.T) {
	b := newDocker(t)
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	out := &syncio.Buffer{}
	p, err := b.Start(context.Background(), &backend.Request{
		ExecutionID: "ttysig", Workspace: t.TempDir(), Stdin: stdinR, Stdout: out,
		TTY:     &backend.TTY{Rows: 24, Cols: 80},
		Network: policy.DenyAllNetwork(), Limits: policy.ResourceLimits{Timeout: 2 * time.Minute},
		Shell: `trap 'echo usr1; exit 6' USR1; echo ready; while :; do sleep 0.05; done`,
	})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); !strings.Contains(out.String(), "ready\r\n"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = p.Kill()
			t.Fatalf("the command did not start: %q", out.String())
		}
	}
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 6 || !strings.Contains(out.String(), "usr1") {
		t.Fatalf("exit %d, output %q; want the USR1 trap's exit 6", res.ExitCode, out.String())
	}
}
