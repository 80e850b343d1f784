package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/internal/testenv"
)

func writeAuditLog(t *testing.T, path string, n int, opts ...audit.Option) {
	t.Helper()
	l, err := audit.Open(t.Context(), path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < n; i++ {
		err := l.Record(context.Background(), audit.Event{
			Action: "shell", Target: "go test ./...", Decision: "allow", ExitCode: audit.Int(i),
			IsolationLevel: "namespace", Detail: "ran\x1b[2J" + strings.Repeat("!", i),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestAuditVerifyIntact(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 3)
	code, stdout, stderr := runCLI(t, "audit", "verify", path)
	if code != exitOK || !strings.Contains(stdout, "intact: 3 events, seq 1..3") {
		t.Fatalf("code %d stdout %q stderr %q", code, stdout, stderr)
	}
}

func TestAuditVerifyTampered(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 4)
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(data), "\n")
	lines[2] = strings.Replace(lines[2], `"exit_code":2`, `"exit_code":0`, 1)
	os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600)
	code, _, stderr := runCLI(t, "audit", "verify", path)
	if code != exitFailure || !strings.Contains(stderr, "first bad seq: 3") || !strings.Contains(stderr, ":3:") {
		t.Fatalf("code %d stderr %q", code, stderr)
	}
}

func TestAuditVerifyNotALog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(path, []byte("just some text\n"), 0o600)
	code, _, stderr := runCLI(t, "audit", "verify", path)
	if code != exitFailure || !strings.Contains(stderr, "not an audit log") || !strings.Contains(stderr, ":1:") {
		t.Fatalf("code %d stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, "audit", "verify", filepath.Join(t.TempDir(), "missing"))
	if code != exitFailure || !strings.Contains(stderr, "no such file") {
		t.Fatalf("missing file: code %d stderr %q", code, stderr)
	}
}

func TestAuditUsage(t *testing.T) {
	for _, args := range [][]string{{"audit"}, {"audit", "verify"}, {"audit", "bogus", "x"}, {"audit", "tail", "a", "b"}, {"audit", "tail", "-x", "f"}} {
		if code, _, _ := runCLI(t, args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
}

func TestAuditTailLastN(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 5)
	code, stdout, stderr := runCLI(t, "audit", "tail", path, "-n", "2")
	if code != exitOK {
		t.Fatalf("code %d stderr %q", code, stderr)
	}
	got := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(got) != 2 || !strings.Contains(got[0], "#4 shell allow") || !strings.Contains(got[1], "#5 shell allow \"go test ./...\" exit=4") {
		t.Fatalf("tail output:\n%s", stdout)
	}
	if strings.Contains(stdout, "\x1b") || !strings.Contains(stdout, `\x1b[2J`) {
		t.Fatalf("control characters not escaped:\n%q", stdout)
	}
}

func TestAuditTailFollowsAcrossRotation(t *testing.T) {
	old := tailPoll
	tailPoll = 5 * time.Millisecond
	t.Cleanup(func() { tailPoll = old })

	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb testenv.SyncBuffer
	env := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	done := make(chan int)
	go func() { done <- run(ctx, env, []string{"audit", "tail", "-f", path}) }()

	waitFor := func(want string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() error {
			if !strings.Contains(out.String(), want) {
				return fmt.Errorf("tail -f never printed %q; output:\n%s\nstderr: %s", want, out.String(), errb.String())
			}
			return nil
		})
	}
	waitFor("#1 shell")
	// Small max size: each new event rotates the file.
	writeAuditLog(t, path, 3, audit.WithMaxSize(300))
	waitFor("#2 shell")
	waitFor("#4 shell")
	if !strings.Contains(out.String(), "rotated") {
		t.Fatalf("rotation not followed:\n%s", out.String())
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, errb.String())
	}
}

func TestAuditVerifyAnchor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 4)
	_, stdout, _ := runCLI(t, "audit", "verify", path)
	i := strings.Index(stdout, "anchor: ")
	if i < 0 {
		t.Fatalf("no anchor printed: %q", stdout)
	}
	anchor := strings.TrimSpace(stdout[i+len("anchor: "):])
	if code, _, stderr := runCLI(t, "audit", "verify", path, "-anchor", anchor); code != exitOK {
		t.Fatalf("own anchor: code %d %s", code, stderr)
	}
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(data), "\n")
	os.WriteFile(path, []byte(strings.Join(lines[:2], "")), 0o600)
	code, _, stderr := runCLI(t, "audit", "verify", path, "-anchor", anchor)
	if code != exitFailure || !strings.Contains(stderr, "first bad seq: 3") {
		t.Fatalf("truncated log: code %d stderr %q", code, stderr)
	}
	if code, _, _ := runCLI(t, "audit", "verify", path, "-anchor", "nonsense"); code != exitUsage {
		t.Fatalf("bad anchor: exit %d", code)
	}
}

// TestAuditDefaultsToTheWorkspaceLog: without FILE, verify, tail and
// export read WORKSPACE/.pulse/audit.jsonl (--workspace, default the
// current directory); without one there, it is a usage error naming it.
func TestAuditDefaultsToTheWorkspaceLog(t *testing.T) {
	ws := t.TempDir()
	if err := os.MkdirAll(filepath.Join(ws, ".pulse"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeAuditLog(t, filepath.Join(ws, ".pulse", "audit.jsonl"), 2)
	if code, out, errOut := runCLI(t, "audit", "verify", "--workspace", ws); code != exitOK || !strings.Contains(out, "intact: 2 events") {
		t.Fatalf("verify --workspace: %d %q %s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "audit", "tail", "--workspace", ws, "-n", "-1"); code != exitOK || strings.Count(out, "go test ./...") != 2 {
		t.Fatalf("tail --workspace: %d %q %s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "audit", "export", "--format", "ocsf", "--workspace", ws); code != exitOK || strings.Count(out, "\n") != 2 {
		t.Fatalf("export --workspace: %d %q %s", code, out, errOut)
	}
	empty := t.TempDir()
	if code, _, errOut := runCLI(t, "audit", "verify", "--workspace", empty); code != exitUsage || !strings.Contains(errOut, filepath.Join(empty, ".pulse", "audit.jsonl")) {
		t.Fatalf("verify of a workspace without a log: %d %s", code, errOut)
	}
}
