package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/internal/worker/relaytest"
)

func TestMain(m *testing.M) {
	// A box's init is this binary re-run: it must not run the tests.
	namespace.Init()
	// testenv.Command(t, "pulse-worker", ...) runs this binary as the
	// worker: main itself, signal handling included.
	testenv.RunIfChild("pulse-worker", main)
	os.Exit(m.Run())
}

// TestBuildsStatic builds pulse-worker with CGO_ENABLED=0, the way it
// ships: the build is what it checks, so it is the one test here that
// runs `go build` (into t.TempDir()).
func TestBuildsStatic(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "pulse-worker")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("binary has a dynamic loader (PT_INTERP): not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs shared libraries %v", libs)
	}
}

func TestSIGTERMStopsCleanlyAndKillsRunningCommands(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash on PATH")
	}
	relay, err := relaytest.Start("tok")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	var stderr bytes.Buffer
	cmd := testenv.Command(t, "pulse-worker", "-relay-addr", relay.Addr(), "-sandbox-id", "sbx-sig")
	cmd.Env = append(cmd.Env, "SANDBOX_TOKEN=tok", "WORKER_MAX_CONCURRENT=2")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := relay.Accept(ctx)
	if err != nil {
		t.Fatalf("worker did not attach: %v\n%s", err, stderr.String())
	}
	if h := conn.Hello(); h.GetSandboxId() != "sbx-sig" || h.GetCapacityMax() != 2 {
		t.Errorf("hello = %v: flags and environment not applied", h)
	}
	call, err := conn.Exec(&sandboxv1.Exec{ReqId: 1, Command: "echo $$; sleep 30", Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	first, err := call.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(first.GetChunk().GetData())))
	if err != nil {
		t.Fatalf("first chunk %q: %v", first.GetChunk().GetData(), err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("worker exited with %v after SIGTERM\n%s", err, stderr.String())
		}
	case <-ctx.Done():
		t.Fatalf("worker did not exit after SIGTERM\n%s", stderr.String())
	}
	// The bash leader was the worker's child and has been reaped; a
	// signal to the group finds no one.
	if err := syscall.Kill(-pgid, 0); err == nil {
		t.Errorf("process group %d of the running command survived the worker", pgid)
	}
}

func TestUsageErrors(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	cases := []struct {
		name string
		args []string
		env  func(string) string
		want int
	}{
		{"bad max concurrent in env", nil, env("WORKER_MAX_CONCURRENT", "many"), exitUsage},
		{"bad tls in env", nil, env("RELAY_TLS", "maybe"), exitUsage},
		{"zero max concurrent flag", []string{"-max-concurrent", "0"}, env(), exitUsage},
		{"unknown flag", []string{"-nope"}, env(), exitUsage},
		{"stray argument", []string{"extra"}, env(), exitUsage},
		{"bad log level", []string{"-log-level", "loud"}, env(), exitUsage},
		{"help", []string{"-h"}, env(), exitOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if got := run(t.Context(), tc.args, tc.env, io.Discard, &stderr); got != tc.want {
				t.Errorf("exit %d, want %d; stderr:\n%s", got, tc.want, stderr.String())
			}
		})
	}
}

// TestWrongTokenIsFatal: a refused token is an ERROR and exit 3 at once,
// never "attached" and never a retry.
func TestWrongTokenIsFatal(t *testing.T) {
	relay, err := relaytest.Start("right-token")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	getenv := func(k string) string {
		return map[string]string{"RELAY_ADDR": relay.Addr(), "SANDBOX_TOKEN": "wrong-token"}[k]
	}
	code := run(ctx, nil, getenv, io.Discard, &stderr)
	out := stderr.String()
	if code != exitRefused {
		t.Fatalf("exit %d, want %d (exitRefused)\n%s", code, exitRefused, out)
	}
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "relay refused the token") {
		t.Errorf("no ERROR saying the relay refused the token:\n%s", out)
	}
	if strings.Contains(out, "msg=attached") {
		t.Errorf("logged attached although the relay refused:\n%s", out)
	}
	if n := relay.Rejected(); n != 1 {
		t.Errorf("relay refused %d attaches, want exactly 1 (no retry)", n)
	}
}

// TestStartupSaysWhatItUses: with nothing set the worker keeps the
// design's defaults but says where it dials, as whom, and that the token
// is the development one.
func TestStartupSaysWhatItUses(t *testing.T) {
	relay, err := relaytest.Start("dev-token")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		// Only RELAY_ADDR: the test cannot own localhost:8443.
		done <- run(ctx, nil, func(k string) string {
			if k == "RELAY_ADDR" {
				return relay.Addr()
			}
			return ""
		}, io.Discard, &stderr)
	}()
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	defer acancel()
	if _, err := relay.Accept(actx); err != nil {
		cancel()
		<-done
		t.Fatalf("worker did not attach with the default token: %v\n%s", err, stderr.String())
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("exit %d after cancel", code)
	}
	out := stderr.String()
	for _, want := range []string{
		"level=INFO msg=starting relay=" + relay.Addr() + " sandbox_id=sbx-laptop-1 capacity=4",
		`level=WARN msg="SANDBOX_TOKEN not set: using the development default token"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// thinPath is a directory holding links to bash and env alone: a worker
// image without tar, gzip, base64, mktemp, cat and rm.
func thinPath(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	for _, p := range []string{"bash", "env"} {
		real, err := exec.LookPath(p)
		if err != nil {
			t.Skipf("needs %s on PATH to build the thin PATH from", p)
		}
		if err := os.Symlink(real, filepath.Join(bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// TestMissingProgramsRefuseToAttach, tried as an operator would meet it:
// the pulse-worker process, on a PATH without the exec path's programs,
// exits 2 with every missing one named before it dials, so the relay
// never counts a worker that would lose each command's writes; -check
// says the same, and on a full PATH says it would attach.
func TestMissingProgramsRefuseToAttach(t *testing.T) {
	relay, err := relaytest.Start("tok")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	thin := thinPath(t)
	missing := []string{"mktemp", "cat", "rm", "base64", "tar", "gzip"}

	var stderr bytes.Buffer
	cmd := testenv.Command(t, "pulse-worker", "-relay-addr", relay.Addr(), "-sandbox-id", "sbx-thin")
	cmd.Env = append(cmd.Env, "SANDBOX_TOKEN=tok", "PATH="+thin)
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the worker did not refuse: still running 60s later\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
		t.Fatalf("worker on a thin PATH: %v, want exit %d\n%s", err, exitUsage, stderr.String())
	}
	for _, p := range missing {
		if !strings.Contains(stderr.String(), p) {
			t.Errorf("the refusal does not name %s:\n%s", p, stderr.String())
		}
	}
	if n := relay.Attaches(); n != 0 {
		t.Errorf("the relay saw %d attaches from a worker that lacks what it needs", n)
	}

	check := func(path string) (int, string) {
		var out bytes.Buffer
		c := testenv.Command(t, "pulse-worker", "-check")
		c.Env = append(c.Env, "PATH="+path)
		c.Stdout, c.Stderr = &out, &out
		err := c.Run()
		if errors.As(err, &ee) {
			return ee.ExitCode(), out.String()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, out.String()
	}
	if code, out := check(thin); code != exitUsage || !strings.Contains(out, "gzip") {
		t.Errorf("-check on a thin PATH: exit %d, want %d naming the missing programs:\n%s", code, exitUsage, out)
	}
	if code, out := check(os.Getenv("PATH")); code != exitOK || !strings.Contains(out, "programs: ok") || !strings.Contains(out, "boxes: ") {
		t.Errorf("-check on this machine's PATH: exit %d, want 0 with programs and boxes:\n%s", code, out)
	}
}
