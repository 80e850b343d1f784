package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// A pulse-server replica is SIGKILLed while a worker attached to both
// replicas runs its command. The worker stops the command with the
// connection (it is not run on, nor again); replica b, finding a's lease
// expired, marks the execution UNKNOWN and says which replica died; a
// client following it on b is told so; a restarted a keeps that answer.
func TestReplicaKilledMidRunEndsUnknownOnAnother(t *testing.T) {
	url := testenv.SharedPostgres(t).NewDatabase(t)
	dir := t.TempDir()
	vars := map[string]string{"PULSE_REMOTE_TOKEN": "dev-token", "PULSE_WORKER_TOKEN": "worker-token"}
	args := func(id, port, workers string) []string {
		return []string{"--development", "--executor", "relay", "--host", "127.0.0.1", "--port", port, "--worker-listen", workers,
			"--workspace-root", filepath.Join(dir, "ws-"+id), "--database", url, "--replica-id", id, "--replica-lease", "1s"}
	}
	apiA, workersA := testenv.FreeAddr(t), testenv.FreeAddr(t)
	startA := func() *exec.Cmd {
		_, port, _ := strings.Cut(apiA, ":")
		cmd := testenv.Command(t, "pulse-server", args("a", port, workersA)...)
		for k, v := range vars {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stderr = &testenv.SyncBuffer{}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	a := startA()
	b := start(t, args("b", "0", "127.0.0.1:0"), vars)

	w := testenv.Command(t, "pulse-worker")
	w.Env = append(w.Env, "RELAY_ADDR="+workersA+","+b.workers, "SANDBOX_TOKEN=worker-token", "SANDBOX_ID=both", "WORKER_MAX_CONCURRENT=2")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait() })
	for _, api := range []string{apiA, b.api} {
		waitWorkers(t, api, 1)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	marker := filepath.Join(dir, "finished")
	ca := dialWS(ctx, t, apiA)
	sendWS(ctx, t, ca, map[string]any{"action": "submit", "payload": map[string]any{
		"request_id": "s1", "execution_id": "orphan-1", "command": "echo started; sleep 3; echo finished > " + marker}})
	for {
		f := readWS(ctx, t, ca)
		if f.Type == "error" || f.Type == "result" {
			t.Fatalf("on a before the first line: %+v", f)
		}
		if f.Type == "stream" {
			break
		}
	}
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.Wait()

	cb := dialWS(ctx, t, b.api)
	sendWS(ctx, t, cb, map[string]any{"action": "attach", "payload": map[string]any{"request_id": "r1", "execution_id": "orphan-1", "after_seq": 0}})
	var trace []string
	reason := ""
	for reason == "" {
		f := readWS(ctx, t, cb)
		raw, _ := json.Marshal(f)
		trace = append(trace, string(raw))
		switch {
		case f.Type == "stream" || (f.Type == "response" && f.Payload["status"] == "ATTACHED"):
		case f.Type == "response" && f.Payload["status"] == "UNKNOWN":
			reason, _ = f.Payload["reason"].(string)
			if !strings.Contains(reason, "replica a ") {
				t.Fatalf("the UNKNOWN answer does not name the dead replica:\n%s", strings.Join(trace, "\n"))
			}
		default:
			t.Fatalf("unexpected frame after replica a died:\n%s", strings.Join(trace, "\n"))
		}
	}
	// The command would have written the marker 3 seconds in; the worker
	// stopped it with its connection to a. Waited for past that point.
	time.Sleep(4 * time.Second)
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the command ran on after its replica died (%v)", err)
	}
	startA() // stopped by its cleanup
	waitWorkers(t, apiA, 1)
	fs := exchange(t, apiA, "dev-token", map[string]any{"action": "status", "payload": map[string]any{"execution_id": "orphan-1"}},
		func(f frame) bool { return f.Type == "response" })
	if st := fs[len(fs)-1].Payload; st["status"] != "UNKNOWN" || st["reason"] != reason {
		t.Fatalf("restarted a answers %v; want UNKNOWN with %q", st, reason)
	}
	// And the fleet still runs work: through the restarted a.
	fs = exchange(t, apiA, "dev-token", map[string]any{"action": "submit", "payload": map[string]any{
		"request_id": "s2", "execution_id": "after-1", "command": "echo after"}},
		func(f frame) bool { return f.Type == "result" || f.Type == "error" })
	if last := fs[len(fs)-1]; last.Type != "result" || last.Payload["stdout"] != "after\n" {
		t.Fatalf("after the restart: %+v", last)
	}
}

// waitWorkers waits until the server at api counts n attached workers.
func waitWorkers(t *testing.T, api string, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + api + "/metrics")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("pulse_server_workers %d\n", n); !strings.Contains(string(b), want) {
			return fmt.Errorf("%s has not %d workers attached", api, n)
		}
		return nil
	})
}

func dialWS(ctx context.Context, t *testing.T, api string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(ctx, "ws://"+api, &websocket.DialOptions{HTTPHeader: map[string][]string{"Authorization": {"Bearer dev-token"}}})
	if err != nil {
		t.Fatalf("dial %s: %v", api, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func sendWS(ctx context.Context, t *testing.T, c *websocket.Conn, msg map[string]any) {
	t.Helper()
	b, _ := json.Marshal(msg)
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

func readWS(ctx context.Context, t *testing.T, c *websocket.Conn) frame {
	t.Helper()
	_, data, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var f frame
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return f
}
