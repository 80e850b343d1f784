package worker_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/internal/worker"
	"github.com/pulse-agent/pulse/internal/worker/relaytest"
)

// The contract tier: the real runner and session behind real gRPC on
// 127.0.0.1, against the in-process relay of relaytest.

const token = "test-token"

// waitLimit bounds every wait so a regression fails instead of hanging;
// no test asserts on elapsed time.
const waitLimit = 20 * time.Second

type fixture struct {
	relay *relaytest.Relay
	conn  *relaytest.Conn
	dir   string
	id    uint64
}

func setup(t testing.TB, mut func(*worker.Config)) *fixture {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash on PATH")
	}
	relay, err := relaytest.Start(token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relay.Close)
	cfg := worker.Default()
	cfg.RelayAddr = relay.Addr()
	cfg.Token = token
	cfg.SandboxID = "sbx-test"
	cfg.BackoffMin = 20 * time.Millisecond
	cfg.BackoffMax = 200 * time.Millisecond
	if mut != nil {
		mut(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker.Run: %v", err)
			}
		case <-time.After(waitLimit):
			t.Error("worker.Run did not stop after cancel")
		}
	})
	f := &fixture{relay: relay, dir: t.TempDir(), id: 100}
	f.conn = f.accept(t)
	return f
}

func (f *fixture) accept(t testing.TB) *relaytest.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := f.relay.Accept(ctx)
	if err != nil {
		t.Fatalf("no worker attached: %v", err)
	}
	return c
}

func (f *fixture) run(t testing.TB, e *sandboxv1.Exec) *relaytest.Result {
	t.Helper()
	if e.ReqId == 0 {
		f.id++
		e.ReqId = f.id
	}
	call, err := f.conn.Exec(e)
	if err != nil {
		t.Fatal(err)
	}
	res, err := call.WaitTimeout(waitLimit)
	if err != nil {
		t.Fatalf("exec %q: %v", e.Command, err)
	}
	return res
}

func wantEnd(t testing.TB, res *relaytest.Result, code int32) {
	t.Helper()
	if res.End == nil {
		t.Fatalf("got ExecError %v, want End{%d}", res.Error, code)
	}
	if res.End.GetExitCode() != code {
		t.Fatalf("exit code %d, want %d (stderr %q)", res.End.GetExitCode(), code, res.Stderr)
	}
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func TestHelloIsHonest(t *testing.T) {
	f := setup(t, func(c *worker.Config) { c.MaxConcurrent = 3; c.Image = "demo:1"; c.Trust = "trusted" })
	h := f.conn.Hello()
	if h.GetSandboxId() != "sbx-test" || h.GetCapacityMax() != 3 || h.GetArch() != runtime.GOARCH ||
		h.GetImage() != "demo:1" || h.GetTrust() != "trusted" {
		t.Errorf("hello = %v", h)
	}
	if !slices.Contains(h.GetCapabilities(), "bash") {
		t.Errorf("capabilities %v lack bash, which is on PATH", h.GetCapabilities())
	}
	for _, c := range h.GetCapabilities() {
		if _, err := exec.LookPath(c); err != nil {
			t.Errorf("capability %q reported but not on PATH", c)
		}
	}
}

func TestRead(t *testing.T) {
	f := setup(t, nil)
	content := []byte("line one\nbinary \x00\x01\xff\n")
	path := filepath.Join(f.dir, "f")
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	res := f.run(t, &sandboxv1.Exec{Command: "cat " + quote(path), Streaming: true})
	wantEnd(t, res, 0)
	if !bytes.Equal(res.Stdout, content) {
		t.Errorf("stdout %q, want %q", res.Stdout, content)
	}
}

func TestWrite(t *testing.T) {
	f := setup(t, nil)
	content := bytes.Repeat([]byte("payload \x00\xfe\n"), 5000)
	path := filepath.Join(f.dir, "out")
	res := f.run(t, &sandboxv1.Exec{
		Command:   "base64 -d > " + quote(path),
		Stdin:     []byte(base64.StdEncoding.EncodeToString(content)),
		TimeoutS:  20,
		Streaming: true,
	})
	wantEnd(t, res, 0)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content) {
		t.Errorf("file has %d bytes, want %d identical ones", len(got), len(content))
	}
}

func TestBashExitAndBothStreams(t *testing.T) {
	f := setup(t, nil)
	res := f.run(t, &sandboxv1.Exec{Command: "echo hi; echo oops >&2; exit 7", Streaming: true})
	wantEnd(t, res, 7)
	if string(res.Stdout) != "hi\n" || res.StdoutChunks != 1 {
		t.Errorf("stdout %q in %d chunks", res.Stdout, res.StdoutChunks)
	}
	if string(res.Stderr) != "oops\n" || res.StderrChunks != 1 {
		t.Errorf("stderr %q in %d chunks", res.Stderr, res.StderrChunks)
	}
}

func TestGrepManyChunks(t *testing.T) {
	f := setup(t, nil)
	var b strings.Builder
	want := 0
	for i := range 8000 {
		if i%2 == 0 {
			fmt.Fprintf(&b, "match %06d needle\n", i)
			want++
		} else {
			fmt.Fprintf(&b, "other %06d hay\n", i)
		}
	}
	path := filepath.Join(f.dir, "haystack")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	tool := "grep"
	if _, err := exec.LookPath("rg"); err == nil {
		tool = "rg --no-filename"
	}
	res := f.run(t, &sandboxv1.Exec{Command: tool + " needle " + quote(path), Streaming: true})
	wantEnd(t, res, 0)
	if n := bytes.Count(res.Stdout, []byte("\n")); n != want {
		t.Errorf("%d matching lines, want %d", n, want)
	}
	if res.StdoutChunks < 2 {
		t.Errorf("%d bytes in %d chunks, want several", len(res.Stdout), res.StdoutChunks)
	}
}

func TestAbortMidStream(t *testing.T) {
	f := setup(t, nil)
	f.id++
	id := f.id
	// $$ is the bash child, the leader of the exec's process group; the
	// background subshell is a grandchild in the same group.
	call, err := f.conn.Exec(&sandboxv1.Exec{ReqId: id, Command: "echo $$; (while true; do echo bg; sleep 0.01; done) & while true; do echo tick; sleep 0.01; done", Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	first, err := call.Next(ctx)
	if err != nil || first.GetChunk() == nil {
		t.Fatalf("first frame %v, err %v", first, err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(first.GetChunk().GetData()), "\n", 2)[0]))
	if err != nil {
		t.Fatalf("first chunk %q does not start with the pid", first.GetChunk().GetData())
	}
	if err := f.conn.Abort(id); err != nil {
		t.Fatal(err)
	}
	res, err := call.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantEnd(t, res, -1)
	if len(groupMembers(syscall.Getpgrp())) == 0 {
		t.Fatal("cannot see processes in /proc: the group check would prove nothing")
	}
	if alive := groupMembers(pgid); len(alive) > 0 {
		t.Errorf("process group %d still has live members %v after End", pgid, alive)
	}
	// A later exec's End comes after anything still queued for the
	// aborted one; nothing may have arrived for it after its End.
	wantEnd(t, f.run(t, &sandboxv1.Exec{Command: "true"}), 0)
	if stray := f.conn.Stray(); len(stray) > 0 {
		t.Errorf("frames after End: %v", stray)
	}
}

func TestTimeout(t *testing.T) {
	f := setup(t, nil)
	res := f.run(t, &sandboxv1.Exec{Command: "sleep 30", TimeoutS: 1, Streaming: true})
	if res.Error == nil || res.Error.GetMessage() != "timeout:1" {
		t.Fatalf("got End %v / ExecError %v, want ExecError{timeout:1}", res.End, res.Error)
	}
}

func TestNonStreamingOneChunkPerStream(t *testing.T) {
	f := setup(t, nil)
	res := f.run(t, &sandboxv1.Exec{Command: "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.01; done", Streaming: false})
	wantEnd(t, res, 0)
	if res.StdoutChunks != 1 || res.StderrChunks != 1 || string(res.Stdout) != "o1\no2\no3\n" || string(res.Stderr) != "e1\ne2\ne3\n" {
		t.Errorf("stdout %q in %d chunks, stderr %q in %d", res.Stdout, res.StdoutChunks, res.Stderr, res.StderrChunks)
	}
}

// TestReconnectDedup proves "no re-run", not merely "same frame": the
// command appends to a marker file, which must still hold one line after
// the redelivery on a new connection.
func TestReconnectDedup(t *testing.T) {
	f := setup(t, nil)
	marker := filepath.Join(f.dir, "log")
	exec4 := func() *sandboxv1.Exec {
		return &sandboxv1.Exec{ReqId: 4, Command: "echo x >> " + quote(marker), Streaming: true}
	}
	first := f.run(t, exec4())
	wantEnd(t, first, 0)

	f.conn.Drop()
	f.conn = f.accept(t)
	if n := f.relay.Attaches(); n != 2 {
		t.Errorf("%d attaches, want 2", n)
	}
	again := f.run(t, exec4())
	wantEnd(t, again, 0)
	got, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "x\n" {
		t.Errorf("marker holds %q: the redelivery ran again", got)
	}
	// A different command under the same req_id after completion runs.
	res := f.run(t, &sandboxv1.Exec{ReqId: 4, Command: "echo y >> " + quote(marker)})
	wantEnd(t, res, 0)
	if got, _ := os.ReadFile(marker); string(got) != "x\ny\n" {
		t.Errorf("marker holds %q after a colliding command", got)
	}
}

func TestTokenStaysOutOfCommands(t *testing.T) {
	t.Setenv(worker.EnvToken, token)
	f := setup(t, func(c *worker.Config) { c.Env = nil })
	res := f.run(t, &sandboxv1.Exec{Command: `echo "${SANDBOX_TOKEN:-absent}"`})
	wantEnd(t, res, 0)
	if string(res.Stdout) != "absent\n" {
		t.Errorf("command saw SANDBOX_TOKEN: %q", res.Stdout)
	}
}

func TestHeartbeatsReachRelay(t *testing.T) {
	f := setup(t, func(c *worker.Config) { c.Heartbeat = 10 * time.Millisecond })
	testenv.Eventually(t, waitLimit, func() error {
		if n := f.conn.Heartbeats(); n < 2 {
			return fmt.Errorf("%d heartbeats, want 2", n)
		}
		return nil
	})
}

func TestWrongTokenIsFatal(t *testing.T) {
	relay, err := relaytest.Start(token)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	var logs testenv.SyncBuffer
	cfg := worker.Default()
	cfg.RelayAddr = relay.Addr()
	cfg.Token = "wrong"
	cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	err = worker.Run(ctx, cfg)
	if !errors.Is(err, worker.ErrTokenRefused) {
		t.Fatalf("Run = %v, want ErrTokenRefused", err)
	}
	if n := relay.Rejected(); n != 1 {
		t.Errorf("relay saw %d refused attaches, want 1: a refused token is not retried", n)
	}
	if n := relay.Attaches(); n != 0 {
		t.Errorf("relay accepted %d attaches with a wrong token", n)
	}
	out := logs.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "relay refused the token") {
		t.Errorf("no ERROR about the refused token:\n%s", out)
	}
	if strings.Contains(out, "msg=attached") || strings.Contains(out, "reconnecting") {
		t.Errorf("refused worker logged attached or a retry:\n%s", out)
	}
}

// TestAttachedOnlyOnEvidence: "connected" when the stream opens, "attached"
// only after the relay's first frame, or after a quiet period without
// refusal; the protocol has no acceptance frame.
func TestAttachedOnlyOnEvidence(t *testing.T) {
	for _, tc := range []struct {
		name     string
		quiet    time.Duration
		exec     bool
		evidence string
	}{
		{"first frame", time.Hour, true, `evidence="first relay frame"`},
		{"quiet period", time.Millisecond, false, `evidence="no refusal within 1ms"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A cleanup registered before setup's runs after it, once
			// Run has returned and no longer reads the setting.
			t.Cleanup(worker.SetAttachQuiet(tc.quiet))
			var logs testenv.SyncBuffer
			f := setup(t, func(c *worker.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
			if tc.exec {
				// The Hello has arrived and the quiet period is an hour:
				// nothing may claim the worker attached yet.
				if out := logs.String(); !strings.Contains(out, "msg=\"connected; waiting") || strings.Contains(out, "msg=attached") {
					t.Fatalf("before any relay frame, want connected and not attached:\n%s", out)
				}
				wantEnd(t, f.run(t, &sandboxv1.Exec{Command: "true"}), 0)
			}
			// Waited for, then checked below (the wait's own verdict is not).
			_ = testenv.Poll(waitLimit, func() error {
				if !strings.Contains(logs.String(), "msg=attached") {
					return errors.New("not attached yet")
				}
				return nil
			})
			if out := logs.String(); !strings.Contains(out, "msg=attached") || !strings.Contains(out, tc.evidence) {
				t.Errorf("want attached with %s:\n%s", tc.evidence, out)
			}
		})
	}
}

// groupMembers lists the live (non-zombie) processes of a process group,
// read from /proc: a zombie is dead, merely not yet reaped by whoever
// inherited it.
func groupMembers(pgid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state ppid pgrp ...
		rest := string(stat[bytes.LastIndexByte(stat, ')')+2:])
		fields := strings.Fields(rest)
		if len(fields) < 3 || fields[0] == "Z" || fields[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(fields[2]); g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// TestLargeStdin sends a stdin above gRPC's 4 MiB default message size, as
// writeFile of a large file does.
func TestLargeStdin(t *testing.T) {
	f := setup(t, nil)
	content := bytes.Repeat([]byte{0xAB, 0x00, 0x41}, 2<<20) // 6 MiB
	path := filepath.Join(f.dir, "big")
	res := f.run(t, &sandboxv1.Exec{
		Command:  "base64 -d > " + quote(path),
		Stdin:    []byte(base64.StdEncoding.EncodeToString(content)),
		TimeoutS: 60,
	})
	wantEnd(t, res, 0)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content) {
		t.Errorf("file has %d bytes, want %d identical ones", len(got), len(content))
	}
}
