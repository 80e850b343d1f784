package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/protocol"
)

func TestHealthAuthAndMetrics(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	for path, want := range map[string]string{"/healthz": `{"status":"ok"}`, "/readyz": `{"status":"ok"}`} {
		resp, err := http.Get(h.http.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != want {
			t.Fatalf("%s = %d %s", path, resp.StatusCode, body)
		}
	}
	for _, token := range []string{"", "wrong", tokenA + "x"} {
		if _, err := dialToken(h.url, token); err == nil || !strings.Contains(err.Error(), "401") {
			t.Fatalf("token %q: err = %v, want 401", token, err)
		}
	}
	resp, err := http.Get(h.http.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no header: %d", resp.StatusCode)
	}
	c := h.dial(tokenA)
	r := c.submit("m1", "true", nil)
	if r.str("status") != protocol.StatusStarting {
		t.Fatalf("submit: %s", r.raw)
	}
	c.untilResult("m1", nil)
	resp, err = http.Get(h.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`pulse_server_executions_total{status="COMPLETED"} 1`,
		`pulse_server_unauthorized_total 4`,
		`pulse_server_execution_duration_seconds_count 1`,
		`pulse_server_requests_total{action="submit"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}

	// Draining: not ready, new connections refused.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err = http.Get(h.http.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz after shutdown = %d", resp.StatusCode)
	}
}

func TestSubmitStreamsResultAndOverlay(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	r, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": "job-1",
		"data": targz(t, file{"in.txt", "hello from upload\n"}, file{"gone.txt", "bye"}, file{"sub/keep", "k"})})
	if r.Type != protocol.TypeResponse || r.str("status") != protocol.StatusUploaded {
		t.Fatalf("upload: %s", r.raw)
	}
	rid := c.send(protocol.ActionSubmit, map[string]any{
		"execution_id": "job-1", "correlation_id": "corr-9", "cwd": "sub", "env": map[string]any{"GREETING": "hi"},
		"command": `cat ../in.txt; echo "$GREETING from $(basename "$PWD")" >&2; echo made > ../out.txt; rm ../gone.txt; exit 3`,
	})
	ack, early := c.reply(rid)
	if ack.Type != protocol.TypeResponse || ack.str("status") != protocol.StatusStarting || ack.str("execution_id") != "job-1" {
		t.Fatalf("ack: %s", ack.raw)
	}
	res, streams := c.untilResult("job-1", early)
	var stdout, stderr string
	for i, s := range streams {
		if s.num("seq") != int64(i+1) {
			t.Fatalf("stream %d has seq %d: %s", i, s.num("seq"), s.raw)
		}
		switch s.str("stream") {
		case "stdout":
			stdout += s.str("data")
		case "stderr":
			stderr += s.str("data")
		}
	}
	if stdout != "hello from upload\n" || stderr != "hi from sub\n" {
		t.Fatalf("streams: stdout %q stderr %q", stdout, stderr)
	}
	if res.num("exit_code") != 3 || res.str("stdout") != stdout || res.str("stderr") != stderr ||
		res.str("termination_reason") != "exited" || res.Payload["timed_out"] != false || res.Payload["artifact"] != true ||
		res.str("command") == "" || res.num("last_seq") != int64(len(streams)) {
		t.Fatalf("result: %s", res.raw)
	}
	for _, k := range []string{"duration_ms", "truncated", "pid", "metrics"} {
		if _, ok := res.Payload[k]; !ok {
			t.Fatalf("result lacks %s: %s", k, res.raw)
		}
	}

	st, _ := c.do(protocol.ActionStatus, map[string]any{"execution_id": "job-1"})
	if st.str("status") != protocol.StatusCompleted || st.str("correlation_id") != "corr-9" {
		t.Fatalf("status: %s", st.raw)
	}
	dl, _ := c.do(protocol.ActionDownload, map[string]any{"execution_id": "job-1"})
	if dl.str("status") != protocol.StatusDownloaded {
		t.Fatalf("download: %s", dl.raw)
	}
	files := untar(t, dl.str("data"))
	if files["out.txt"] != "made\n" {
		t.Fatalf("overlay files: %v", files)
	}
	if _, changed := files["in.txt"]; changed {
		t.Fatalf("unchanged file in overlay: %v", files)
	}
	var man protocol.Manifest
	if err := json.Unmarshal([]byte(files[protocol.ManifestName]), &man); err != nil || len(man.Deleted) != 1 || man.Deleted[0] != "gone.txt" {
		t.Fatalf("manifest %q: %v", files[protocol.ManifestName], err)
	}
	// A second download still works: a dropped connection must not lose
	// the overlay.
	if dl2, _ := c.do(protocol.ActionDownload, map[string]any{"execution_id": "job-1"}); dl2.str("data") != dl.str("data") {
		t.Fatalf("second download differs: %s", dl2.raw)
	}

	// An execution that wrote nothing has no artifact.
	c.submit("job-2", []string{"echo", "argv", "form"}, nil)
	res2, streams2 := c.untilResult("job-2", nil)
	if res2.str("stdout") != "argv form\n" || len(streams2) == 0 || streams2[0].num("seq") != 1 {
		t.Fatalf("argv result: %s", res2.raw)
	}
	if dl, _ := c.do(protocol.ActionDownload, map[string]any{"execution_id": "job-2"}); dl.str("status") != protocol.StatusNoArtifact {
		t.Fatalf("download: %s", dl.raw)
	}
	// Resubmitting an id is refused.
	if r := c.submit("job-2", "true", nil); r.Type != protocol.TypeError || r.str("code") != protocol.CodeDuplicate {
		t.Fatalf("duplicate: %s", r.raw)
	}
	if r, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": "job-2", "data": targz(t, file{"x", "y"})}); r.Type != protocol.TypeError || r.str("message") != protocol.MsgUpload {
		t.Fatalf("upload after submit: %s", r.raw)
	}
}

// status of a running execution answers RUNNING; the Python server sent no
// reply at all.
func TestStatusOfRunningExecutionReplies(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	c.submit("slow", "echo started; sleep 30", nil)
	for {
		if m := c.recv(); m.Type == protocol.TypeStream {
			break
		}
	}
	st, _ := c.do(protocol.ActionStatus, map[string]any{"execution_id": "slow"})
	if st.Type != protocol.TypeResponse || st.str("status") != protocol.StatusRunning || st.num("last_seq") != 1 {
		t.Fatalf("status: %s", st.raw)
	}
	if st, _ := c.do(protocol.ActionStatus, map[string]any{"execution_id": "nope"}); st.str("status") != protocol.StatusNotFound {
		t.Fatalf("status of unknown: %s", st.raw)
	}
	cancel, other := c.do(protocol.ActionCancel, map[string]any{"execution_id": "slow"})
	if cancel.Type != protocol.TypeResponse || cancel.str("status") != protocol.StatusCancelled {
		t.Fatalf("cancel: %s", cancel.raw)
	}
	res, _ := c.untilResult("slow", other)
	if res.str("error") != protocol.StatusCancelled || res.str("termination_reason") != "cancelled" {
		t.Fatalf("result of cancelled: %s", res.raw)
	}
	st, _ = c.do(protocol.ActionStatus, map[string]any{"execution_id": "slow"})
	if st.str("status") != protocol.StatusFailed {
		t.Fatalf("status after cancel: %s", st.raw)
	}
	if r, _ := c.do(protocol.ActionCancel, map[string]any{"execution_id": "slow"}); r.Type != protocol.TypeError || r.str("code") != protocol.CodeNotRunning {
		t.Fatalf("second cancel: %s", r.raw)
	}
}

func TestTimeoutAndBinaryEncoding(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	c.submit("bin", `printf '\377\000\342\202'; sleep 0.1; printf '\254'`, map[string]any{"encoding": "base64"})
	res, streams := c.untilResult("bin", nil)
	var got []byte
	for _, s := range streams {
		if s.str("encoding") != "base64" {
			t.Fatalf("stream without encoding: %s", s.raw)
		}
		b, err := base64.StdEncoding.DecodeString(s.str("data"))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
	}
	if string(got) != "\xff\x00\xe2\x82\xac" || res.str("encoding") != "base64" || res.str("stdout") != base64.StdEncoding.EncodeToString(got) {
		t.Fatalf("bytes = %q, result %s", got, res.raw)
	}

	// Text mode: the euro sign split across two writes stays whole; the
	// invalid byte becomes U+FFFD as in Python's errors="replace".
	c.submit("txt", `printf '\377\342\202'; sleep 0.1; printf '\254'`, nil)
	res, streams = c.untilResult("txt", nil)
	var text string
	for _, s := range streams {
		text += s.str("data")
	}
	if text != "\uFFFD€" || res.str("stdout") != "\uFFFD€" {
		t.Fatalf("text = %q, result %s", text, res.raw)
	}

	c.submit("late", "sleep 30", map[string]any{"timeout_s": 0.3})
	res, _ = c.untilResult("late", nil)
	if res.Payload["timed_out"] != true || res.str("termination_reason") != "timeout" {
		t.Fatalf("timeout result: %s", res.raw)
	}
	if st, _ := c.do(protocol.ActionStatus, map[string]any{"execution_id": "late"}); st.str("status") != protocol.StatusCompleted {
		t.Fatalf("timed-out status: %s", st.raw)
	}
}

// Every action on another tenant's execution answers as if it did not
// exist, and never touches it.
func TestTenantIsolation(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t), WithUploadGrace(0))
	a := h.dial(tokenA)
	b := h.dial(tokenB)
	if r, _ := a.do(protocol.ActionUpload, map[string]any{"execution_id": "a-pending", "data": targz(t, file{"f", "a"})}); r.str("status") != protocol.StatusUploaded {
		t.Fatalf("upload: %s", r.raw)
	}
	a.submit("a-run", "echo secret-a; sleep 30", nil)
	for {
		if m := a.recv(); m.Type == protocol.TypeStream {
			break
		}
	}
	a.submit("a-done", "echo done > result.txt", nil)
	a.untilResult("a-done", nil)

	for _, id := range []string{"a-run", "a-done"} {
		if r, _ := b.do(protocol.ActionStatus, map[string]any{"execution_id": id}); r.str("status") != protocol.StatusNotFound {
			t.Fatalf("status %s: %s", id, r.raw)
		}
		if r, _ := b.do(protocol.ActionAttach, map[string]any{"execution_id": id}); r.Type != protocol.TypeError || r.str("message") != protocol.MsgNotFound {
			t.Fatalf("attach %s: %s", id, r.raw)
		}
		rid := b.send(protocol.ActionCancel, map[string]any{"execution_id": id})
		if r, _ := b.reply(rid); r.Type != protocol.TypeError || r.str("message") != protocol.MsgUnauthorized || r.str("request_id") != rid {
			t.Fatalf("cancel %s: %s", id, r.raw)
		}
		if r, _ := b.do(protocol.ActionDownload, map[string]any{"execution_id": id}); r.Type != protocol.TypeError || r.str("message") != protocol.MsgNotFound {
			t.Fatalf("download %s: %s", id, r.raw)
		}
		if r := b.submit(id, "true", nil); r.Type != protocol.TypeError || r.str("code") != protocol.CodeDuplicate {
			t.Fatalf("submit %s: %s", id, r.raw)
		}
		if r, _ := b.do(protocol.ActionUpload, map[string]any{"execution_id": id, "data": targz(t, file{"f", "b"})}); r.Type != protocol.TypeError {
			t.Fatalf("upload %s: %s", id, r.raw)
		}
	}
	if r, _ := b.do(protocol.ActionReconcile, nil); r.str("status") != protocol.StatusReconciled || r.num("orphans_cleaned") != 0 {
		t.Fatalf("reconcile b: %s", r.raw)
	}
	for _, id := range []string{"a-pending", "a-run", "a-done"} {
		if _, err := os.Stat(filepath.Join(h.root, TenantOf(tokenA), id)); err != nil {
			t.Fatalf("tenant b's actions touched %s: %v", id, err)
		}
	}
	// The running execution is unharmed: tenant a still cancels it.
	if r, _ := a.do(protocol.ActionCancel, map[string]any{"execution_id": "a-run"}); r.str("status") != protocol.StatusCancelled {
		t.Fatalf("a cancel: %s", r.raw)
	}
}

func TestUploadRefusesUnsafeArchives(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t), WithArtifactLimits(protocol.ArchiveLimits{MaxUnpacked: 1 << 20}))
	c := h.dial(tokenA)
	bomb := targz(t, file{"zeros", strings.Repeat("\x00", 2<<20)})
	for name, data := range map[string]string{
		"zip-slip":   targz(t, file{"../../evil", "x"}),
		"absolute":   targz(t, file{"/tmp/evil-abs", "x"}),
		"bomb":       bomb,
		"not base64": "***",
		"empty":      "",
	} {
		rid := c.send(protocol.ActionUpload, map[string]any{"execution_id": "u-" + strings.ReplaceAll(name, " ", "-"), "data": data})
		r, _ := c.reply(rid)
		if r.Type != protocol.TypeError || r.str("message") != protocol.MsgUpload {
			t.Fatalf("%s: %s", name, r.raw)
		}
	}
	if _, err := os.Stat(filepath.Join(h.root, "evil")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("zip-slip escaped: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(h.root, TenantOf(tokenA)))
	if len(entries) != 0 {
		t.Fatalf("refused uploads left workspaces: %v", entries)
	}
}

// Reconcile removes workspaces of ended executions and stale uploads, but
// keeps an upload still waiting for its submit (the Python server deleted
// it).
func TestReconcileKeepsPendingUploads(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	for _, id := range []string{"fresh", "stale"} {
		if r, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": id, "data": targz(t, file{"f", id})}); r.str("status") != protocol.StatusUploaded {
			t.Fatalf("upload: %s", r.raw)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(filepath.Join(h.root, TenantOf(tokenA), "stale"), old, old); err != nil {
		t.Fatal(err)
	}
	c.submit("ended", "true", nil)
	c.untilResult("ended", nil)
	c.submit("running", "sleep 30", nil)
	r, _ := c.do(protocol.ActionReconcile, nil)
	if r.str("status") != protocol.StatusReconciled || r.num("orphans_cleaned") != 2 {
		t.Fatalf("reconcile: %s", r.raw)
	}
	for id, want := range map[string]bool{"fresh": true, "stale": false, "ended": false, "running": true} {
		_, err := os.Stat(filepath.Join(h.root, TenantOf(tokenA), id))
		if (err == nil) != want {
			t.Fatalf("%s exists = %v, want %v", id, err == nil, want)
		}
	}
	// The pending upload is still usable.
	c.submit("fresh", "cat f", nil)
	if res, _ := c.untilResult("fresh", nil); res.str("stdout") != "fresh" {
		t.Fatalf("pending upload lost: %s", res.raw)
	}
	c.do(protocol.ActionCancel, map[string]any{"execution_id": "running"})
}

func TestInvalidMessagesAreAnswered(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	for _, raw := range []string{`not json`, `[1,2]`, `{"payload":{}}`, `{"action":"status","payload":"x"}`, `null`} {
		c.sendRaw([]byte(raw))
		m := c.recv()
		if m.Type != protocol.TypeError || m.str("message") != protocol.MsgInvalid || m.Payload["request_id"] != nil {
			t.Fatalf("%s -> %s", raw, m.raw)
		}
	}
	cases := []struct {
		action  string
		payload map[string]any
		message string
	}{
		{"explode", nil, protocol.MsgUnknown},
		{protocol.ActionStatus, map[string]any{"execution_id": "../etc"}, protocol.MsgInvalid},
		{protocol.ActionCancel, map[string]any{}, protocol.MsgInvalid},
		{protocol.ActionSubmit, map[string]any{"execution_id": "x1"}, protocol.MsgInvalid},
		{protocol.ActionSubmit, map[string]any{"execution_id": "x2", "command": ""}, protocol.MsgInvalid},
		{protocol.ActionSubmit, map[string]any{"execution_id": "x3", "command": "true", "cwd": "../.."}, protocol.MsgInvalid},
		{protocol.ActionSubmit, map[string]any{"execution_id": "x4", "command": "true", "timeout_s": -1}, protocol.MsgInvalid},
		{protocol.ActionSubmit, map[string]any{"execution_id": "x5", "command": "true", "env": map[string]any{"A=B": "c"}}, protocol.MsgInvalid},
		{protocol.ActionSubmit, map[string]any{"execution_id": "x6", "command": "true", "network": map[string]any{"mode": "deny-all"}}, "executor local:host cannot enforce network \"deny-all\" with secrets \"deny-all\""},
		{protocol.ActionAttach, map[string]any{"execution_id": "x7", "after_seq": -2}, protocol.MsgInvalid},
	}
	for _, tc := range cases {
		rid := c.send(tc.action, tc.payload)
		m, _ := c.reply(rid)
		if m.Type != protocol.TypeError || m.str("message") != tc.message {
			t.Fatalf("%s %v -> %s", tc.action, tc.payload, m.raw)
		}
	}
	// An invalid request_id is not echoed.
	c.send(protocol.ActionStatus, map[string]any{"execution_id": "zz", "request_id": "bad id!"})
	if m := c.recv(); m.Payload["request_id"] != nil || m.str("status") != protocol.StatusNotFound {
		t.Fatalf("bad request id: %s", m.raw)
	}
	// Nothing invalid reached the store.
	counts, _ := h.st.CountByStatus(context.Background())
	if len(counts) != 0 {
		t.Fatalf("store has %v", counts)
	}
	r, _ := c.do(protocol.ActionCapabilities, nil)
	caps, _ := r.Payload["capabilities"].(map[string]any)
	if r.str("status") != protocol.StatusCapabilities || r.str("executor") != "local:host" || caps["isolation"] != "host_unsafe" || caps["captures_writes"] != true {
		t.Fatalf("capabilities: %s", r.raw)
	}
}

// A dropped client reattaches with after_seq and receives every event
// exactly once.
func TestReattachIsExactlyOnce(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	const lines = 60
	c := h.dial(tokenA)
	c.submit("chatty", fmt.Sprintf(`for i in $(seq 1 %d); do echo line$i; [ $((i %% 2)) = 0 ] && echo err$i >&2; sleep 0.01; done`, lines), nil)
	var got []msg
	for len(got) < 5 {
		if m := c.recv(); m.Type == protocol.TypeStream {
			got = append(got, m)
		}
	}
	c.ws.CloseNow()

	var res msg
	// How soon the server sees the old connection drop depends on the
	// machine's load (2 s of retries was not always enough under -race).
	for deadline := time.Now().Add(time.Minute); ; {
		c2 := h.dial(tokenA)
		rid := c2.send(protocol.ActionAttach, map[string]any{"execution_id": "chatty", "after_seq": got[len(got)-1].num("seq")})
		r, replayed := c2.reply(rid)
		if r.Type == protocol.TypeError && r.str("code") == protocol.CodeAttached && time.Now().Before(deadline) {
			// The server has not seen the old connection drop yet.
			c2.ws.CloseNow()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if r.Type != protocol.TypeResponse || (r.str("status") != protocol.StatusAttached && r.str("status") != protocol.StatusCompleted) {
			t.Fatalf("attach: %s", r.raw)
		}
		var streams []msg
		res, streams = c2.untilResult("chatty", replayed)
		got = append(got, streams...)
		break
	}
	var out, errOut strings.Builder
	for i, m := range got {
		if m.num("seq") != int64(i+1) {
			t.Fatalf("event %d has seq %d (duplicate or gap)", i, m.num("seq"))
		}
		if m.str("stream") == "stdout" {
			out.WriteString(m.str("data"))
		} else {
			errOut.WriteString(m.str("data"))
		}
	}
	var want, wantErr strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line%d\n", i)
		if i%2 == 0 {
			fmt.Fprintf(&wantErr, "err%d\n", i)
		}
	}
	if out.String() != want.String() || errOut.String() != wantErr.String() {
		t.Fatalf("stdout %q\nstderr %q", out.String(), errOut.String())
	}
	if res.num("last_seq") != int64(len(got)) {
		t.Fatalf("last_seq %d, events %d", res.num("last_seq"), len(got))
	}
	// After the end, a late attach replays the history from the store.
	c3 := h.dial(tokenA)
	r, replayed := c3.do(protocol.ActionAttach, map[string]any{"execution_id": "chatty", "after_seq": 10})
	if r.str("status") != protocol.StatusCompleted || int64(len(replayed)) != res.num("last_seq")-10 || replayed[0].num("seq") != 11 {
		t.Fatalf("late attach: %s with %d events", r.raw, len(replayed))
	}
	if m := c3.recv(); m.Type != protocol.TypeResult || m.num("exit_code") != 0 {
		t.Fatalf("late attach result: %s", m.raw)
	}
}

// A second client cannot attach while another is attached.
func TestSecondAttachRefused(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	c.submit("one", "echo x; sleep 30", nil)
	other := h.dial(tokenA)
	if r, _ := other.do(protocol.ActionAttach, map[string]any{"execution_id": "one"}); r.Type != protocol.TypeError || r.str("message") != protocol.MsgAttached {
		t.Fatalf("second attach: %s", r.raw)
	}
	c.do(protocol.ActionCancel, map[string]any{"execution_id": "one"})
}

// After a clean restart the history and result of finished executions are
// still there.
func TestHistorySurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	exec := hostExecutor(t)
	h := startServer(t, dir, exec)
	c := h.dial(tokenA)
	c.submit("keep", "echo one; echo two >&2", nil)
	res, _ := c.untilResult("keep", nil)
	h.stop()

	h2 := startServer(t, dir, exec)
	c2 := h2.dial(tokenA)
	r, replayed := c2.do(protocol.ActionAttach, map[string]any{"execution_id": "keep"})
	if r.str("status") != protocol.StatusCompleted || len(replayed) != 2 {
		t.Fatalf("attach after restart: %s, %d events", r.raw, len(replayed))
	}
	got := c2.recv()
	if got.Type != protocol.TypeResult || got.str("stdout") != res.str("stdout") || got.str("stderr") != "two\n" {
		t.Fatalf("result after restart: %s", got.raw)
	}
}

func TestRetentionCleanup(t *testing.T) {
	dir := t.TempDir()
	h := startServer(t, dir, hostExecutor(t))
	c := h.dial(tokenA)
	c.submit("old", "echo data > f", nil)
	c.untilResult("old", nil)
	ws := filepath.Join(h.root, TenantOf(tokenA), "old")
	if _, err := os.Stat(h.srv.overlayFile(TenantOf(tokenA), "old")); err != nil {
		t.Fatalf("overlay not saved: %v", err)
	}
	if r, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": "abandoned", "data": targz(t, file{"f", "x"})}); r.str("status") != protocol.StatusUploaded {
		t.Fatalf("upload: %s", r.raw)
	}
	if r, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": "fresh-upload", "data": targz(t, file{"f", "x"})}); r.str("status") != protocol.StatusUploaded {
		t.Fatalf("upload: %s", r.raw)
	}
	past := time.Now().Add(-h.srv.o.retention - time.Hour)
	os.Chtimes(filepath.Join(h.root, TenantOf(tokenA), "abandoned"), past, past)
	h.srv.cleanupOnce(context.Background())
	if _, err := os.Stat(filepath.Join(h.root, TenantOf(tokenA), "abandoned")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("abandoned upload kept: %v", err)
	}
	for _, id := range []string{"fresh-upload", "old"} {
		if _, err := os.Stat(filepath.Join(h.root, TenantOf(tokenA), id)); err != nil {
			t.Fatalf("%s removed before its time: %v", id, err)
		}
	}
	h.srv.o.now = func() time.Time { return time.Now().Add(h.srv.o.retention + time.Minute) }
	h.srv.cleanupOnce(context.Background())
	if _, err := os.Stat(ws); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("workspace kept: %v", err)
	}
	if _, err := os.Stat(h.srv.overlayFile(TenantOf(tokenA), "old")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("overlay kept: %v", err)
	}
	if st, _ := c.do(protocol.ActionStatus, map[string]any{"execution_id": "old"}); st.str("status") != protocol.StatusNotFound {
		t.Fatalf("record kept: %s", st.raw)
	}
}

func TestNewValidatesConfiguration(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	exec := hostExecutor(t)
	root := WithWorkspaceRoot(t.TempDir())
	strong := "Zx8#kQ2vLp9@mW4nRt7$yB3cHs6&dF1gJ5"
	cases := []struct {
		name string
		opts []Option
		ok   bool
	}{
		{"no token", []Option{root}, false},
		{"no root", []Option{WithTokens("t")}, false},
		{"weak production token", []Option{root, WithTokens("short"), WithProduction(true)}, false},
		{"placeholder production token", []Option{root, WithTokens("changeme-changeme-changeme-changeme-1"), WithProduction(true)}, false},
		{"strong production token", []Option{root, WithTokens(strong), WithProduction(true)}, true},
		{"concurrency 0", []Option{root, WithTokens("t"), WithMaxConcurrent(0)}, false},
		{"concurrency 129", []Option{root, WithTokens("t"), WithMaxConcurrent(129)}, false},
		{"retention 0", []Option{root, WithTokens("t"), WithRetention(0)}, false},
		{"development", []Option{root, WithTokens("t")}, true},
	}
	for _, tc := range cases {
		s, err := New(context.Background(), exec, st, tc.opts...)
		if (err == nil) != tc.ok {
			t.Fatalf("%s: err = %v", tc.name, err)
		}
		if s != nil {
			s.Shutdown(context.Background())
		}
	}
}

// Shutdown lets a quick execution finish, cancels one that outlives the
// drain period, records both and delivers their results before closing.
func TestShutdownDrainsThenCancels(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	c.submit("quick", "sleep 0.2; echo done", nil)
	c.submit("stuck", "echo up; sleep 30", nil)
	// The drain period ends when the test ends it, once the quick
	// execution's result has arrived while draining: a fixed period would
	// bet on how soon a loaded machine finishes `sleep 0.2` (it did not
	// within a second under -race on a busy 2-core machine).
	ctx, endDrain := context.WithCancel(context.Background())
	defer endDrain()
	shut := make(chan error, 1)
	go func() { shut <- h.srv.Shutdown(ctx) }()
	results := map[string]msg{}
	drained := false
	for len(results) < 2 {
		m, err := c.tryRecv(time.Minute)
		if err != nil {
			t.Fatalf("connection ended before both results: %v (have %v)", err, results)
		}
		if m.Type != protocol.TypeResult {
			continue
		}
		id := m.str("execution_id")
		results[id] = m
		switch {
		case id == "quick":
			select {
			case err := <-shut:
				t.Fatalf("Shutdown returned %v while stuck still ran", err)
			default:
			}
			drained = true
			endDrain()
		case id == "stuck" && !drained:
			t.Fatalf("stuck ended before the drain period did: %s", m.raw)
		}
	}
	if err := testenv.Recv(t, shut, time.Minute, "Shutdown's return"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown = %v, want the end of the drain period", err)
	}
	if r := results["quick"]; r.str("stdout") != "done\n" || r.str("error") != "" {
		t.Fatalf("quick: %s", r.raw)
	}
	if r := results["stuck"]; r.str("error") != "SHUTDOWN" || r.str("termination_reason") != "cancelled" {
		t.Fatalf("stuck: %s", r.raw)
	}
	for id, want := range map[string]string{"quick": store.StatusCompleted, "stuck": store.StatusFailed} {
		rec, err := h.st.Get(context.Background(), id, TenantOf(tokenA))
		if err != nil || rec.Status != want {
			t.Fatalf("%s: %+v, %v; want %s", id, rec, err, want)
		}
	}
	if _, err := c.tryRecv(5 * time.Second); err == nil {
		t.Fatal("connection still open after shutdown")
	}
}

func TestOversizedMessageClosesConnection(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t), WithMaxMessageBytes(2048))
	c := h.dial(tokenA)
	big := fmt.Sprintf(`{"action":"status","payload":{"execution_id":"x","pad":%q}}`, strings.Repeat("p", 4096))
	c.sendRaw([]byte(big))
	_, err := c.tryRecv(10 * time.Second)
	if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("err = %v, want close status 1009", err)
	}
	// The server keeps serving others.
	if r, _ := h.dial(tokenA).do(protocol.ActionStatus, map[string]any{"execution_id": "x"}); r.str("status") != protocol.StatusNotFound {
		t.Fatalf("after oversized message: %s", r.raw)
	}
}

// A reconcile does not hold back the requests after it on its connection:
// a submit sent while the reconcile waits on an orphan's lock starts and
// ends, and the reconcile's answer comes once it can.
func TestReconcileRunsBesideTheNextRequest(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	c.submit("orphan", "true", nil)
	c.untilResult("orphan", nil)
	// The result is sent a moment before the execution leaves the active
	// set, and a reconcile leaves an active execution's workspace alone.
	testenv.Eventually(t, 30*time.Second, func() error {
		if h.srv.lookup("orphan", TenantOf(tokenA)) != nil {
			return errors.New("the execution is still active after its result")
		}
		return nil
	})
	release := holdIDLock(t, h.srv, "orphan")
	// The locks are striped by id: the next execution's must be another.
	next := ""
	for i := 0; next == ""; i++ {
		if id := fmt.Sprintf("next-%d", i); h.srv.idLock(id) != h.srv.idLock("orphan") {
			next = id
		}
	}
	rid := c.send(protocol.ActionReconcile, nil)
	if r := c.submit(next, "true", nil); r.str("status") != protocol.StatusStarting {
		t.Fatalf("submit after a reconcile that waits: %s", r.raw)
	}
	res, seen := c.untilResult(next, nil)
	if res.num("exit_code") != 0 {
		t.Fatalf("result: %s", res.raw)
	}
	for _, m := range seen {
		if m.Payload["request_id"] == rid {
			t.Fatalf("reconcile answered while it could not have run: %s", m.raw)
		}
	}
	release()
	r, _ := c.reply(rid)
	if r.str("status") != protocol.StatusReconciled || r.num("orphans_cleaned") != 1 {
		t.Fatalf("reconcile: %s", r.raw)
	}
	if _, err := os.Stat(filepath.Join(h.root, TenantOf(tokenA), "orphan")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("orphan workspace after reconcile: %v", err)
	}
}

// A reconcile goes on after its client hangs up (a CLI process ends once
// its command has, often before the removals have): the orphan whose lock
// it waits on while the connection closes is still removed.
func TestReconcileOutlivesItsConnection(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	c.submit("orphan", "true", nil)
	c.untilResult("orphan", nil)
	release := holdIDLock(t, h.srv, "orphan")
	c.send(protocol.ActionReconcile, nil)
	// Requests are read in order: once this one is answered the
	// reconcile has been taken up, and waits on the orphan's lock.
	c.do(protocol.ActionCapabilities, nil)
	h.srv.mu.Lock()
	var sc *conn
	for k := range h.srv.conns {
		sc = k
	}
	h.srv.mu.Unlock()
	if sc == nil {
		t.Fatal("no server connection")
	}
	c.ws.CloseNow()
	<-sc.ctx.Done()
	release()
	ws := filepath.Join(h.root, TenantOf(tokenA), "orphan")
	testenv.Eventually(t, 30*time.Second, func() error {
		if _, err := os.Stat(ws); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("the orphan's workspace is still there after its reconcile's connection closed (%v)", err)
		}
		return nil
	})
}

// holdIDLock takes the server's lock of id, holding a request that needs
// it where it is, until release is called or the test ends.
func holdIDLock(t *testing.T, s *Server, id string) (release func()) {
	lk := s.idLock(id)
	lk.Lock()
	var once sync.Once
	release = func() { once.Do(lk.Unlock) }
	t.Cleanup(release)
	return release
}

// Shutdown waits for a submit that took its slot before the drain began
// but is not registered yet (here held at its id's lock): it must not go
// on to cancel and wait for the executions without it, which would then
// start after Shutdown had waited for them all.
func TestShutdownWaitsForASubmitOnItsWay(t *testing.T) {
	h := startServer(t, t.TempDir(), hostExecutor(t))
	c := h.dial(tokenA)
	release := holdIDLock(t, h.srv, "late")
	rid := c.send(protocol.ActionSubmit, map[string]any{"execution_id": "late", "command": "true"})
	// The submit holds its slot once it waits on the lock.
	testenv.Eventually(t, 30*time.Second, func() error {
		h.srv.mu.Lock()
		defer h.srv.mu.Unlock()
		if h.srv.slots != 1 {
			return fmt.Errorf("%d slots held, want the submit's", h.srv.slots)
		}
		return nil
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.srv.Shutdown(ctx)
	}()
	select {
	case <-h.srv.ctx.Done():
		t.Fatal("Shutdown cancelled the executions while a submit that took its slot before the drain was on its way")
	case <-time.After(time.Second):
	}
	release()
	if r, _ := c.reply(rid); r.str("status") != protocol.StatusStarting {
		t.Fatalf("submit: %s", r.raw)
	}
	if res, _ := c.untilResult("late", nil); res.num("exit_code") != 0 {
		t.Fatalf("result: %s", res.raw)
	}
	<-done
}

// Two replicas share one store (here one SQLite file; Postgres in a
// fleet), each with a disk of its own. When one replica's retention
// cleanup deletes the record of an execution the other ran, the other's
// cleanup still removes that execution's workspace and overlay from its
// disk.
func TestRetentionCleanupOfAnotherReplicasExecution(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	exec := hostExecutor(t)
	ha := startServer(t, dir, exec)
	stB, err := store.Open(ctx, ha.dbPath, store.WithReplica("b"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stB.Close() })
	rootB := filepath.Join(dir, "workspaces-b")
	b, err := New(ctx, exec, stB, WithTokens(tokenA, tokenB), WithWorkspaceRoot(rootB), hostPolicies())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Shutdown(context.Background()) })
	hb := &harness{t: t, srv: b, st: stB, root: rootB, http: httptest.NewServer(b.Handler())}
	t.Cleanup(hb.http.Close)
	hb.url = "ws" + strings.TrimPrefix(hb.http.URL, "http")
	c := hb.dial(tokenA)
	c.submit("ran-on-b", "echo data > f", nil)
	c.untilResult("ran-on-b", nil)
	overlay := b.overlayFile(TenantOf(tokenA), "ran-on-b")
	if _, err := os.Stat(overlay); err != nil {
		t.Fatalf("overlay not saved: %v", err)
	}

	later := func() time.Time { return time.Now().Add(ha.srv.o.retention + time.Minute) }
	ha.srv.o.now = later
	ha.srv.cleanupOnce(ctx) // deletes the record
	if ok, err := stB.Exists(ctx, "ran-on-b"); err != nil || ok {
		t.Fatalf("record after the other replica's cleanup: %v, %v", ok, err)
	}
	b.o.now = later
	b.cleanupOnce(ctx)
	if _, err := os.Stat(filepath.Join(rootB, TenantOf(tokenA), "ran-on-b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("workspace kept: %v", err)
	}
	if _, err := os.Stat(overlay); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("overlay kept: %v", err)
	}
}
