package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// stdout joins the stream events of one execution, decoding base64 ones.
func joinStdout(t *testing.T, streams []msg) []byte {
	t.Helper()
	var out []byte
	for _, s := range streams {
		if s.str("stream") != "stdout" {
			continue
		}
		if s.str("encoding") == "base64" {
			b, err := base64.StdEncoding.DecodeString(s.str("data"))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b...)
		} else {
			out = append(out, s.str("data")...)
		}
	}
	return out
}

// featureClient starts a host-executor server and dials it, failing
// unless its capabilities list feature.
func featureClient(t *testing.T, feature string) (*harness, *client) {
	t.Helper()
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	if caps, _ := c.do(protocol.ActionCapabilities, nil); !hasFeature(caps, feature) {
		t.Fatalf("capabilities do not advertise %s: %s", feature, caps.raw)
	}
	return h, c
}

func hasFeature(m msg, name string) bool {
	list, _ := m.Payload["features"].([]any)
	for _, f := range list {
		if f == name {
			return true
		}
	}
	return false
}

// The stdin field reaches the command byte for byte; a submit without it
// gives the command an empty stdin, as before the field existed.
func TestSubmitStdin(t *testing.T) {
	// The too-large case sends a 22 MB frame: decoding it keeps the
	// connection's read loop busy long enough under -race on a loaded
	// machine that a 20 s keepalive would drop the client first.
	h := startServer(t, t.TempDir(), hostExecutor(t), WithPingInterval(5*time.Minute))
	c := h.dial(tokenA)
	caps, _ := c.do(protocol.ActionCapabilities, nil)
	if !hasFeature(caps, protocol.FeatureStdin) || caps.num("max_stdin_bytes") != protocol.MaxStdinBytes {
		t.Fatalf("capabilities do not advertise stdin: %s", caps.raw)
	}

	in := make([]byte, 300<<10)
	rand.Read(in)
	in[0], in[len(in)-1] = 0, '\n'
	c.submit("in-1", "cat", map[string]any{"stdin": base64.StdEncoding.EncodeToString(in), "encoding": "base64"})
	res, streams := c.untilResult("in-1", nil)
	if got := joinStdout(t, streams); !bytes.Equal(got, in) || res.num("exit_code") != 0 {
		t.Fatalf("stdin echoed as %d bytes (want %d), result %s", len(got), len(in), res.raw)
	}

	// An argv command gets stdin too, and an empty stdin is EOF.
	c.submit("in-2", []string{"wc", "-c"}, map[string]any{"stdin": ""})
	if res, _ := c.untilResult("in-2", nil); strings.TrimSpace(res.str("stdout")) != "0" {
		t.Fatalf("empty stdin: %s", res.raw)
	}

	// Without the field the command reads EOF at once.
	c.submit("in-3", "cat; echo end", nil)
	if res, _ := c.untilResult("in-3", nil); res.str("stdout") != "end\n" {
		t.Fatalf("no stdin: %s", res.raw)
	}

	for name, v := range map[string]any{
		"not base64": "***",
		"unpadded":   "YQ",
		"not string": 12,
		"too large":  base64.StdEncoding.EncodeToString(make([]byte, protocol.MaxStdinBytes+1)),
	} {
		if r := c.submit("in-bad-"+strings.ReplaceAll(name, " ", "-"), "cat", map[string]any{"stdin": v}); r.Type != protocol.TypeError || r.str("code") != protocol.CodeInvalid {
			t.Fatalf("%s stdin: %s", name, r.raw)
		}
	}
}

// Through the relay, stdin rides on the run exec or, when larger than one
// piece, as a file sent in pieces beside the workspace.
func TestRelayStdin(t *testing.T) {
	rh := startRelay(t, relay.WithStdinPiece(4096))
	c := rh.dial(tokenA)
	rh.startWorker(t, "w1", workerToken, "2")
	rh.waitWorkers(t, 1)

	c.submit("rs-small", "cat", map[string]any{"stdin": base64.StdEncoding.EncodeToString([]byte("to the worker\n"))})
	if res, _ := c.untilResult("rs-small", nil); res.str("stdout") != "to the worker\n" {
		t.Fatalf("small stdin: %s", res.raw)
	}

	big := make([]byte, 50<<10)
	rand.Read(big)
	sum := sha256.Sum256(big)
	c.submit("rs-big", []string{"sha256sum"}, map[string]any{"stdin": base64.StdEncoding.EncodeToString(big)})
	res, _ := c.untilResult("rs-big", nil)
	if !strings.HasPrefix(res.str("stdout"), hex.EncodeToString(sum[:])) {
		t.Fatalf("big stdin: %s", res.raw)
	}
	// The stdin file is not part of the workspace, so no overlay.
	if res.Payload["artifact"] != false {
		t.Fatalf("stdin file leaked into the overlay: %s", res.raw)
	}

	c.submit("rs-none", "cat; echo end", nil)
	if res, _ := c.untilResult("rs-none", nil); res.str("stdout") != "end\n" {
		t.Fatalf("no stdin: %s", res.raw)
	}
}

// recordingExecutor runs requests with a real executor and keeps the
// limits each one carried, to show what reached the backend.
type recordingExecutor struct {
	Executor
	mu     sync.Mutex
	limits map[string]policy.ResourceLimits
}

func (r *recordingExecutor) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	r.mu.Lock()
	r.limits[req.ExecutionID] = req.Limits
	r.mu.Unlock()
	return r.Executor.Exec(ctx, req)
}

func (r *recordingExecutor) got(id string) policy.ResourceLimits {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.limits[id]
}

// Submitted limits are validated, clamped by the server's ceilings and
// passed to the backend; a submit without them gets the server's
// defaults, as before the field existed.
func TestSubmitLimits(t *testing.T) {
	rec := &recordingExecutor{Executor: hostExecutor(t), limits: map[string]policy.ResourceLimits{}}
	h := startServer(t, t.TempDir(), rec, WithMaxOutputBytes(1<<20),
		WithLimitCeiling(policy.ResourceLimits{MemoryBytes: 1 << 30, CPUs: 2, FileSizeBytes: 1 << 20}))
	c := h.dial(tokenA)
	caps, _ := c.do(protocol.ActionCapabilities, nil)
	if !hasFeature(caps, protocol.FeatureLimits) {
		t.Fatalf("capabilities do not advertise limits: %s", caps.raw)
	}
	if ml, _ := caps.Payload["max_limits"].(map[string]any); ml["memory_bytes"] != float64(1<<30) || ml["output_bytes"] != float64(1<<20) {
		t.Fatalf("max_limits: %s", caps.raw)
	}

	ack := c.submit("lim-1", "head -c 100 /dev/zero | tr '\\0' x", map[string]any{"limits": map[string]any{
		"output_bytes": 10, "memory_bytes": 4 << 30, "cpus": 0.5, "pids": 64,
	}, "timeout_s": 30})
	if ack.str("status") != protocol.StatusStarting {
		t.Fatalf("submit: %s", ack.raw)
	}
	shown, _ := ack.Payload["limits"].(map[string]any)
	if shown["memory_bytes"] != float64(1<<30) || shown["output_bytes"] != float64(10) || shown["cpus"] != 0.5 || shown["pids"] != float64(64) {
		t.Fatalf("ack limits: %s", ack.raw)
	}
	res, _ := c.untilResult("lim-1", nil)
	if res.str("stdout") != "xxxxxxxxxx" || res.Payload["truncated"] != true {
		t.Fatalf("output cap from limits: %s", res.raw)
	}
	want := policy.ResourceLimits{Timeout: 30 * time.Second, MemoryBytes: 1 << 30, CPUs: 0.5, Pids: 64, OutputBytes: 10, FileSizeBytes: 1 << 20}
	if got := rec.got("lim-1"); got != want {
		t.Fatalf("backend got %+v, want %+v", got, want)
	}

	// No limits field: the defaults and ceilings, and no limits in the ack.
	ack = c.submit("lim-2", "true", nil)
	if _, ok := ack.Payload["limits"]; ok {
		t.Fatalf("ack of a submit without limits: %s", ack.raw)
	}
	c.untilResult("lim-2", nil)
	want = policy.ResourceLimits{Timeout: policy.DefaultTimeout, MemoryBytes: 1 << 30, CPUs: 2, OutputBytes: 1 << 20, FileSizeBytes: 1 << 20}
	if got := rec.got("lim-2"); got != want {
		t.Fatalf("backend got %+v, want %+v", got, want)
	}

	// A file-size limit the host backend enforces stops a large write.
	if rec.Capabilities().Limits["file_size_bytes"] == policy.Strong {
		c.submit("lim-3", "head -c 100000 /dev/zero > big; echo rc=$?", map[string]any{"limits": map[string]any{"file_size_bytes": 4096}})
		if res, _ := c.untilResult("lim-3", nil); res.str("stdout") == "rc=0\n" {
			t.Fatalf("file size limit not applied: %s", res.raw)
		}
	}

	for name, v := range map[string]any{
		"timeout":  map[string]any{"timeout": 5},
		"negative": map[string]any{"memory_bytes": -1},
		"unknown":  map[string]any{"bogus": 1},
		"cpus":     map[string]any{"cpus": 5000},
		"string":   "1G",
	} {
		if r := c.submit("lim-bad-"+name, "true", map[string]any{"limits": v}); r.Type != protocol.TypeError || r.str("code") != protocol.CodeInvalid {
			t.Fatalf("%s limits: %s", name, r.raw)
		}
	}
}

// result_output "omit" leaves the output out of the result (it came as
// stream events) and still reports truncation; attach replays the events
// and the same result. Without the field the result repeats the output.
func TestResultOutputOmit(t *testing.T) {
	h, c := featureClient(t, protocol.FeatureResultOutput)
	cmd := "printf 'out'; printf 'err' >&2; head -c 100 /dev/zero | tr '\\0' x"
	c.submit("om-1", cmd, map[string]any{"result_output": "omit", "limits": map[string]any{"output_bytes": 50}})
	res, streams := c.untilResult("om-1", nil)
	if got := string(joinStdout(t, streams)); got != "out"+strings.Repeat("x", 47) {
		t.Fatalf("streamed stdout %q", got)
	}
	if res.str("stdout") != "" || res.str("stderr") != "" || res.Payload["output_omitted"] != true || res.Payload["truncated"] != true {
		t.Fatalf("omitted result: %s", res.raw)
	}
	c2 := h.dial(tokenA)
	r, replay := c2.do(protocol.ActionAttach, map[string]any{"execution_id": "om-1"})
	if r.str("status") != protocol.StatusCompleted {
		t.Fatalf("attach: %s", r.raw)
	}
	res2, more := c2.untilResult("om-1", replay)
	if len(more) != len(streams) || res2.str("stdout") != "" || res2.Payload["output_omitted"] != true {
		t.Fatalf("attach replayed %d events (want %d), result %s", len(more), len(streams), res2.raw)
	}

	for _, mode := range []any{nil, "full"} {
		extra := map[string]any{}
		if mode != nil {
			extra["result_output"] = mode
		}
		id := fmt.Sprintf("om-full-%v", mode != nil)
		c.submit(id, cmd, extra)
		res, _ := c.untilResult(id, nil)
		if res.str("stdout") != "out"+strings.Repeat("x", 100) || res.str("stderr") != "err" {
			t.Fatalf("result_output %v: %s", mode, res.raw)
		}
		if _, ok := res.Payload["output_omitted"]; ok {
			t.Fatalf("result_output %v: output_omitted present: %s", mode, res.raw)
		}
	}
	if r := c.submit("om-bad", "true", map[string]any{"result_output": "none"}); r.Type != protocol.TypeError || r.str("code") != protocol.CodeInvalid {
		t.Fatalf("bad result_output: %s", r.raw)
	}
}

// FuzzStreamFrame: the hand-built stream frame is JSON that decodes to
// the event it was built from, in either encoding.
func FuzzStreamFrame(f *testing.F) {
	f.Add([]byte("plain\n"), int64(1), false)
	f.Add([]byte("\x00\x1f\"\\\t\r\n\u2028\u2029<>&\xff\xe2\x80"), int64(7), false)
	f.Add([]byte{0xe2, 0x80, 0xa8, 0xe2}, int64(1<<40), true)
	f.Fuzz(func(t *testing.T, data []byte, seq int64, b64 bool) {
		enc := ""
		want := string(toText(data))
		if b64 {
			enc, want = "base64", base64.StdEncoding.EncodeToString(data)
		}
		fr := protocol.StreamFrame("exec-1", "stderr", toTextIf(!b64, data), seq, enc)
		var env struct {
			Type    string               `json:"type"`
			Payload protocol.StreamEvent `json:"payload"`
		}
		if err := json.Unmarshal(fr, &env); err != nil {
			t.Fatalf("frame %q: %v", fr, err)
		}
		p := env.Payload
		if env.Type != protocol.TypeStream || p.ExecutionID != "exec-1" || p.Stream != "stderr" || p.Seq != seq || p.Encoding != enc || p.Data != want {
			t.Fatalf("frame %q decodes to %+v", fr, env)
		}
	})
}

func toTextIf(cond bool, b []byte) []byte {
	if cond {
		return toText(b)
	}
	return b
}

// linkTargz is an upload of a file and the given symlinks (name, target).
func linkTargz(t *testing.T, links ...[2]string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "real.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5})
	tw.Write([]byte("real\n"))
	for _, l := range links {
		if err := tw.WriteHeader(&tar.Header{Name: l[0], Typeflag: tar.TypeSymlink, Linkname: l[1], Mode: 0o777}); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// Uploads may hold symlinks that stay inside the workspace; one that
// leads out fails the whole upload, as every symlink did before.
func TestUploadSymlinks(t *testing.T) {
	_, c := featureClient(t, protocol.FeatureSymlinks)
	up, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": "ln-1", "data": linkTargz(t, [2]string{"link", "real.txt"}, [2]string{"d/up", "../real.txt"})})
	if up.str("status") != protocol.StatusUploaded {
		t.Fatalf("upload: %s", up.raw)
	}
	c.submit("ln-1", "cat link d/up; readlink d/up", nil)
	if res, _ := c.untilResult("ln-1", nil); res.str("stdout") != "real\nreal\n../real.txt\n" || res.Payload["artifact"] != false {
		t.Fatalf("result: %s", res.raw)
	}
	for i, bad := range [][][2]string{
		{{"out", "../x"}},
		{{"abs", "/etc/passwd"}},
		{{"a/b", ".."}, {"c", "a/b/../x"}},
	} {
		id := fmt.Sprintf("ln-bad-%d", i)
		if r, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": id, "data": linkTargz(t, bad...)}); r.Type != protocol.TypeError || r.str("code") != protocol.CodeUpload {
			t.Fatalf("upload of %v: %s", bad, r.raw)
		}
	}
}

// A submission may carry its workspace (feature workspace): the command
// sees it as if uploaded first. An archive upload_artifact would refuse
// refuses the submission, and nothing runs; a workspace for an id that
// has one already (uploaded, or an earlier submission's) is refused too,
// as DUPLICATE when the id was submitted.
func TestSubmitWorkspace(t *testing.T) {
	h, c := featureClient(t, protocol.FeatureWorkspace)
	ws := targz(t, file{"in.txt", "inline\n"}, file{"sub/k", "k"})
	if ack := c.submit("wsi-1", "cat in.txt sub/k; echo new > out.txt", map[string]any{"workspace": ws}); ack.str("status") != protocol.StatusStarting {
		t.Fatalf("submit: %s", ack.raw)
	}
	if res, _ := c.untilResult("wsi-1", nil); res.str("stdout") != "inline\nk" || res.num("exit_code") != 0 || res.Payload["artifact"] != true {
		t.Fatalf("result: %s", res.raw)
	}
	if dl, _ := c.do(protocol.ActionDownload, map[string]any{"execution_id": "wsi-1"}); untar(t, dl.str("data"))["out.txt"] != "new\n" {
		t.Fatalf("download: %s", dl.raw)
	}

	// Refused: the id was submitted, the archive is unsafe or corrupt, or
	// an upload made the workspace already. None of them runs.
	if r, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": "wsi-up", "data": ws}); r.str("status") != protocol.StatusUploaded {
		t.Fatalf("upload: %s", r.raw)
	}
	for _, tc := range []struct {
		id, data, code string
	}{
		{"wsi-1", ws, protocol.CodeDuplicate},
		{"wsi-bad", linkTargz(t, [2]string{"out", "../x"}), protocol.CodeUpload},
		{"wsi-corrupt", base64.StdEncoding.EncodeToString([]byte("not a gzip stream")), protocol.CodeUpload},
		{"wsi-up", ws, protocol.CodeUpload},
	} {
		r := c.submit(tc.id, "echo ran > ran.txt", map[string]any{"workspace": tc.data})
		if r.Type != protocol.TypeError || r.str("code") != tc.code {
			t.Fatalf("submit %s: %s, want %s", tc.id, r.raw, tc.code)
		}
		if tc.id == "wsi-bad" || tc.id == "wsi-corrupt" {
			if left, _ := filepath.Glob(filepath.Join(h.root, "*", tc.id)); len(left) > 0 {
				t.Errorf("%s: a refused workspace was left behind: %v", tc.id, left)
			}
		}
	}
	if st, _ := c.do(protocol.ActionStatus, map[string]any{"execution_id": "wsi-bad"}); st.str("status") != protocol.StatusNotFound {
		t.Fatalf("a refused submission has a record: %s", st.raw)
	}
}

// A client that asks on its upgrade gets the capabilities answer in
// protocol.HeaderCapabilities, the same as the action's; one that does
// not ask (the Python client) gets no such header: its wire is as before.
func TestCapabilitiesHeaderOnlyWhenAsked(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	dial := func(ask bool) *http.Response {
		t.Helper()
		hdr := http.Header{"Authorization": {"Bearer " + tokenA}}
		if ask {
			hdr.Set(protocol.HeaderCapabilities, protocol.CapabilitiesAsk)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ws, resp, err := websocket.Dial(ctx, h.url, &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			t.Fatal(err)
		}
		ws.CloseNow()
		return resp
	}
	if v := dial(false).Header.Values(protocol.HeaderCapabilities); len(v) != 0 {
		t.Errorf("unasked upgrade answered with %s: %q", protocol.HeaderCapabilities, v)
	}
	r, err := protocol.ParseCapabilitiesHeader(dial(true).Header.Get(protocol.HeaderCapabilities))
	if err != nil {
		t.Fatal(err)
	}
	c := h.dial(tokenA)
	asked, _ := c.do(protocol.ActionCapabilities, nil)
	delete(asked.Payload, "request_id")
	var fromHeader map[string]any
	b, _ := base64.StdEncoding.DecodeString(dial(true).Header.Get(protocol.HeaderCapabilities))
	if err := json.Unmarshal(b, &fromHeader); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromHeader, asked.Payload) {
		t.Errorf("header answers\n%v\nthe action\n%v", fromHeader, asked.Payload)
	}
	if r.Executor != "local:host" || r.Capabilities.Isolation == "" {
		t.Errorf("decoded header %+v", r)
	}
}
