package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/protocol"
)

// streamText joins the stdout events of a base64 execution.
func streamText(t *testing.T, events []msg) string {
	t.Helper()
	var b strings.Builder
	for _, m := range events {
		if m.Type != protocol.TypeStream || m.str("stream") != "stdout" {
			continue
		}
		d, err := base64.StdEncoding.DecodeString(m.str("data"))
		if err != nil {
			t.Fatal(err)
		}
		b.Write(d)
	}
	return b.String()
}

func TestProcessStdinSignalAndTenants(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	a := h.dial(tokenA)
	caps, _ := a.do(protocol.ActionCapabilities, nil)
	feats, _ := caps.Payload["features"].([]any)
	if !slices.Contains(feats, any(protocol.FeatureProcess)) || !slices.Contains(feats, any(protocol.FeatureDial)) {
		t.Fatalf("features %v lack process and dial", feats)
	}
	r := a.submit("p1", `read x; echo "got $x"; trap 'echo caught; exit 7' USR1; echo armed; while :; do sleep 0.05; done`,
		map[string]any{"process": true, "encoding": "base64"})
	if r.str("status") != protocol.StatusStarting {
		t.Fatalf("submit: %s", r.raw)
	}

	// Input arrives in order, each byte once, whatever is sent again.
	var seen []msg
	for _, in := range []map[string]any{
		{"offset": 0, "data": base64.StdEncoding.EncodeToString([]byte("h"))},
		{"offset": 0, "data": base64.StdEncoding.EncodeToString([]byte("hi"))}, // a resend: only "i" is new
		{"offset": 2, "data": base64.StdEncoding.EncodeToString([]byte("\n"))},
	} {
		in["execution_id"] = "p1"
		rep, other := a.do(protocol.ActionStdin, in)
		seen = append(seen, other...)
		if rep.str("status") != protocol.StatusStdin {
			t.Fatalf("stdin: %s", rep.raw)
		}
	}
	rep, other := a.do(protocol.ActionStdin, map[string]any{"execution_id": "p1", "offset": 9, "data": "eA=="})
	seen = append(seen, other...)
	if rep.str("code") != protocol.CodeInvalid {
		t.Errorf("stdin past what was received: %s", rep.raw)
	}

	// Another tenant can neither signal, write to, nor dial it.
	b := h.dial(tokenB)
	if rep, _ := b.do(protocol.ActionSignal, map[string]any{"execution_id": "p1", "signal": "KILL"}); rep.str("code") != protocol.CodeNotFound {
		t.Errorf("foreign signal: %s", rep.raw)
	}
	if rep, _ := b.do(protocol.ActionStdin, map[string]any{"execution_id": "p1", "offset": 3, "data": "eA=="}); rep.str("code") != protocol.CodeNotFound {
		t.Errorf("foreign stdin: %s", rep.raw)
	}
	if status, code := dialStatus(t, h.url, tokenB, "p1", "80"); status != http.StatusNotFound || code != protocol.CodeNotFound {
		t.Errorf("foreign dial: HTTP %d %s", status, code)
	}

	for !strings.Contains(streamText(t, seen), "armed\n") {
		seen = append(seen, a.recv())
	}
	rep, other = a.do(protocol.ActionSignal, map[string]any{"execution_id": "p1", "signal": "USR1"})
	seen = append(seen, other...)
	if rep.str("status") != protocol.StatusSignalled {
		t.Fatalf("signal: %s", rep.raw)
	}
	res, streams := a.untilResult("p1", seen)
	if got := streamText(t, streams); got != "got hi\narmed\ncaught\n" {
		t.Errorf("output %q", got)
	}
	if res.num("exit_code") != 7 {
		t.Errorf("result: %s", res.raw)
	}
	// After the end: not running; a plain submission is no process.
	if rep, _ := a.do(protocol.ActionSignal, map[string]any{"execution_id": "p1", "signal": "TERM"}); rep.str("code") != protocol.CodeNotRunning {
		t.Errorf("signal after the end: %s", rep.raw)
	}
	a.submit("plain", "sleep 5", nil)
	if rep, _ := a.do(protocol.ActionSignal, map[string]any{"execution_id": "plain", "signal": "TERM"}); rep.str("code") != protocol.CodeUnsupported {
		t.Errorf("signal of a plain submission: %s", rep.raw)
	}
	a.do(protocol.ActionCancel, map[string]any{"execution_id": "plain"})
}

// TestProcessRefusedToStart: a process the executor cannot start is
// answered with an error frame of its class, not STARTING.
func TestProcessRefusedToStart(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	a := h.dial(tokenA)
	r := a.submit("p2", []string{"/nonexistent/program"}, map[string]any{"process": true})
	if r.Type != protocol.TypeError || r.str("code") == "" || r.str("status") == protocol.StatusStarting {
		t.Fatalf("submit of a missing program: %s", r.raw)
	}
}

// TestProcessRefusedWithoutHandle: the relay keeps no handle on what a
// worker runs, so a process submission is refused before anything runs
// and the features say so.
func TestProcessRefusedWithoutHandle(t *testing.T) {
	rl, err := relay.New([]string{"worker-token"})
	if err != nil {
		t.Fatal(err)
	}
	h := startServer(t, t.TempDir(), rl)
	a := h.dial(tokenA)
	caps, _ := a.do(protocol.ActionCapabilities, nil)
	if feats, _ := caps.Payload["features"].([]any); slices.Contains(feats, any(protocol.FeatureProcess)) {
		t.Errorf("the relay lists %v", feats)
	}
	if r := a.submit("p3", "true", map[string]any{"process": true}); r.str("code") != protocol.CodeUnsupported {
		t.Errorf("process on the relay: %s", r.raw)
	}
}

// dialStatus tries a dial and returns the HTTP status and the code of a
// refusal.
func dialStatus(t *testing.T, url, token, id, port string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{
		"Authorization": {"Bearer " + token}, protocol.HeaderDialExecution: {id}, protocol.HeaderDialPort: {port}}})
	if err == nil {
		ws.CloseNow()
		return http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("dial: %v", err)
	}
	var f msg
	body, _ := io.ReadAll(resp.Body)
	json.Unmarshal(body, &f)
	return resp.StatusCode, f.str("code")
}

// TestDialReachesAnExposedPort: a dial reaches a port the execution's
// policy exposes (the host backend's network is the host's, so the
// listener is this test's), and only such a port.
func TestDialReachesAnExposedPort(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				n, _ := c.Read(buf)
				c.Write([]byte("echo:" + string(buf[:n])))
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	a := h.dial(tokenA)
	r := a.submit("d1", "sleep 30", map[string]any{"process": true,
		"network": map[string]any{"mode": "allow-all", "expose": []int{port}}})
	if r.str("status") != protocol.StatusStarting {
		t.Fatalf("submit: %s", r.raw)
	}
	if status, code := dialStatus(t, h.url, tokenA, "d1", strconv.Itoa(port+1)); status != http.StatusForbidden || code != protocol.CodeNotExposed {
		t.Errorf("dial of an unexposed port: HTTP %d %s", status, code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, h.url, &websocket.DialOptions{HTTPHeader: http.Header{
		"Authorization": {"Bearer " + tokenA}, protocol.HeaderDialExecution: {"d1"}, protocol.HeaderDialPort: {strconv.Itoa(port)}}})
	if err != nil {
		t.Fatal(err)
	}
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	defer nc.Close()
	nc.Write([]byte("ping"))
	got, _ := io.ReadAll(nc)
	if string(got) != "echo:ping" {
		t.Errorf("through the dial: %q", got)
	}
	a.do(protocol.ActionCancel, map[string]any{"execution_id": "d1"})
	if status, code := dialStatus(t, h.url, tokenA, "d1", strconv.Itoa(port)); status != http.StatusNotFound || code != protocol.CodeNotFound {
		t.Errorf("dial after the end: HTTP %d %s", status, code)
	}
}
