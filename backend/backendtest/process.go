package backendtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// The background-process cases run on a backend that implements
// backend.Starter and skip, saying so, on one that does not.

// starter returns the case's backend as a Starter, or skips.
func (e *env) starter() backend.Starter {
	e.t.Helper()
	st, ok := e.b.(backend.Starter)
	if !ok {
		e.t.Skipf("backend %s does not implement backend.Starter", e.b.Name())
	}
	return st
}

// start starts req and fails the case when Start does.
func (e *env) start(req *backend.Request) backend.Process {
	e.t.Helper()
	p, err := e.starter().Start(context.Background(), e.request(req))
	if err != nil {
		e.t.Fatalf("Start(%s): %v", describe(req), err)
	}
	e.t.Cleanup(func() { _ = p.Kill() })
	return p
}

// waitFor waits until out holds want, failing the case after a while.
func (e *env) waitFor(out *recorder, want string) {
	e.t.Helper()
	deadline := time.Now().Add(e.s.d(20 * time.Second))
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			e.t.Fatalf("output %q never held %q", out.String(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testStartWait: Start returns while the command runs (it waits for
// input that only comes after Start returned), and Wait returns what Exec
// would: the exit code, the output, the writes.
func testStartWait(t *testing.T, s *suite) {
	e := s.setup(t)
	stdinR, stdinW := io.Pipe()
	out := &recorder{}
	p := e.start(&backend.Request{Shell: `read x; echo "got $x"; echo "$x" > started.txt; exit 4`, Stdin: stdinR, Stdout: out})
	if _, err := io.WriteString(stdinW, "go\n"); err != nil {
		t.Fatalf("stdin: %v (the command did not run after Start returned)", err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 4 || res.Termination != backend.Exited || out.String() != "got go\n" {
		t.Fatalf("exit %d %q, stdout %q", res.ExitCode, res.Termination, out.String())
	}
	if again, err := p.Wait(); again != res || err != nil {
		t.Error("a second Wait returned something else")
	}
	if e.captures() {
		if data, ok := e.written(res, "started.txt"); !ok || string(data) != "go\n" {
			t.Errorf("overlay started.txt = %q, %v", data, ok)
		}
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("Signal after the end = %v, want ErrProcessDone", err)
	}
	if err := p.Kill(); err != nil {
		t.Errorf("Kill after the end = %v, want nil", err)
	}
}

// testStartKillTree: Kill ends the command and the grandchildren it left
// in the background, and returns only once none of them runs.
func testStartKillTree(t *testing.T, s *suite) {
	e := s.setup(t)
	out := &recorder{}
	p := e.start(&backend.Request{Shell: groupScript, Stdout: out,
		Limits: policy.ResourceLimits{Timeout: s.d(60 * time.Second)}})
	e.waitFor(out, "started\n")
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	out.closed.Store(true)
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.Termination != backend.Cancelled || res.ExitCode != -1 {
		t.Errorf("termination %q, exit %d; want %q, -1", res.Termination, res.ExitCode, backend.Cancelled)
	}
	e.checkGroupDead(res, out)
}

// testStartSignal: Signal reaches the command while it runs.
func testStartSignal(t *testing.T, s *suite) {
	e := s.setup(t)
	out := &recorder{}
	// The time limit bounds a signal that never arrives: the loop would
	// run, and Wait wait, forever.
	p := e.start(&backend.Request{Shell: `trap 'echo caught; exit 7' USR1; echo armed; while :; do sleep 0.05; done`, Stdout: out,
		Limits: policy.ResourceLimits{Timeout: s.d(60 * time.Second)}})
	e.waitFor(out, "armed\n")
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		if errors.Is(err, backend.ErrUnsupported) {
			t.Skipf("backend delivers no signals: %v", err)
		}
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 7 || !bytes.Contains(out.Bytes(), []byte("caught")) {
		t.Errorf("exit %d, stdout %q; want 7 and the trap's output", res.ExitCode, out.String())
	}
}

// testStartRefused: a request Exec would refuse is refused by Start, and
// nothing is left running.
func testStartRefused(t *testing.T, s *suite) {
	e := s.setup(t)
	st := e.starter()
	req := e.request(&backend.Request{Shell: "true", Dir: "../outside"})
	if p, err := st.Start(context.Background(), req); err == nil {
		_ = p.Kill()
		t.Fatal("Start accepted a working directory outside the workspace")
	} else if !errors.Is(err, backend.ErrInvalidRequest) {
		t.Errorf("err = %v, want ErrInvalidRequest", err)
	}
}

// testStartTTY: with Request.TTY the command runs on a new terminal
// (/dev/pts/N: of the sandbox's own devpts where it has one), which is its
// controlling terminal (/dev/tty) and of the size asked for; input is
// echoed by the terminal, output comes with its line discipline (\r\n),
// and Resize reaches the command as SIGWINCH with the new size. Skipped
// where the backend makes no terminals.
func testStartTTY(t *testing.T, s *suite) {
	e := s.setup(t)
	ts, ok := e.b.(backend.TerminalStarter)
	if !ok || !ts.StartsTerminals() {
		t.Skipf("backend %s makes no terminals", e.b.Name())
	}
	stdinR, stdinW := io.Pipe()
	out := &recorder{}
	p := e.start(&backend.Request{
		Shell: `tty; stty size </dev/tty; trap 'stty size; exit 5' WINCH; echo ready; read line; echo "got $line"; while :; do sleep 0.05; done`,
		Stdin: stdinR, Stdout: out, TTY: &backend.TTY{Rows: 24, Cols: 80},
		// Bounds a SIGWINCH that never arrives (the loop would run on).
		Limits: policy.ResourceLimits{Timeout: s.d(60 * time.Second)}})
	e.waitFor(out, "ready\r\n")
	if _, err := io.WriteString(stdinW, "hello\n"); err != nil {
		t.Fatal(err)
	}
	e.waitFor(out, "got hello\r\n")
	if err := p.Resize(30, 100); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if res.ExitCode != 5 {
		t.Errorf("exit %d, want 5 (the WINCH trap); output %q", res.ExitCode, got)
	}
	if !regexp.MustCompile(`^/dev/pts/[0-9]+\r\n`).MatchString(got) {
		t.Errorf("terminal output %q does not start with the command's tty, /dev/pts/N", got)
	}
	for _, want := range []string{"\r\n24 80\r\n", "hello\r\ngot hello\r\n", "30 100\r\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("terminal output %q lacks %q", got, want)
		}
	}
	if err := p.Resize(10, 10); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("Resize after the end = %v, want ErrProcessDone", err)
	}
}
