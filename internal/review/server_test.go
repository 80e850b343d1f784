package review

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/sandbox"
)

func noEnv(string) string { return "" }

func stage(t *testing.T, ws string, files map[string]string) string {
	t.Helper()
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tx, err := f.Begin(t.Context(), "test")
	if err != nil {
		t.Fatal(err)
	}
	for p, d := range files {
		if err := tx.Write(t.Context(), p, []byte(d), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return tx.ID()
}

type page struct {
	base, token, ws string
	srv             *Server
}

// startPage serves the review page of ws on a real loopback listener.
func startPage(t *testing.T, ws string) *page {
	t.Helper()
	token, _ := NewToken()
	r, err := sandbox.OpenReview(context.Background(), ws, sandbox.ReviewVia(sandbox.ViaReviewPage),
		sandbox.ReviewSession(SessionID(token)), sandbox.ReviewGetenv(noEnv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	srv, err := New(Config{Review: r, Token: token, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return &page{base: "http://" + ln.Addr().String(), token: token, ws: ws, srv: srv}
}

type req struct {
	method, path, body string
	auth               string // "bearer", "cookie" (the token as the cookie), "wrong" or ""
	cookie             string // a page cookie of this value
	origin, ctype      string
	host               string
}

func (p *page) do(t *testing.T, q req) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if q.body != "" {
		body = strings.NewReader(q.body)
	}
	r, err := http.NewRequest(q.method, p.base+q.path, body)
	if err != nil {
		t.Fatal(err)
	}
	switch q.auth {
	case "bearer":
		r.Header.Set("Authorization", "Bearer "+p.token)
	case "cookie":
		r.AddCookie(&http.Cookie{Name: cookieName, Value: p.token})
	case "wrong":
		r.Header.Set("Authorization", "Bearer "+strings.Repeat("0", len(p.token)))
	}
	if q.cookie != "" {
		r.AddCookie(&http.Cookie{Name: cookieName, Value: q.cookie})
	}
	if q.origin != "" {
		r.Header.Set("Origin", q.origin)
	}
	if q.ctype != "" {
		r.Header.Set("Content-Type", q.ctype)
	}
	if q.host != "" {
		r.Host = q.host
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// post is a state change as the page makes it.
func (p *page) post(t *testing.T, path, body string) (int, string) {
	resp, b := p.do(t, req{method: "POST", path: path, body: body, auth: "bearer", origin: p.base, ctype: "application/json"})
	return resp.StatusCode, b
}

func TestEveryRequestNeedsTheToken(t *testing.T) {
	ws := t.TempDir()
	id := stage(t, ws, map[string]string{"a.txt": "a\n"})
	p := startPage(t, ws)
	for _, path := range []string{"/", "/app.js", "/app.css", "/api/state", "/api/events", "/nope"} {
		for _, auth := range []string{"", "wrong"} {
			if resp, _ := p.do(t, req{method: "GET", path: path, auth: auth}); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET %s auth %q: %d, want 401", path, auth, resp.StatusCode)
			}
		}
	}
	for _, path := range []string{"/api/commit", "/api/discard", "/api/undo"} {
		resp, _ := p.do(t, req{method: "POST", path: path, body: `{"id":"` + id + `"}`, origin: p.base, ctype: "application/json"})
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s without token: %d", path, resp.StatusCode)
		}
	}
	if resp, _ := p.do(t, req{method: "GET", path: "/?token=" + strings.Repeat("1", len(p.token))}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong token in the query: %d", resp.StatusCode)
	}
	// Nothing was decided.
	if _, err := os.Stat(filepath.Join(ws, "a.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a.txt committed by a request without the token: %v", err)
	}
	// With the token: the query sets the page cookie and leaves a URL
	// whose query holds no token; every route opens with the Bearer token.
	ck := p.visit(t)
	for _, path := range []string{"/", "/app.js", "/app.css", "/api/state"} {
		if resp, _ := p.do(t, req{method: "GET", path: path, auth: "bearer"}); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s with the token: %d", path, resp.StatusCode)
		}
	}
	for _, path := range []string{"/", "/app.js", "/app.css"} {
		if resp, _ := p.do(t, req{method: "GET", path: path, cookie: ck.Value}); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s with the page cookie: %d", path, resp.StatusCode)
		}
	}
	// DNS rebinding: the right token under another Host is refused.
	if resp, _ := p.do(t, req{method: "GET", path: "/api/state", auth: "bearer", host: "evil.example:80"}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("foreign Host: %d", resp.StatusCode)
	}
}

// visit opens the URL pulse review prints, as a browser does, and returns
// the cookie it sets.
func (p *page) visit(t *testing.T) *http.Cookie {
	t.Helper()
	resp, _ := p.do(t, req{method: "GET", path: "/?token=" + p.token})
	if loc, _, _ := strings.Cut(resp.Header.Get("Location"), "#"); resp.StatusCode != http.StatusSeeOther || loc != "/" {
		t.Fatalf("token visit: %d %s", resp.StatusCode, loc)
	}
	for _, c := range resp.Cookies() {
		if c.Name == cookieName {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
				t.Fatalf("cookie %+v", c)
			}
			return c
		}
	}
	t.Fatal("the token visit set no cookie")
	return nil
}

// TestTheCookieOpensNoAPI: a browser sends the cookies of 127.0.0.1 to
// every port of it, so whatever the page keeps in a cookie reaches any
// other local server the browser visits (another user's, or a page one
// sends it to). Neither the cookie the token visit sets nor the token
// itself as a cookie may read a diff or decide anything.
func TestTheCookieOpensNoAPI(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644)
	id := stage(t, ws, map[string]string{"a.txt": "secret diff\n", "b.txt": "b\n"})
	p := startPage(t, ws)
	ck := p.visit(t)
	if strings.Contains(ck.Value, p.token) {
		t.Errorf("the cookie carries the token: %+v", ck)
	}
	for name, q := range map[string]req{"page cookie": {cookie: ck.Value}, "token as cookie": {auth: "cookie"}} {
		for _, path := range []string{"/api/state", "/api/events"} {
			q.method, q.path = "GET", path
			if resp, body := p.do(t, q); resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "secret") {
				t.Errorf("GET %s with the %s: %d %.80q", path, name, resp.StatusCode, body)
			}
		}
		for path, body := range map[string]string{"/api/commit": `{"id":"` + id + `"}`, "/api/discard": `{"id":"` + id + `"}`, "/api/undo": `{}`} {
			q.method, q.path, q.body, q.origin, q.ctype = "POST", path, body, p.base, "application/json"
			if resp, _ := p.do(t, q); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("POST %s with the %s: %d", path, name, resp.StatusCode)
			}
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "one\n" {
		t.Fatalf("a.txt changed by a request with a cookie alone: %q", b)
	}
	if pend, err := p.srv.cfg.Review.Pending(t.Context()); err != nil || len(pend) != 1 {
		t.Fatalf("pending after requests with a cookie alone: %v %v", pend, err)
	}
}

func TestStateChangesNeedSameOrigin(t *testing.T) {
	ws := t.TempDir()
	id := stage(t, ws, map[string]string{"a.txt": "a\n"})
	p := startPage(t, ws)
	body := `{"id":"` + id + `"}`
	for name, q := range map[string]req{
		"no origin":       {ctype: "application/json"},
		"other origin":    {origin: "http://evil.example", ctype: "application/json"},
		"other port":      {origin: "http://127.0.0.1:1", ctype: "application/json"},
		"form post":       {origin: p.base, ctype: "application/x-www-form-urlencoded"},
		"no content type": {origin: p.base},
	} {
		q.method, q.path, q.body, q.auth = "POST", "/api/commit", body, "bearer"
		if resp, _ := p.do(t, q); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, resp.StatusCode)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, "a.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("committed by a cross-origin request: %v", err)
	}
}

func auditOf(t *testing.T, ws string) []audit.Event {
	t.Helper()
	path := filepath.Join(ws, ".pulse", "audit.jsonl")
	if _, err := audit.Verify(t.Context(), path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	var out []audit.Event
	for _, l := range strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n") {
		e, err := audit.ParseLine([]byte(l))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

func TestPageDecisionsAreAudited(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644)
	keep := stage(t, ws, map[string]string{"a.txt": "two\n", "b.txt": "rejected\n"})
	drop := stage(t, ws, map[string]string{"c.txt": "dropped\n"})
	p := startPage(t, ws)

	resp, body := p.do(t, req{method: "GET", path: "/api/state", auth: "bearer"})
	var st stateView
	if err := json.Unmarshal([]byte(body), &st); err != nil || resp.StatusCode != 200 {
		t.Fatalf("state: %d %v %s", resp.StatusCode, err, body)
	}
	if len(st.Pending) != 2 || st.Pending[0].ID != keep || st.Pending[1].ID != drop || st.Chain.Status == "broken" {
		t.Fatalf("state %+v", st)
	}
	if f := st.Pending[0].Files[0]; f.Path != "a.txt" || !strings.Contains(f.Diff, "-one\n+two\n") {
		t.Fatalf("file view %+v", f)
	}

	if code, b := p.post(t, "/api/commit", `{"id":"`+keep+`","accept":["a.txt"]}`); code != 200 {
		t.Fatalf("commit: %d %s", code, b)
	}
	if code, b := p.post(t, "/api/discard", `{"id":"`+drop+`"}`); code != 200 {
		t.Fatalf("discard: %d %s", code, b)
	}
	if code, b := p.post(t, "/api/undo", `{}`); code != 200 {
		t.Fatalf("undo: %d %s", code, b)
	}
	if code, _ := p.post(t, "/api/discard", `{"id":"../../etc"}`); code != http.StatusNotFound {
		t.Fatalf("discard of a bad id: %d", code)
	}
	want := map[string]string{"reject b.txt": keep, "commit a.txt": drop, "discard c.txt": drop, "undo " + keep: keep}
	want["commit a.txt"] = keep
	got := map[string]audit.Event{}
	for _, e := range auditOf(t, ws) {
		got[e.Action+" "+e.Target] = e
	}
	for k, tx := range want {
		e, ok := got[k]
		if !ok || e.TxID != tx || e.Via != sandbox.ViaReviewPage || e.SessionID != SessionID(p.token) || e.Actor != sandbox.OSUser() {
			t.Errorf("%s: %+v (found %v)", k, e, ok)
		}
	}
	if e := got["discard ../../etc"]; e.Decision != "deny" {
		t.Errorf("refused discard not audited as denied: %+v", e)
	}
}

func TestConflictIsShown(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644)
	id := stage(t, ws, map[string]string{"a.txt": "two\n"})
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("someone else\n"), 0o644)
	p := startPage(t, ws)
	if code, b := p.post(t, "/api/commit", `{"id":"`+id+`"}`); code != http.StatusConflict || !strings.Contains(b, `"reason":"modified"`) {
		t.Fatalf("commit: %d %s", code, b)
	}
	_, body := p.do(t, req{method: "GET", path: "/api/state", auth: "bearer"})
	var st stateView
	json.Unmarshal([]byte(body), &st)
	if len(st.Pending) != 1 || st.Pending[0].Conflict == nil || st.Pending[0].Conflict.Path != "a.txt" {
		t.Fatalf("conflict not in the state: %s", body)
	}
}

func TestLiveUpdateWhenATransactionIsAdded(t *testing.T) {
	ws := t.TempDir()
	p := startPage(t, ws)
	r, _ := http.NewRequest("GET", p.base+"/api/events", nil)
	r.Header.Set("Authorization", "Bearer "+p.token)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(r.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	if l, _ := br.ReadString('\n'); !strings.HasPrefix(l, "retry:") {
		t.Fatalf("first line %q", l)
	}
	stage(t, ws, map[string]string{"new.txt": "x"}) // as another process would
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("no change event: %v", err)
		}
		if l == "event: change\n" {
			return
		}
	}
}

func TestServeRefusesNonLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Skipf("cannot listen on 0.0.0.0 here: %v", err)
	}
	defer ln.Close()
	ws := t.TempDir()
	r, err := sandbox.OpenReview(context.Background(), ws, sandbox.ReviewGetenv(noEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, _ := New(Config{Review: r})
	if err := s.Serve(context.Background(), ln); !errors.Is(err, ErrNotLoopback) {
		t.Fatalf("%v", err)
	}
}

func TestSplitDiffAndHostPaths(t *testing.T) {
	d := "diff --git a/x y b/x y\n--- a/x y\n+++ b/x y\n@@ -1 +1 @@\n-a\n+b\n" +
		"diff --git \"a/q\\\"t\" \"b/q\\\"t\"\nnew file mode 100644\n" +
		"diff --git a/bin b/bin\nBinary files a/bin and b/bin differ\n"
	got := splitDiff(d)
	if !strings.HasSuffix(got["x y"], "+b\n") || got["q\"t"] == "" || !strings.Contains(got["bin"], "Binary files") {
		t.Fatalf("%q", got)
	}
	for p, host := range map[string]bool{".git/hooks/pre-commit": true, ".git/config": true, ".gitattributes": true,
		".git/objects/ab/cd": false, "src/.git/config.go": false, "README.md": false, ".git": true, "sub/.git/hooks/x": true} {
		if (RunsOnHost(p) != "") != host {
			t.Errorf("RunsOnHost(%q) = %q", p, RunsOnHost(p))
		}
	}
}

func FuzzSplitDiff(f *testing.F) {
	f.Add("diff --git a/x b/x\n+y\n")
	f.Add("diff --git \"a/\\303\" \"b/\\303\"\n")
	f.Add("diff --git a/x b/x\n+y\ndirectory \"d\": old mode 040755, new mode 040777\n")
	f.Fuzz(func(t *testing.T, d string) {
		for p := range splitDiff(d) {
			_ = RunsOnHost(p)
		}
	})
}

// The combined diff is the net change of the whole stack, and each
// transaction is shown against the stack below it.
func TestCombinedDiffIsTheStackAgainstTheWorkspace(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644)
	first := stage(t, ws, map[string]string{"a.txt": "two\n"})
	time.Sleep(10 * time.Millisecond) // the stack orders by creation time
	second := stage(t, ws, map[string]string{"a.txt": "three\n"})
	p := startPage(t, ws)
	_, body := p.do(t, req{method: "GET", path: "/api/state", auth: "bearer"})
	var st stateView
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Combined, "-one\n+three\n") || strings.Contains(st.Combined, "two") {
		t.Errorf("combined diff is not the net change one -> three:\n%s", st.Combined)
	}
	diffs := map[string]string{}
	for _, tx := range st.Pending {
		diffs[tx.ID] = tx.Diff
	}
	if !strings.Contains(diffs[first], "-one\n+two\n") || !strings.Contains(diffs[second], "-two\n+three\n") {
		t.Errorf("per-transaction diffs not against the stack below: first\n%s\nsecond\n%s", diffs[first], diffs[second])
	}
}

// TestStateFlagsModesAndBidi: the state the page renders says which file
// changes the permission bits of what the workspace has (and who may now
// write it), which holds a bidirectional control in its name or diff,
// and a directory's mode line is that directory's block.
func TestStateFlagsModesAndBidi(t *testing.T) {
	ws := t.TempDir()
	for p, m := range map[string]os.FileMode{"key": 0o600, "plain.txt": 0o644} {
		if err := os.WriteFile(filepath.Join(ws, p), []byte(p+"\n"), m); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(ws, p), m)
	}
	if err := os.Mkdir(filepath.Join(ws, "objects"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(ws, "objects"), 0o755)
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.Begin(t.Context(), "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		p, data string
		mode    os.FileMode
	}{
		{"key", "key\n", 0o666},
		{"plain.txt", "if admin {\u2066 // check later\u2069\n", 0o644},
		{"notes\u202edm.sh", "echo\n", 0o644},
		{"a.txt", "a\n", 0o644},
	} {
		if err := tx.Write(t.Context(), w.p, []byte(w.data), w.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Mkdir(t.Context(), "objects", 0o777); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := startPage(t, ws)
	_, body := p.do(t, req{method: "GET", path: "/api/state", auth: "bearer"})
	var st stateView
	if err := json.Unmarshal([]byte(body), &st); err != nil || len(st.Pending) != 1 {
		t.Fatalf("%v %s", err, body)
	}
	got := map[string]fileView{}
	for _, f := range st.Pending[0].Files {
		got[f.Path] = f
	}
	type flags struct {
		oldMode, mode, widened string
		bidi                   bool
		diffHas                string
	}
	for path, want := range map[string]flags{
		"key":              {"0600", "0666", "group and others", false, "old mode 100600\nnew mode 100666\n"},
		"objects":          {"0755", "0777", "group and others", false, `directory "objects": old mode 040755, new mode 040777`},
		"plain.txt":        {"", "", "", true, "+if admin {\u2066"},
		"notes\u202edm.sh": {"", "", "", true, "+echo"},
		"a.txt":            {"", "", "", false, "+a\n"},
	} {
		f := got[path]
		if f.OldMode != want.oldMode || f.Mode != want.mode || f.Widened != want.widened || f.Bidi != want.bidi {
			t.Errorf("%q: old_mode %q mode %q widened %q bidi %v, want %+v", path, f.OldMode, f.Mode, f.Widened, f.Bidi, want)
		}
		if !strings.Contains(f.Diff, want.diffHas) {
			t.Errorf("%q: diff %q lacks %q", path, f.Diff, want.diffHas)
		}
	}
	if strings.Contains(got["a.txt"].Diff, "directory") || strings.Contains(got["key"].Diff, "directory") {
		t.Errorf("a directory's mode line is part of a file's block: %+v", got)
	}
}

// TestStackActions: an edit and its fix both change a.txt, so neither
// commits alone; the state says which transaction each depends on, a
// commit of one alone is refused with that explanation (409, nothing
// written), Squash merges them, and Commit all commits the ticked paths
// of the stack as one commit.
func TestStackActions(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644)
	edit := stage(t, ws, map[string]string{"a.txt": "buggy\n", "scratch.txt": "s\n"})
	time.Sleep(10 * time.Millisecond) // the stack orders by creation time
	fix := stage(t, ws, map[string]string{"a.txt": "fixed\n"})
	p := startPage(t, ws)
	state := func() stateView {
		_, body := p.do(t, req{method: "GET", path: "/api/state", auth: "bearer"})
		var st stateView
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	deps := map[string]*depView{}
	for _, tx := range state().Pending {
		deps[tx.ID] = tx.CommitDeps
	}
	if d := deps[fix]; d == nil || len(d.On) != 1 || d.On[0] != edit || d.Path != "a.txt" {
		t.Fatalf("the fix's dependencies: %+v", d)
	}
	if d := deps[edit]; d == nil || len(d.On) != 1 || d.On[0] != fix {
		t.Fatalf("the edit's dependencies: %+v", d)
	}
	for _, body := range []string{`{"id":"` + fix + `"}`, `{"id":"` + fix + `","accept":["a.txt"]}`} {
		code, out := p.post(t, "/api/commit", body)
		var r struct{ Depends depView }
		json.Unmarshal([]byte(out), &r)
		if code != http.StatusConflict || len(r.Depends.On) != 1 || r.Depends.On[0] != edit || !strings.Contains(r.Depends.Explain, "Commit all") {
			t.Fatalf("commit of the fix alone (%s): %d %s", body, code, out)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "one\n" {
		t.Fatalf("a refused commit wrote a.txt: %q", b)
	}
	if code, out := p.post(t, "/api/squash", `{}`); code != http.StatusOK || !strings.Contains(out, edit) || !strings.Contains(out, fix) {
		t.Fatalf("squash: %d %s", code, out)
	}
	if st := state(); len(st.Pending) != 1 || st.Pending[0].CommitDeps != nil {
		t.Fatalf("after squash: %+v", st.Pending)
	}
	if code, out := p.post(t, "/api/commit-all", `{"id":"x"}`); code != http.StatusBadRequest {
		t.Fatalf("commit-all with an id: %d %s", code, out)
	}
	if code, out := p.post(t, "/api/commit-all", `{"accept":["a.txt"]}`); code != http.StatusOK || !strings.Contains(out, `"committed":["a.txt"]`) {
		t.Fatalf("commit-all: %d %s", code, out)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "fixed\n" {
		t.Fatalf("a.txt after commit-all: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(ws, "scratch.txt")); !os.IsNotExist(err) {
		t.Fatalf("scratch.txt, not ticked, was committed: %v", err)
	}
	if st := state(); len(st.Pending) != 0 {
		t.Fatalf("still pending: %+v", st.Pending)
	}
}
