package remote

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/protocol"
)

// waitFor waits until ch (a buffer's when: one at a time) closes, failing the test after a generous bound.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never came", what)
	}
}

// TestStartAcrossLostConnections: every connection to the server is cut
// twice while a started process runs; its input still arrives in order,
// each byte once (the stdin requests carry their offset and are sent
// again), its output reaches the writer once, and signals still reach it.
func TestStartAcrossLostConnections(t *testing.T) {
	// A shell cannot trap a signal that was ignored when it started, and
	// the command the in-process server starts inherits this binary's
	// dispositions: run under nohup, SIGHUP is ignored and the trap below
	// never fires. Caught here while the test runs, the command starts
	// with SIGHUP's default action whatever started the tests.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ts := startServer(t)
	b := newBackend(t, ts.url)
	stdinR, stdinW := io.Pipe()
	var out buffer
	p, err := b.Start(context.Background(), &backend.Request{Workspace: t.TempDir(), Network: allowAll, Stdin: stdinR, Stdout: &out,
		Shell: `trap 'echo hup' HUP; while read l; do echo "got $l"; done; echo end`})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill() })
	io.WriteString(stdinW, "a\n")
	waitFor(t, out.when("got a\n"), "the first line's echo")
	if n := ts.ln.DropAll(); n == 0 {
		t.Fatal("no connection to cut")
	}
	io.WriteString(stdinW, "b\n")
	waitFor(t, out.when("got b\n"), "the echo of a line written after the cut")
	ts.ln.DropAll()
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("Signal after the cuts: %v", err)
	}
	// The trap's echo, before the next line: Signal returns once the
	// signal is sent, and where the host backend runs the command under a
	// subreaper (no cgroup) it is passed on a moment later; on a loaded
	// machine the command could read "c" and end first, and the signal
	// would be lost with it.
	waitFor(t, out.when("hup\n"), "the trap's echo of the signal sent after the cuts")
	io.WriteString(stdinW, "c\n")
	waitFor(t, out.when("got c\n"), "the echo of a line written after the second cut")
	stdinW.Close()
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// bash runs the HUP trap between two reads: "hup" comes before the
	// line read after it.
	if want := "got a\ngot b\nhup\ngot c\nend\n"; res.ExitCode != 0 || out.String() != want {
		t.Errorf("exit %d, stdout %q; want 0 and %q", res.ExitCode, out.String(), want)
	}
}

// TestStartBelongsToItsToken: a process started with one token is
// unknown to a client with another: it cannot signal or dial it.
func TestStartBelongsToItsToken(t *testing.T) {
	const other = "another-tenant-token-for-remote-tests"
	ts := startServer(t, server.WithTokens(other))
	// The owner's log says the server-side execution id, which the
	// intruder is then given, as if it had leaked.
	var logs buffer
	b := newBackend(t, ts.url, WithLogger(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	var out buffer
	armed := out.when("armed\n")
	p, err := b.Start(context.Background(), &backend.Request{Workspace: t.TempDir(), Network: allowAll, Stdout: &out,
		Shell: "trap 'exit 9' USR1; echo armed; while :; do sleep 0.05; done"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill() })
	waitFor(t, armed, "armed")
	intruder, err := New(WithURL(ts.url), WithToken(other))
	if err != nil {
		t.Fatal(err)
	}
	defer intruder.Close()
	var id string
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec struct {
			Msg string `json:"msg"`
			ID  string `json:"execution_id"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "remote execution started" {
			id = rec.ID
		}
	}
	if id == "" {
		t.Fatalf("no execution id in the log %q", logs.String())
	}
	ctl := intruder.control(id, serverInfo{features: map[string]bool{protocol.FeatureDial: true}})
	defer ctl.cancel()
	if err := ctl.Signal(syscall.SIGUSR1); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("a foreign Signal = %v, want the execution unknown (ErrProcessDone)", err)
	}
	if _, err := ctl.DialPort(context.Background(), 80); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("a foreign DialPort = %v, want the execution unknown (ErrProcessDone)", err)
	}
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode != 9 {
		t.Errorf("exit %v, %v; want 9: the owner's signal", res, err)
	}
}
