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
	"github.com/pulse-agent/pulse/protocol"
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
	msg, _ := protocol.EncodeRequest(protocol.ActionSubmit, &protocol.Submit{ExecutionID: "fast-path", Command: protocol.Command{Shell: "head -c 300000 /dev/urandom; echo err >&2"},
		Encoding: protocol.EncodingBase64, Network: &allowAll, Secrets: &denySecrets})
	if err := ws.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatal(err)
	}
	streams := 0
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slow, err := protocol.ParseFrame(data)
		if err != nil {
			t.Fatalf("server frame refused: %v", err)
		}
		if slow.Stream != nil {
			streams++
			fast, ok := fastStream(data)
			if !ok {
				t.Fatalf("the fast path does not take the server's stream frame %.120s", data)
			}
			if !reflect.DeepEqual(fast.Stream, slow.Stream) {
				t.Fatalf("fast %+v, slow %+v", fast.Stream, slow.Stream)
			}
		}
		if slow.Result != nil {
			skimmed := skimResult(bytes.Clone(data))
			if len(skimmed) >= len(data) {
				t.Errorf("a result with 300 kB of stdout was not skimmed")
			}
			got, err := protocol.ParseFrame(skimmed)
			if err != nil || !reflect.DeepEqual(got.Result, slow.Result) && !sameButStdout(got.Result, slow.Result) {
				t.Fatalf("skimmed result differs: %v", err)
			}
			break
		}
	}
	if streams == 0 {
		t.Fatal("no stream frame seen")
	}
}

// sameButStdout: equal but for the bulk fields skimResult may empty (the
// client reads output from the stream events).
func sameButStdout(a, b *protocol.Result) bool {
	x, y := *a, *b
	x.Stdout, y.Stdout, x.Stderr, y.Stderr = "", "", "", ""
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
			slow, err := protocol.ParseFrame(data)
			if err != nil || slow.Stream == nil {
				t.Fatalf("fast path took %q, which parseFrame refuses: %v", data, err)
			}
			if !reflect.DeepEqual(fast.Stream, slow.Stream) {
				t.Fatalf("fast %+v, slow %+v", fast.Stream, slow.Stream)
			}
		}
		if !json.Valid(data) {
			return
		}
		slow, err := protocol.ParseFrame(data)
		if err != nil || slow.Result == nil {
			return
		}
		skim, err := protocol.ParseFrame(skimResult(bytes.Clone(data)))
		if err != nil || skim.Result == nil {
			t.Fatalf("skimming broke a valid result %q: %v", data, err)
		}
		if !sameButStdout(skim.Result, slow.Result) {
			t.Fatalf("skimmed %+v, full %+v", skim.Result, slow.Result)
		}
	})
}
