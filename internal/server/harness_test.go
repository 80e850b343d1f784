package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

const (
	tokenA = "tenant-a-token"
	tokenB = "tenant-b-token"
)

type harness struct {
	t      testing.TB
	srv    *Server
	st     *store.Store
	http   *httptest.Server
	url    string
	root   string
	dbPath string
}

// hostExecutor is the embedded executor over the real host backend; the
// host backend cannot deny the network, so tests run with allow-all as
// pulse-server does under --unsafe-host.
func hostExecutor(t testing.TB) Executor {
	t.Helper()
	b, err := host.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Probe(context.Background()); err != nil {
		t.Skipf("host backend unavailable: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return NewLocal(b, 0, nil)
}

func hostPolicies() Option {
	return WithDefaultPolicies(policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, secrets.DenyAllSecrets())
}

func startServer(t testing.TB, dir string, exec Executor, opts ...Option) *harness {
	t.Helper()
	h := &harness{t: t, root: filepath.Join(dir, "workspaces"), dbPath: filepath.Join(dir, "db.sqlite3")}
	st, err := store.Open(context.Background(), h.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	h.st = st
	all := append([]Option{WithTokens(tokenA, tokenB), WithWorkspaceRoot(h.root), hostPolicies()}, opts...)
	srv, err := New(context.Background(), exec, st, all...)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	h.srv = srv
	h.http = httptest.NewServer(srv.Handler()) // listens on 127.0.0.1
	h.url = "ws" + strings.TrimPrefix(h.http.URL, "http")
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.http == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.srv.Shutdown(ctx)
	h.http.Close()
	h.st.Close()
	h.http = nil
}

type client struct {
	t    testing.TB
	ws   *websocket.Conn
	next atomic.Int64
}

func (h *harness) dial(token string) *client {
	h.t.Helper()
	c, err := dialToken(h.url, token)
	if err != nil {
		h.t.Fatalf("dial: %v", err)
	}
	cl := &client{t: h.t, ws: c}
	h.t.Cleanup(func() { c.CloseNow() })
	return cl
}

func dialToken(url, token string) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(128 << 20)
	return c, nil
}

// msg is a decoded server frame.
type msg struct {
	Type    string         `json:"type"`
	Payload map[string]any `json:"payload"`
	raw     string
}

func (m msg) str(k string) string { s, _ := m.Payload[k].(string); return s }
func (m msg) num(k string) int64  { f, _ := m.Payload[k].(float64); return int64(f) }

// send sends an action and returns the request id it used.
func (c *client) send(action string, payload map[string]any) string {
	c.t.Helper()
	id := fmt.Sprintf("r%d", c.next.Add(1))
	if payload == nil {
		payload = map[string]any{}
	}
	if _, set := payload["request_id"]; !set {
		payload["request_id"] = id
	} else {
		id, _ = payload["request_id"].(string)
	}
	b, _ := json.Marshal(map[string]any{"action": action, "payload": payload})
	c.sendRaw(b)
	return id
}

func (c *client) sendRaw(b []byte) {
	c.t.Helper()
	// As generous as recv: the server reads a frame of many megabytes (the
	// stdin cap tests send 22 MB) slowly under the race detector on a loaded
	// machine, and the write waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), frameWait)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// frameWait bounds one frame's write or read. Generous: the server
// decodes a frame of many megabytes (TestSubmitStdin's too-large stdin is
// 22 MB of JSON, parsed three times) in 40 s under the race detector at a
// load of 25 on 2 cores, and past 90 s when busier; the deadline only
// decides how long a broken server takes to fail.
const frameWait = 5 * time.Minute

func (c *client) recv() msg {
	c.t.Helper()
	m, err := c.tryRecv(frameWait)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return m
}

func (c *client) tryRecv(d time.Duration) (msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, data, err := c.ws.Read(ctx)
	if err != nil {
		return msg{}, err
	}
	var m msg
	if err := json.Unmarshal(data, &m); err != nil {
		return msg{}, fmt.Errorf("frame %q: %w", data, err)
	}
	m.raw = string(data)
	return m, nil
}

// reply waits for the response or error carrying requestID, collecting
// stream and result frames seen on the way.
func (c *client) reply(requestID string) (msg, []msg) {
	c.t.Helper()
	var other []msg
	for {
		m := c.recv()
		if (m.Type == protocol.TypeResponse || m.Type == protocol.TypeError) && m.Payload["request_id"] == requestID {
			return m, other
		}
		other = append(other, m)
	}
}

// do sends and waits for the reply.
func (c *client) do(action string, payload map[string]any) (msg, []msg) {
	c.t.Helper()
	return c.reply(c.send(action, payload))
}

// untilResult reads until the result frame of id, returning it and the
// stream frames of id seen on the way.
func (c *client) untilResult(id string, seen []msg) (msg, []msg) {
	c.t.Helper()
	var streams []msg
	handle := func(m msg) bool {
		if m.Type == protocol.TypeStream && m.str("execution_id") == id {
			streams = append(streams, m)
		}
		return m.Type == protocol.TypeResult && m.str("execution_id") == id
	}
	for _, m := range seen {
		if handle(m) {
			return m, streams
		}
	}
	for {
		m := c.recv()
		if handle(m) {
			return m, streams
		}
	}
}

func (c *client) submit(id string, command any, extra map[string]any) msg {
	c.t.Helper()
	p := map[string]any{"execution_id": id, "command": command}
	for k, v := range extra {
		p[k] = v
	}
	r, _ := c.do(protocol.ActionSubmit, p)
	return r
}

type file struct {
	name, data string
}

func targz(t testing.TB, files ...file) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f.data))
	}
	tw.Close()
	zw.Close()
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// untar decodes a download into name → content (directories as "/").
func untar(t *testing.T, b64 string) map[string]string {
	t.Helper()
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(tr)
		out[h.Name] = b.String()
	}
}
