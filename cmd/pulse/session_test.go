package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// `pulse exec --session NAME` carries the directory and the exported
// variables from one pulse process to the next; each command is still
// its own pending transaction; another session, or none, starts afresh.
func TestExecSession(t *testing.T) {
	ws := t.TempDir()
	execIn := func(args ...string) (int, string, string) {
		t.Helper()
		return runCLI(t, append([]string{"exec", "--workspace", ws, "--backend", "namespace"}, args...)...)
	}
	code, _, stderr := execIn("--session", "s", "--", "mkdir -p sub && cd sub && export X=1")
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != exitOK {
		t.Fatalf("first: exit %d: %s", code, stderr)
	}
	code, stdout, stderr := execIn("--session", "s", "--json", "--", `pwd; echo "$X"; echo hi > f`)
	if code != exitOK {
		t.Fatalf("second: exit %d: %s", code, stderr)
	}
	var res struct {
		Stdout      string `json:"stdout"`
		Transaction string `json:"transaction"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if lines := strings.Split(res.Stdout, "\n"); len(lines) != 3 || !strings.HasSuffix(lines[0], "/sub") || lines[1] != "1" {
		t.Fatalf("second command printed %q, want .../sub and 1", res.Stdout)
	}
	code, stdout, _ = runCLI(t, "cow", "list", "--workspace", ws)
	if code != exitOK || strings.Count(stdout, "\n") < 2 || !strings.Contains(stdout, res.Transaction) {
		t.Fatalf("cow list: %d %s; want the two commands' transactions", code, stdout)
	}
	for _, other := range [][]string{{"--session", "t"}, nil} {
		code, stdout, _ := execIn(append(other, "--", `pwd; echo "[$X]"`)...)
		if code != exitOK || strings.Contains(stdout, "/sub\n") || !strings.Contains(stdout, "[]") {
			t.Fatalf("%v: exit %d, stdout %q; want a fresh start", other, code, stdout)
		}
	}
	// A command that leaves no state says so, and the session keeps its own.
	code, _, stderr = execIn("--session", "s", "--", "cd / && exec true")
	if code != exitOK || !strings.Contains(stderr, "session s: the command left no state") {
		t.Fatalf("exec at the end: exit %d: %s", code, stderr)
	}
	if code, stdout, _ := execIn("--session", "s", "--", `pwd; echo "$X"`); code != exitOK || !strings.Contains(stdout, "/sub\n1\n") {
		t.Fatalf("after a command that left no state: exit %d, %q", code, stdout)
	}
	if code, _, stderr := execIn("--session", "../x", "--", "true"); code != exitUsage || !strings.Contains(stderr, "--session") {
		t.Fatalf("a session name with a path: exit %d: %s", code, stderr)
	}
	if code, _, _ := execIn("--session", "s", "--cwd", "sub", "--", "true"); code != exitUsage {
		t.Fatalf("--session with --cwd: exit %d", code)
	}
}
