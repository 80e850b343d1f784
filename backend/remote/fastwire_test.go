package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestFastPathsMatchServer captures real frames from pulse-server and
// checks that the fast paths take the stream frames (so a change of the
// server's format does not silently fall back to the slow path) and that
// the skimmed result decodes as the full one.
func TestFastPathsMatchServer(t *testing.T) {
	ts := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, ts.url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + testToken}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(64 << 20)
	msg, _ := request(actionSubmit, map[string]any{"execution_id": "fast-path", "command": "head -c 300000 /dev/urandom; echo err >&2",
		"encoding": "base64", "network": allowAll, "secrets": denySecrets})
	if err := ws.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatal(err)
	}
	streams := 0
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slow, err := parseFrame(data)
		if err != nil {
			t.Fatalf("server frame refused: %v", err)
		}
		if slow.stream != nil {
			streams++
			fast, ok := fastStream(data)
			if !ok {
				t.Fatalf("the fast path does not take the server's stream frame %.120s", data)
			}
			if !reflect.DeepEqual(fast.stream, slow.stream) {
				t.Fatalf("fast %+v, slow %+v", fast.stream, slow.stream)
			}
		}
		if slow.result != nil {
			skimmed := skimResult(bytes.Clone(data))
			if len(skimmed) >= len(data) {
				t.Errorf("a result with 300 kB of stdout was not skimmed")
			}
			got, err := parseFrame(skimmed)
			if err != nil || !reflect.DeepEqual(got.result, slow.result) && !sameButStdout(got.result, slow.result) {
				t.Fatalf("skimmed result %+v, %v; want %+v", got.result, err, slow.result)
			}
			break
		}
	}
	if streams == 0 {
		t.Fatal("no stream frame seen")
	}
}

func sameButStdout(a, b *resultPayload) bool {
	x, y := *a, *b
	x.Stderr, y.Stderr = "", ""
	return reflect.DeepEqual(x, y)
}

// FuzzFastPaths: whatever a fast path accepts, parseFrame accepts with
// the same meaning; a skimmed valid result stays valid and equal.
func FuzzFastPaths(f *testing.F) {
	f.Add([]byte(`{"type":"stream","payload":{"execution_id":"e-1","stream":"stdout","data":"aGVsbG8=","seq":7,"encoding":"base64"}}`))
	f.Add([]byte(`{"type":"stream","payload":{"execution_id":"e","stream":"stderr","data":"","seq":1,"encoding":"base64"}}`))
	f.Add([]byte(`{"type":"result","payload":{"execution_id":"e","command":"x","exit_code":0,"stdout":"` + strings.Repeat("QUFB", 20000) + `","stderr":"eg==","termination_reason":"exited"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if fast, ok := fastStream(data); ok {
			slow, err := parseFrame(data)
			if err != nil || slow.stream == nil {
				t.Fatalf("fast path took %q, which parseFrame refuses: %v", data, err)
			}
			if !reflect.DeepEqual(fast.stream, slow.stream) {
				t.Fatalf("fast %+v, slow %+v", fast.stream, slow.stream)
			}
		}
		if !json.Valid(data) {
			return
		}
		slow, err := parseFrame(data)
		if err != nil || slow.result == nil {
			return
		}
		skim, err := parseFrame(skimResult(bytes.Clone(data)))
		if err != nil || skim.result == nil {
			t.Fatalf("skimming broke a valid result %q: %v", data, err)
		}
		a, b := *skim.result, *slow.result
		a.Stderr, b.Stderr = "", ""
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("skimmed %+v, full %+v", a, b)
		}
	})
}
