//go:build linux

package gvisor

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/syncio"
	"github.com/pulse-agent/pulse/policy"
)

func waitOutput(t *testing.T, out *syncio.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q never held %q", out.String(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTTYTerminalsApart: each command of the warm sandbox has a devpts
// instance of its own, so that one command cannot open another's
// terminal: while a command runs on /dev/pts/0, another sees no terminal
// in /dev/pts, and one on a terminal of its own gets /dev/pts/0 too.
func TestTTYTerminalsApart(t *testing.T) {
	b := newWarm(t)
	out := &syncio.Buffer{}
	p, err := b.Start(context.Background(), &backend.Request{Workspace: t.TempDir(), TTY: &backend.TTY{Rows: 24, Cols: 80},
		Shell: `tty; echo ready; while :; do sleep 0.05; done`, Stdout: out, Limits: policy.ResourceLimits{Timeout: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	waitOutput(t, out, "ready\r\n")
	if !strings.HasPrefix(out.String(), "/dev/pts/0\r\n") {
		t.Fatalf("first command's terminal: %q", out.String())
	}
	var other, errb bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: `ls /dev/pts`, Stdout: &other, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v %+v %s", err, res, errb.String())
	}
	if got := strings.Fields(other.String()); len(got) != 1 || got[0] != "ptmx" {
		t.Errorf("another command's /dev/pts holds %q, want ptmx alone", got)
	}
	other.Reset()
	res, err = b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: `tty`, Stdout: &other, TTY: &backend.TTY{Rows: 5, Cols: 5}})
	if err != nil || res.ExitCode != 0 || other.String() != "/dev/pts/0\r\n" {
		t.Errorf("a second terminal command: %v %+v %q", err, res, other.String())
	}
}

// TestTTYSignal: a signal reaches a command on a terminal, and a command
// without a terminal cannot be resized.
func TestTTYSignal(t *testing.T) {
	b := newWarm(t)
	out := &syncio.Buffer{}
	p, err := b.Start(context.Background(), &backend.Request{Workspace: t.TempDir(), TTY: &backend.TTY{Rows: 24, Cols: 80},
		Shell: `trap 'echo caught; exit 7' USR1; echo armed; while :; do sleep 0.05; done`, Stdout: out,
		Limits: policy.ResourceLimits{Timeout: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	waitOutput(t, out, "armed\r\n")
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 7 || !strings.Contains(out.String(), "caught\r\n") {
		t.Errorf("exit %d, output %q; want 7 and the trap's output", res.ExitCode, out.String())
	}

	q, err := b.Start(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: `sleep 30`, Stdout: io.Discard,
		Limits: policy.ResourceLimits{Timeout: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Kill()
	if err := q.Resize(10, 10); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("Resize without a terminal = %v, want ErrUnsupported", err)
	}
}

// TestTTYCold: cold (here an allow-all command of a backend with a warm
// sandbox, which runs in a sandbox of its own), the command's terminal
// is the one runsc made: its controlling terminal, of the size asked
// for, TERM set, input echoed and read, and Resize reaching it as
// SIGWINCH with the new size (the conformance case StartTTY but for the
// name: gVisor gives a host terminal none); a bad size is refused before
// anything starts.
func TestTTYCold(t *testing.T) {
	b := newWarm(t)
	if !b.StartsTerminals() {
		t.Error("StartsTerminals false")
	}
	allowAll := policy.NetworkPolicy{Mode: policy.NetworkAllowAll}
	stdinR, stdinW := io.Pipe()
	out := &syncio.Buffer{}
	p, err := b.Start(context.Background(), &backend.Request{Workspace: t.TempDir(), Network: allowAll,
		Shell: `stty size </dev/tty; [ -t 0 ] && [ -t 1 ] && echo "both $TERM"; trap 'stty size; exit 5' WINCH; echo ready; read line; echo "got $line"; while :; do sleep 0.05; done`,
		Stdin: stdinR, Stdout: out, TTY: &backend.TTY{Rows: 24, Cols: 80}, Limits: policy.ResourceLimits{Timeout: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	waitOutput(t, out, "ready\r\n")
	if _, err := io.WriteString(stdinW, "hello\n"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, "got hello\r\n")
	if err := p.Resize(30, 100); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 5 {
		t.Errorf("exit %d, want 5 (the WINCH trap); output %q", res.ExitCode, out.String())
	}
	for _, want := range []string{"24 80\r\n", "both xterm-256color\r\n", "hello\r\ngot hello\r\n", "30 100\r\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("terminal output %q lacks %q", out.String(), want)
		}
	}
	if err := p.Resize(10, 10); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("Resize after the end = %v, want ErrProcessDone", err)
	}
	_, err = b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Network: allowAll,
		Shell: "tty", TTY: &backend.TTY{Rows: 0, Cols: 5}, Stdout: io.Discard})
	if !errors.Is(err, backend.ErrInvalidRequest) {
		t.Errorf("terminal of no rows: %v, want ErrInvalidRequest", err)
	}
}
