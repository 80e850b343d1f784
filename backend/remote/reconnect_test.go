package remote

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// seqOutput is what `seq 1 n` prints.
func seqOutput(from, to int) string {
	var sb strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&sb, "%d\n", i)
	}
	return sb.String()
}

func execShell(t *testing.T, b *Backend, ws, script string, out, errOut *buffer) (*backend.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := &backend.Request{ExecutionID: t.Name(), Workspace: ws, Shell: script,
		Network: allowAll, Secrets: denySecrets}
	if out != nil {
		req.Stdout = out
	}
	if errOut != nil {
		req.Stderr = errOut
	}
	return b.Exec(ctx, req)
}

// TestCutMidStream cuts the connection three times while output flows:
// the writer must see every line once, in order.
func TestCutMidStream(t *testing.T) {
	ts := startServer(t)
	p := newCutProxy(t, ts.addr, 150_000)
	b := newBackend(t, p.url())
	p.setCuts(3)
	var out, errOut buffer
	// Output in two bursts with a pause, on both streams, so cuts land
	// both while the command runs and in the replayed history.
	res, err := execShell(t, b, t.TempDir(), "seq 1 200000; seq 1 3000 >&2; sleep 0.3; seq 200001 300000", &out, &errOut)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if res.ExitCode != 0 || res.Termination != backend.Exited {
		t.Fatalf("exit %d, %s", res.ExitCode, res.Termination)
	}
	if got := p.cutCount(); got < 3 {
		t.Fatalf("the proxy cut %d connections; the test needs 3 to prove anything", got)
	}
	if want := seqOutput(1, 300000); out.String() != want {
		t.Errorf("stdout is %d bytes, want %d: output lost or repeated across reconnects", len(out.String()), len(want))
	}
	if want := seqOutput(1, 3000); errOut.String() != want {
		t.Errorf("stderr is %d bytes, want %d", len(errOut.String()), len(want))
	}
}

// TestCutDuringDownload cuts while the overlay comes back: the download is
// retried on a new connection and the file arrives whole.
func TestCutDuringDownload(t *testing.T) {
	ts := startServer(t)
	p := newCutProxy(t, ts.addr, 20_000)
	b := newBackend(t, p.url())
	p.setCuts(2)
	res, err := execShell(t, b, t.TempDir(), "head -c 600000 /dev/urandom > big.bin; sha256sum big.bin", nil, nil)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if p.cutCount() < 2 {
		t.Fatalf("the proxy cut %d connections, want 2", p.cutCount())
	}
	var big []byte
	for _, f := range res.Overlay.Files {
		if f.Path == "big.bin" {
			big = f.Data
		}
	}
	if len(big) != 600000 {
		t.Fatalf("big.bin came back with %d bytes", len(big))
	}
}

// TestCutDuringUpload cuts the client-to-server direction while the
// workspace is being sent: the upload is sent again and the command sees
// the file intact.
func TestCutDuringUpload(t *testing.T) {
	ts := startServer(t)
	p := newCutProxy(t, ts.addr, 30_000)
	p.upstream = true
	b := newBackend(t, p.url())
	p.setCuts(2)
	ws := t.TempDir()
	data := make([]byte, 300_000)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(ws, "input.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	var out buffer
	res, err := execShell(t, b, ws, "sha256sum input.bin", &out, nil)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if p.cutCount() < 2 {
		t.Fatalf("the proxy cut %d connections, want 2", p.cutCount())
	}
	sum := sha256.Sum256(data)
	if res.ExitCode != 0 || !strings.HasPrefix(out.String(), hex.EncodeToString(sum[:])) {
		t.Errorf("exit %d, stdout %q; want the file's digest %x", res.ExitCode, out.String(), sum)
	}
}

// TestServerRestartedMidCommand: the server dies while the command runs
// and comes back on the same address and store. It marked the execution
// UNKNOWN; the client must say so, not hang or invent a result.
func TestServerRestartedMidCommand(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url)
	var out buffer
	started := out.when("started")
	type outcome struct {
		res *backend.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := execShell(t, b, t.TempDir(), "echo started; sleep 30", &out, nil)
		done <- outcome{res, err}
	}()
	awaitStart(t, started, done)
	old := ts.crash()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		old.Shutdown(ctx) // ends the orphaned sleep
	}()
	ln, err := net.Listen("tcp", ts.addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", ts.addr, err)
	}
	ts.start(t, ln)
	o := testenv.Recv(t, done, endWithin, "Exec's return")
	if !errors.Is(o.err, ErrExecutionLost) || o.res != nil {
		t.Fatalf("Exec after a restart: result %v, error %v; want ErrExecutionLost", o.res, o.err)
	}
	if !strings.Contains(o.err.Error(), "restarted") {
		t.Errorf("error %q does not say the server restarted", o.err)
	}
	if errors.Is(o.err, ErrUnreachable) || errors.Is(o.err, ErrUnauthorized) {
		t.Errorf("error %v is confused with another class", o.err)
	}
}

// TestServerLostRecord: the server comes back with an empty store (a new
// volume): it has no record of the execution, which is a distinct error.
func TestServerLostRecord(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url)
	var out buffer
	started := out.when("started")
	done := make(chan error, 1)
	go func() {
		_, err := execShell(t, b, t.TempDir(), "echo started; sleep 30", &out, nil)
		done <- err
	}()
	awaitStart(t, started, done)
	old := ts.crash()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		old.Shutdown(ctx)
	}()
	ln, err := net.Listen("tcp", ts.addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", ts.addr, err)
	}
	ts.dir = t.TempDir()
	ts.start(t, ln)
	err = testenv.Recv(t, done, endWithin, "Exec's return")
	if !errors.Is(err, ErrExecutionLost) || !strings.Contains(err.Error(), "no record") {
		t.Fatalf("Exec against a fresh store: %v; want ErrExecutionLost saying there is no record", err)
	}
}

// TestServerGoneMidCommand: the server dies and does not come back within
// the reconnect window: the client gives up with ErrUnreachable.
func TestServerGoneMidCommand(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url, WithReconnectWindow(700*time.Millisecond))
	var out buffer
	started := out.when("started")
	done := make(chan error, 1)
	go func() {
		_, err := execShell(t, b, t.TempDir(), "echo started; sleep 30", &out, nil)
		done <- err
	}()
	awaitStart(t, started, done)
	old := ts.crash()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		old.Shutdown(ctx)
	}()
	err := testenv.Recv(t, done, endWithin, "Exec's return")
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, backend.ErrUnavailable) || errors.Is(err, ErrExecutionLost) {
		t.Fatalf("Exec with the server gone: %v; want ErrUnreachable", err)
	}
}

// TestStreamsWhileRunning proves output arrives while the command runs:
// the command waits for a gate that the test opens only once the first
// line has reached the writer.
func TestStreamsWhileRunning(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url)
	gate := filepath.Join(t.TempDir(), "gate")
	var out buffer
	first := out.when("first\n")
	opened := make(chan bool, 1)
	go func() {
		select {
		case <-first:
			os.WriteFile(gate, nil, 0o644)
			opened <- true
		case <-time.After(20 * time.Second):
			os.WriteFile(gate, nil, 0o644)
			opened <- false
		}
	}()
	script := fmt.Sprintf("echo first; while [ ! -e %q ]; do sleep 0.02; done; echo second", gate)
	res, err := execShell(t, b, t.TempDir(), script, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !testenv.Recv(t, opened, endWithin, "the gate") {
		t.Fatal("the first line had not arrived while the command waited: output is not streamed")
	}
	if res.ExitCode != 0 || out.String() != "first\nsecond\n" {
		t.Errorf("exit %d, stdout %q", res.ExitCode, out.String())
	}
}

// TestReconcileSparesLive runs Reconcile while an execution is live: the
// execution finishes with its output and writes intact.
func TestReconcileSparesLive(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url)
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "in.txt"), []byte("input\n"), 0o644)
	var out buffer
	started := out.when("started")
	type outcome struct {
		res *backend.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := execShell(t, b, ws, "echo started; sleep 0.5; cat in.txt > after.txt; echo finished", &out, nil)
		done <- outcome{res, err}
	}()
	awaitStart(t, started, done)
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	o := testenv.Recv(t, done, endWithin, "Exec's return")
	if o.err != nil {
		t.Fatal(o.err)
	}
	if out.String() != "started\nfinished\n" {
		t.Errorf("stdout %q", out.String())
	}
	found := false
	for _, f := range o.res.Overlay.Files {
		if f.Path == "after.txt" && bytes.Equal(f.Data, []byte("input\n")) {
			found = true
		}
	}
	if !found {
		t.Errorf("after.txt missing from the overlay %+v", o.res.Overlay)
	}
}

// TestCutAroundSubmit cuts right at the first WebSocket frame: upstream,
// the submit never reaches the server (attach finds nothing, so it is
// sent again); downstream, the submit lands but its acknowledgement is
// lost (attach finds the execution and follows it). Either way the
// command runs exactly once and its output arrives whole.
func TestCutAroundSubmit(t *testing.T) {
	ts := startServer(t)
	for _, upstream := range []bool{true, false} {
		t.Run(fmt.Sprintf("upstream=%v", upstream), func(t *testing.T) {
			p := newCutProxy(t, ts.addr, 5)
			p.upstream, p.afterHeader = upstream, true
			b := newBackend(t, p.url())
			p.setCuts(1)
			counter := filepath.Join(t.TempDir(), "runs")
			var out buffer
			res, err := execShell(t, b, t.TempDir(), fmt.Sprintf("echo run >> %q; seq 1 1000", counter), &out, nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.cutCount() != 1 {
				t.Fatalf("the proxy cut %d connections, want 1", p.cutCount())
			}
			runs, _ := os.ReadFile(counter)
			if res.ExitCode != 0 || string(runs) != "run\n" || out.String() != seqOutput(1, 1000) {
				t.Errorf("exit %d, ran %q, stdout %d bytes", res.ExitCode, runs, len(out.String()))
			}
		})
	}
}

// TestCloseWithServerGone: Close while the server is gone still returns,
// within the cancel wait, with a cancelled result for the running Exec.
func TestCloseWithServerGone(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url, WithCancelWait(500*time.Millisecond))
	var out buffer
	started := out.when("started")
	type outcome struct {
		res *backend.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := execShell(t, b, t.TempDir(), "echo started; sleep 30", &out, nil)
		done <- outcome{res, err}
	}()
	awaitStart(t, started, done)
	old := ts.crash()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		old.Shutdown(ctx)
	}()
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return with the server gone")
	}
	o := testenv.Recv(t, done, endWithin, "Exec's return")
	if o.err != nil || o.res.Termination != backend.Cancelled || o.res.ExitCode != -1 {
		t.Errorf("Exec ended by Close: %+v, %v; want a cancelled result", o.res, o.err)
	}
}
