package remote

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

// fakeServer speaks the protocol from a script, for behaviour the real
// pulse-server cannot be made to show: an older server without the
// capabilities action or seq numbers, and a server that never confirms a
// cancellation. Everything else is tested against the real server.
func fakeServer(t *testing.T, answer func(ctx context.Context, ws *websocket.Conn, action string, payload map[string]any)) string {
	t.Helper()
	return fakeServerUpgrading(t, nil, answer)
}

// fakeServerUpgrading is fakeServer calling upgrade, if not nil, with
// each upgrade request before it is answered (to look at its headers
// and set the response's).
func fakeServerUpgrading(t *testing.T, upgrade func(w http.ResponseWriter, r *http.Request),
	answer func(ctx context.Context, ws *websocket.Conn, action string, payload map[string]any)) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if upgrade != nil {
			upgrade(w, r)
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			_, data, err := ws.Read(r.Context())
			if err != nil {
				return
			}
			var m struct {
				Action  string         `json:"action"`
				Payload map[string]any `json:"payload"`
			}
			json.Unmarshal(data, &m)
			answer(r.Context(), ws, m.Action, m.Payload)
		}
	}))
	t.Cleanup(hs.Close)
	return "ws" + strings.TrimPrefix(hs.URL, "http") + "/"
}

func send(ctx context.Context, ws *websocket.Conn, typ string, payload map[string]any) {
	b, _ := json.Marshal(map[string]any{"type": typ, "payload": payload})
	ws.Write(ctx, websocket.MessageText, b)
}

var hostCaps = map[string]any{"isolation": "host_unsafe", "network": map[string]string{"allow-all": "strong"},
	"secrets": map[string]string{"deny-all": "best-effort"}}

// TestOlderServer: a server without the capabilities action (the Python
// server) is a version error, not "unreachable".
func TestOlderServer(t *testing.T) {
	url := fakeServer(t, func(ctx context.Context, ws *websocket.Conn, action string, p map[string]any) {
		send(ctx, ws, protocol.TypeError, map[string]any{"message": protocol.MsgUnknown, "request_id": p["request_id"]})
	})
	b := mustNew(t, WithURL(url), WithToken("t"))
	err := probe(b)
	if !errors.Is(err, ErrVersion) || !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "upgrade pulse-server") {
		t.Fatalf("Probe: %v; want ErrVersion saying to upgrade", err)
	}
	if c := b.Capabilities(); len(c.Network) != 0 {
		t.Errorf("capabilities claimed after a failed Probe: %+v", c)
	}
}

// TestUnconfirmedCancel: a server that never confirms a cancellation does
// not hang Exec beyond the cancel wait; the Result says cancelled.
func TestUnconfirmedCancel(t *testing.T) {
	url := fakeServer(t, func(ctx context.Context, ws *websocket.Conn, action string, p map[string]any) {
		switch action {
		case protocol.ActionCapabilities:
			send(ctx, ws, protocol.TypeResponse, map[string]any{"status": protocol.StatusCapabilities, "request_id": p["request_id"], "capabilities": hostCaps})
		case protocol.ActionSubmit:
			send(ctx, ws, protocol.TypeResponse, map[string]any{"status": protocol.StatusStarting, "request_id": p["request_id"], "execution_id": p["execution_id"]})
			send(ctx, ws, protocol.TypeStream, map[string]any{"execution_id": p["execution_id"], "stream": "stdout", "data": "c3RhcnRlZAo=", "seq": 1, "encoding": "base64"})
		}
		// cancel: no answer, no result.
	})
	b := newBackend(t, url, WithCancelWait(300*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	var out buffer
	go func() {
		<-out.when("started")
		cancel()
	}()
	res, err := b.Exec(ctx, &backend.Request{Workspace: t.TempDir(), Shell: "sleep 100", Network: allowAll, Stdout: &out})
	if err != nil || res.Termination != backend.Cancelled || res.ExitCode != -1 {
		t.Fatalf("Exec: %+v, %v; want a cancelled result", res, err)
	}
}

// TestUnnumberedEventsCannotResume: events without seq (an older server)
// cannot be resumed exactly after a drop, and the client says so rather
// than risk repeating output.
func TestUnnumberedEventsCannotResume(t *testing.T) {
	url := fakeServer(t, func(ctx context.Context, ws *websocket.Conn, action string, p map[string]any) {
		switch action {
		case protocol.ActionCapabilities:
			send(ctx, ws, protocol.TypeResponse, map[string]any{"status": protocol.StatusCapabilities, "request_id": p["request_id"], "capabilities": hostCaps})
		case protocol.ActionSubmit:
			send(ctx, ws, protocol.TypeResponse, map[string]any{"status": protocol.StatusStarting, "request_id": p["request_id"], "execution_id": p["execution_id"]})
			send(ctx, ws, protocol.TypeStream, map[string]any{"execution_id": p["execution_id"], "stream": "stdout", "data": "partial\n"})
			ws.CloseNow()
		}
	})
	b := newBackend(t, url)
	var out buffer
	_, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "x", Network: allowAll, Stdout: &out})
	if !errors.Is(err, ErrVersion) || out.String() != "partial\n" {
		t.Fatalf("Exec: %v, stdout %q; want ErrVersion after the partial output", err, out.String())
	}
}

// TestNotPulseWebSocket: a WebSocket endpoint that is not a pulse-server
// (here, an echo) is a version error, not "unreachable".
func TestNotPulseWebSocket(t *testing.T) {
	url := fakeServer(t, func(ctx context.Context, ws *websocket.Conn, action string, p map[string]any) {
		b, _ := json.Marshal(map[string]any{"action": action, "payload": p})
		ws.Write(ctx, websocket.MessageText, b)
	})
	err := probe(mustNew(t, WithURL(url), WithToken("t")))
	if !errors.Is(err, ErrVersion) || errors.Is(err, ErrUnreachable) {
		t.Fatalf("Probe of an echo server: %v; want ErrVersion", err)
	}
}

// TestResubmitIsNeverASecondRun: the connection drops while a submission
// carrying the workspace is in flight, the attach that follows finds
// nothing (the server has not registered it yet), and the server then
// registers the first submission after all. The resubmission must not
// start a second run: it goes under the same id, the server refuses it as
// a duplicate, and the client follows the first. This server registers
// whatever id a submission names, as pulse-server does, so a resubmission
// under another id would run the command twice.
func TestResubmitIsNeverASecondRun(t *testing.T) {
	var (
		mu       sync.Mutex
		first    string
		runs     int
		submits  int
		attaches int
	)
	result := func(ctx context.Context, ws *websocket.Conn, id string) {
		send(ctx, ws, protocol.TypeResult, map[string]any{"execution_id": id, "exit_code": 0, "stdout": "", "stderr": "",
			"termination_reason": "exited", "duration_ms": 1})
	}
	url := fakeServer(t, func(ctx context.Context, ws *websocket.Conn, action string, p map[string]any) {
		mu.Lock()
		defer mu.Unlock()
		id, _ := p["execution_id"].(string)
		switch action {
		case protocol.ActionCapabilities:
			send(ctx, ws, protocol.TypeResponse, map[string]any{"status": protocol.StatusCapabilities, "request_id": p["request_id"],
				"capabilities": hostCaps, "features": []string{protocol.FeatureWorkspace}})
		case protocol.ActionSubmit:
			submits++
			if _, inline := p["workspace"]; !inline {
				t.Errorf("submission %d did not carry the workspace", submits)
			}
			switch {
			case submits == 1:
				// Registered, but the acknowledgement is lost with the
				// connection.
				first = id
				runs++
				ws.CloseNow()
			case id == first:
				send(ctx, ws, protocol.TypeError, map[string]any{"message": protocol.MsgInvalid, "code": protocol.CodeDuplicate, "request_id": p["request_id"]})
			default:
				runs++
				send(ctx, ws, protocol.TypeResponse, map[string]any{"status": protocol.StatusStarting, "request_id": p["request_id"], "execution_id": id})
				result(ctx, ws, id)
			}
		case protocol.ActionAttach:
			attaches++
			if attaches == 1 {
				// Looked before the first submission was registered.
				send(ctx, ws, protocol.TypeError, map[string]any{"message": protocol.MsgNotFound, "code": protocol.CodeNotFound, "request_id": p["request_id"]})
				return
			}
			send(ctx, ws, protocol.TypeResponse, map[string]any{"status": protocol.StatusAttached, "request_id": p["request_id"], "execution_id": id})
			result(ctx, ws, id)
		}
	})
	b := newBackend(t, url, WithReconnectWindow(20*time.Second))
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := b.Exec(ctx, &backend.Request{Workspace: ws, Shell: "true", Network: allowAll})
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Fatalf("the command ran %d times (submissions %d, attaches %d)", runs, submits, attaches)
	}
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec: %+v, %v; want the first submission's result", res, err)
	}
	if submits != 2 || attaches != 2 {
		t.Errorf("submissions %d, attaches %d; want 2 and 2 (the resubmission refused, then followed)", submits, attaches)
	}
}
