package server

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// A worker keeps its dedup cache (req_id → terminal frame) across
// reconnects. When the server restarts, its relay must not reuse the
// req_ids of the relay before it: the worker would answer a new Exec from
// the cached terminal frame of an old one (same command, no output), and
// the new execution would fail or get another execution's result.
func TestRelayRestartDoesNotReuseWorkerReqIDs(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	serve := func(l net.Listener) (*relay.Relay, *grpc.Server) {
		r, err := relay.New([]string{workerToken})
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		r.Register(g)
		go g.Serve(l)
		t.Cleanup(g.Stop)
		return r, g
	}
	waitLive := func(r *relay.Relay) {
		testenv.Eventually(t, 30*time.Second, func() error {
			if err := r.Available(nil); err != nil {
				return err
			}
			return nil
		})
	}
	run := func(r *relay.Relay, id, shell string) (string, error) {
		ws := t.TempDir()
		os.WriteFile(filepath.Join(ws, "f"), []byte(id), 0o644)
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := r.Exec(ctx, &backend.Request{ExecutionID: id, Workspace: ws, Shell: shell, Stdout: &out})
		if err != nil {
			return "", err
		}
		if res.ExitCode != 0 {
			t.Fatalf("%s: exit %d", id, res.ExitCode)
		}
		return out.String(), nil
	}

	first, g1 := serve(lis)
	cmd := testenv.Command(t, "pulse-worker")
	cmd.Env = append(cmd.Env, "RELAY_ADDR="+addr, "SANDBOX_ID=w1", "SANDBOX_TOKEN="+workerToken,
		"RELAY_TLS=0", "WORKER_MAX_CONCURRENT=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	waitLive(first)
	for _, id := range []string{"before-1", "before-2"} {
		if out, err := run(first, id, "cat f"); err != nil || out != id {
			t.Fatalf("%s before the restart: %q, %v", id, out, err)
		}
	}

	// The server restarts on the same address; the worker process, and
	// its cache, live on and reconnect.
	g1.Stop()
	var lis2 net.Listener
	testenv.Eventually(t, 10*time.Second, func() (err error) {
		lis2, err = net.Listen("tcp", addr)
		return err
	})
	second, _ := serve(lis2)
	waitLive(second)
	for _, id := range []string{"after-1", "after-2"} {
		if out, err := run(second, id, "cat f"); err != nil || out != id {
			t.Fatalf("%s after the restart: %q, %v", id, out, err)
		}
	}
}
