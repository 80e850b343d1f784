package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestWorkerKilledMidExecutionEndsWithAnError: a pulse-worker process is
// SIGKILLed while its command runs. The client, still connected, must get
// a terminal frame that says the execution was lost with its worker —
// never a hang, never a success.
func TestWorkerKilledMidExecutionEndsWithAnError(t *testing.T) {
	dir := t.TempDir()
	s := start(t, []string{"--development", "--executor", "relay", "--worker-listen", "127.0.0.1:0", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token", "PULSE_WORKER_TOKEN": "worker-token"})
	w := testenv.Command(t, "pulse-worker")
	w.Env = append(w.Env, "RELAY_ADDR="+s.workers, "SANDBOX_TOKEN=worker-token", "SANDBOX_ID=doomed")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { w.Process.Kill(); w.Wait() }()
	testenv.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + s.api + "/metrics")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "pulse_server_workers 1") {
			return errors.New("the worker has not attached")
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+s.api, &websocket.DialOptions{
		HTTPHeader: map[string][]string{"Authorization": {"Bearer dev-token"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	msg, _ := json.Marshal(map[string]any{"action": "submit", "payload": map[string]any{
		"execution_id": "doomed-1", "command": "echo started; sleep 120; echo finished", "request_id": "q1", "stream": true}})
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatal(err)
	}
	killed := false
	var frames []string
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("no terminal frame after the worker was killed (%v); frames:\n%s", err, strings.Join(frames, "\n"))
		}
		frames = append(frames, string(data))
		var f struct {
			Type    string         `json:"type"`
			Payload map[string]any `json:"payload"`
		}
		json.Unmarshal(data, &f)
		if data, _ := f.Payload["data"].(string); !killed && f.Type == "stream" && strings.Contains(data, "started") {
			if err := w.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
			continue
		}
		if f.Type == "result" || f.Type == "error" {
			if !killed {
				t.Fatalf("ended before the command started: %s", data)
			}
			t.Logf("frames:\n%s", strings.Join(frames, "\n"))
			if out, _ := f.Payload["stdout"].(string); strings.Contains(out, "finished") {
				t.Fatalf("the command finished after its worker was killed: %s", data)
			}
			if code, _ := f.Payload["exit_code"].(float64); f.Type == "result" && code == 0 {
				t.Fatalf("a lost execution reads as a success: %s", data)
			}
			// The protocol's code for it, and words a person can act on.
			if f.Payload["error_code"] != "WORKER_LOST" || !strings.Contains(f.Payload["stderr"].(string), "worker doomed") {
				t.Errorf("the terminal frame does not say which worker was lost: %s", data)
			}
			return
		}
	}
}
