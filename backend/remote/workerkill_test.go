package remote

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestRelayWorkerKilledMidExecution: the pulse-worker process running a
// client's command is SIGKILLed (the worker alone, as the OOM killer or a
// node loss would end it). The client's Exec must return, not hang, with
// an error that says the execution was lost with its worker
// (ErrExecutionLost, and backend.ErrUnavailable as the protocol has it),
// never a Result, and the command must not live on without its worker.
func TestRelayWorkerKilledMidExecution(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a pulse-worker process; skipped with -short")
	}
	url, worker := startRelayWorker(t)
	b := newBackend(t, url)

	// A sleep no other process on the machine has in its argv: this
	// test process's pid, in seconds.
	marker := strconv.Itoa(100000 + os.Getpid())
	var out buffer
	started := out.when("started")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type outcome struct {
		res *backend.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := b.Exec(ctx, &backend.Request{ExecutionID: t.Name(), Workspace: t.TempDir(),
			Shell:   "echo started; sleep " + marker + "; echo finished",
			Network: allowAll, Secrets: denySecrets, Stdout: &out})
		done <- outcome{res, err}
	}()
	select {
	case <-started:
	case o := <-done:
		t.Fatalf("ended before its worker was killed: %+v, %v", o.res, o.err)
	}
	if err := worker.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	var o outcome
	select {
	case o = <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("Exec still waiting 90s after its worker was killed")
	}
	if o.err == nil {
		t.Fatalf("a command whose worker was killed returned a result and no error: %+v", o.res)
	}
	t.Logf("Exec: %v", o.err)
	if errors.Is(o.err, context.DeadlineExceeded) || errors.Is(o.err, context.Canceled) {
		t.Fatalf("Exec ended only with its context: %v", o.err)
	}
	if !errors.Is(o.err, ErrExecutionLost) || !errors.Is(o.err, backend.ErrUnavailable) {
		t.Errorf("error %v: want ErrExecutionLost and backend.ErrUnavailable", o.err)
	}
	// Words a person can act on: which worker, and that the command had
	// started (not that it could not be started).
	if msg := o.err.Error(); !strings.Contains(msg, "remote-test-worker") || strings.Contains(msg, "could not start") {
		t.Errorf("the error does not say the worker running it was lost: %v", o.err)
	}
	if strings.Contains(out.String(), "finished") {
		t.Errorf("the command finished after its worker was killed; stdout %q", out.String())
	}
	// The worker's box (or its bash) goes with it.
	testenv.Eventually(t, 30*time.Second, func() error {
		if pids := argvHolding("sleep\x00" + marker); len(pids) > 0 {
			return errors.New("the command outlived its worker: " + strings.Join(pids, ", "))
		}
		return nil
	})
}

// argvHolding lists the pids whose NUL-separated argv contains s.
func argvHolding(s string) []string {
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}
