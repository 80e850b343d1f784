package worker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/internal/worker"
	"github.com/pulse-agent/pulse/internal/worker/relaytest"
)

// A worker given two relays (the replicas of a pulse-server fleet)
// attaches to both, tells each its real capacity, and counts that
// capacity once: with one slot, relay b's command waits while relay a's
// runs, and runs once a's ends. A req_id b sends again after a ran it is
// answered from the shared dedup cache, not run twice. On a worker
// without boxes every command takes a slot (TestBoxesTakeTheSlots has
// the worker with them).
func TestOneCapacityAcrossRelays(t *testing.T) {
	defer worker.RefuseBoxes(errors.New("every command counts here (test)"))()
	a, b := startRelay(t), startRelay(t)
	runWorker(t, func(c *worker.Config) {
		c.RelayAddr = a.Addr() + ", " + b.Addr()
		c.MaxConcurrent = 1
	})
	ca, cb := accept(t, a), accept(t, b)
	for name, c := range map[string]*relaytest.Conn{"a": ca, "b": cb} {
		if got := c.Hello().GetCapacityMax(); got != 1 {
			t.Fatalf("relay %s was told capacity %d; want 1", name, got)
		}
	}
	dir := t.TempDir()
	gate, started, ranB := filepath.Join(dir, "gate"), filepath.Join(dir, "a-started"), filepath.Join(dir, "b-ran")
	t.Cleanup(func() { os.WriteFile(gate, nil, 0o600) })
	callA, err := ca.Exec(&sandboxv1.Exec{ReqId: 7, Command: "touch " + quote(started) + "; while [ ! -e " + quote(gate) + " ]; do sleep 0.02; done", Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitLimit, func() error {
		_, err := os.Stat(started)
		return err
	})
	callB, err := cb.Exec(&sandboxv1.Exec{ReqId: 8, Command: "echo b >> " + quote(ranB), Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	// Not a timing assertion: b's command must not run at all while a's
	// holds the only slot; a while is given for it to wrongly do so.
	time.Sleep(500 * time.Millisecond)
	if _, err := os.Stat(ranB); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("relay b's command ran while relay a's held the one slot (%v)", err)
	}
	os.WriteFile(gate, nil, 0o600)
	for name, call := range map[string]*relaytest.Call{"a": callA, "b": callB} {
		res, err := call.WaitTimeout(waitLimit)
		if err != nil {
			t.Fatalf("relay %s: %v", name, err)
		}
		wantEnd(t, res, 0)
	}
	// b sends a's req_id and command again: answered from the cache.
	again, err := cb.Exec(&sandboxv1.Exec{ReqId: 8, Command: "echo b >> " + quote(ranB), Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := again.WaitTimeout(waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	wantEnd(t, res, 0)
	if got, _ := os.ReadFile(ranB); string(got) != "b\n" {
		t.Fatalf("b's command left %q; want one run", got)
	}
}

// On a worker that boxes executions the boxes are what the capacity
// counts, across relays: relay b's box waits while relay a's holds the
// one slot, and runs once a's ends; a relay's own steps around a box
// (plain commands) do not wait for the slot, or an execution would queue
// once for each of them.
func TestBoxesTakeTheSlots(t *testing.T) {
	a, b := startRelay(t), startRelay(t)
	runWorker(t, func(c *worker.Config) {
		c.RelayAddr = a.Addr() + "," + b.Addr()
		c.MaxConcurrent = 1
	})
	ca, cb := accept(t, a), accept(t, b)
	if h := ca.Hello(); h.GetIsolation() == "" {
		t.Skipf("no boxes on this machine: %s", h.GetIsolationNote())
	}
	box := func(name, shell string) *sandboxv1.Box {
		ws := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		return &sandboxv1.Box{Workspace: ws, OverlayFile: ws + ".overlay", Shell: shell}
	}
	callA, err := ca.Exec(&sandboxv1.Exec{ReqId: 1, Box: box("a", "echo started; exec sleep 60"), TimeoutS: 90, Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if f, err := callA.Next(ctx); err != nil || f.GetChunk() == nil {
		t.Fatalf("relay a's box did not start: %v %v", f, err)
	}
	step, err := cb.Exec(&sandboxv1.Exec{ReqId: 2, Command: "echo step", Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := step.WaitTimeout(waitLimit)
	if err != nil {
		t.Fatalf("relay b's step waited for the slot a's box holds: %v", err)
	}
	wantEnd(t, res, 0)
	callB, err := cb.Exec(&sandboxv1.Exec{ReqId: 3, Box: box("b", "echo b"), TimeoutS: 30, Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	// Not a timing assertion: b's box must not start at all while a's
	// holds the only slot; a while is given for it to wrongly do so.
	early, cancelEarly := context.WithTimeout(context.Background(), 500*time.Millisecond)
	f, err := callB.Next(early)
	cancelEarly()
	if err == nil {
		t.Fatalf("relay b's box ran while relay a's held the one slot: %v", f)
	}
	if err := ca.Abort(1); err != nil {
		t.Fatal(err)
	}
	if _, err := callA.WaitTimeout(waitLimit); err != nil {
		t.Fatal(err)
	}
	res, err = callB.WaitTimeout(waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	wantEnd(t, res, 0)
	if string(res.Stdout) != "b\n" {
		t.Fatalf("relay b's box wrote %q", res.Stdout)
	}
}

// One relay going away leaves the worker attached to the other, which
// still gets its work done.
func TestOtherRelayKeepsServing(t *testing.T) {
	a, b := startRelay(t), startRelay(t)
	runWorker(t, func(c *worker.Config) { c.RelayAddr = a.Addr() + "," + b.Addr() })
	accept(t, a)
	cb := accept(t, b)
	a.Close()
	call, err := cb.Exec(&sandboxv1.Exec{ReqId: 1, Command: "echo ok", Streaming: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := call.WaitTimeout(waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	wantEnd(t, res, 0)
	if string(res.Stdout) != "ok\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
}

// runWorker runs worker.Run with the test token, mut applied, until the
// test ends.
func runWorker(t *testing.T, mut func(*worker.Config)) {
	t.Helper()
	cfg := worker.Default()
	cfg.Token, cfg.SandboxID = token, "sbx-fleet"
	cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	mut(&cfg)
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
}

func startRelay(t *testing.T) *relaytest.Relay {
	t.Helper()
	r, err := relaytest.Start(token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func accept(t *testing.T, r *relaytest.Relay) *relaytest.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := r.Accept(ctx)
	if err != nil {
		t.Fatalf("no worker attached: %v", err)
	}
	return c
}
