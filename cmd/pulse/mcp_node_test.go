package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// requireNode returns the node binary and the folder of the MCP test
// client with its packages installed (scripts/testenv.sh installs both).
// Without them the test skips, except with PULSE_REQUIRE_NODE=1 (CI),
// where it fails.
func requireNode(t *testing.T) (node, dir string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "mcp-client"))
	if err != nil {
		t.Fatal(err)
	}
	missing := func(why string) {
		testenv.Missing(t, testenv.Node, why+" (run scripts/testenv.sh as root to install it)")
	}
	node, err = exec.LookPath("node")
	if err != nil {
		missing("node is not installed")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		missing("the MCP TypeScript SDK is not installed in " + dir + " (npm ci)")
	}
	return node, dir
}

type nodeStep struct {
	IsError    bool            `json:"isError"`
	Text       string          `json:"text"`
	Structured json.RawMessage `json:"structured"`
}

func (s nodeStep) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(s.Structured, v); err != nil {
		t.Fatalf("structured content %s: %v", s.Structured, err)
	}
}

// TestMCPWithTheOfficialTypeScriptClient runs `pulse mcp` under a client
// we did not write: the MCP TypeScript SDK from npm lists the tools and
// calls each, and the workspace on disk shows what was committed.
func TestMCPWithTheOfficialTypeScriptClient(t *testing.T) {
	node, dir := requireNode(t)
	ws := t.TempDir()
	must(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644))
	must(t, os.Mkdir(filepath.Join(ws, "sub"), 0o755))
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	must(t, os.WriteFile(pol, []byte(`rules:
  - {action: shell, target: "curl*", decision: deny}
  - {action: write, target: "secret/**", decision: deny}
`), 0o644))
	self, err := os.Executable()
	must(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "client.mjs"), self, "mcp", "--workspace", ws, "--backend", "namespace", "--policy", pol)
	cmd.Env = append(os.Environ(), asPulseEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stderr.String(), "namespace:") && strings.Contains(stderr.String(), "unavailable") {
			testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr.String())
		}
		t.Fatalf("client: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}
	var rep struct {
		Server struct {
			Name string `json:"name"`
		} `json:"server"`
		Tools []string            `json:"tools"`
		Steps map[string]nodeStep `json:"steps"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	step := func(name string, wantError bool) nodeStep {
		t.Helper()
		s, ok := rep.Steps[name]
		if !ok {
			t.Fatalf("no step %q in the report", name)
		}
		if s.IsError != wantError {
			t.Fatalf("%s: isError = %v, want %v: %s", name, s.IsError, wantError, s.Text)
		}
		return s
	}

	if rep.Server.Name != "pulse" {
		t.Errorf("server name = %q", rep.Server.Name)
	}
	for _, tool := range []string{"commit", "diff", "discard", "execute", "list_files", "read_file", "write_file"} {
		if !slices.Contains(rep.Tools, tool) {
			t.Errorf("tools/list lacks %q: %v", tool, rep.Tools)
		}
	}

	var ex executeOut
	step("execute", false).decode(t, &ex)
	if ex.ExitCode != 0 || ex.Stdout != "out\n" || ex.Transaction == "" || !slices.Contains(ex.Staged, "a.txt") {
		t.Fatalf("execute = %+v", ex)
	}
	var cwd executeOut
	step("execute_cwd_env", false).decode(t, &cwd)
	if cwd.Stdout != "hi from sub\n" {
		t.Errorf("cwd/env: stdout = %q, want %q", cwd.Stdout, "hi from sub\n")
	}
	var to executeOut
	step("execute_timeout", false).decode(t, &to)
	if !to.TimedOut || to.Termination != "timeout" {
		t.Errorf("timeout_seconds: %+v", to)
	}
	if s := step("execute_denied", true); !strings.Contains(s.Text, "denied by policy") {
		t.Errorf("denied command: %q", s.Text)
	}

	var rf readFileOut
	step("read_file", false).decode(t, &rf)
	// read_file reads through the pending stack, as the next command would.
	if rf.Content != "changed\n" || !slices.Contains(rf.PendingTransactions, ex.Transaction) {
		t.Errorf("read_file before commit = %+v (want the pending content and the pending transaction named)", rf)
	}
	if s := step("read_outside", true); !strings.Contains(s.Text, "outside") {
		t.Errorf("read outside: %q", s.Text)
	}
	var ls listOut
	step("list_files", false).decode(t, &ls)
	var names []string
	for _, e := range ls.Entries {
		names = append(names, e.Name)
	}
	if !slices.Contains(names, "a.txt") || slices.Contains(names, ".pulse") {
		t.Errorf("list_files names = %v (want a.txt, and not .pulse)", names)
	}
	var wf writeFileOut
	step("write_file", false).decode(t, &wf)
	if wf.Transaction == "" || wf.Transaction == ex.Transaction {
		t.Errorf("write_file = %+v", wf)
	}
	if s := step("write_outside", true); !strings.Contains(s.Text, "outside the workspace") {
		t.Errorf("write outside: %q", s.Text)
	}
	if s := step("write_denied", true); !strings.Contains(s.Text, "denied by policy") {
		t.Errorf("write denied: %q", s.Text)
	}

	var all diffOut
	step("diff_all", false).decode(t, &all)
	var ids []string
	for _, d := range all.Transactions {
		ids = append(ids, d.ID)
	}
	if !slices.Contains(ids, ex.Transaction) || !slices.Contains(ids, wf.Transaction) {
		t.Errorf("diff of everything pending names %v, want %s and %s", ids, ex.Transaction, wf.Transaction)
	}
	one := step("diff_one", false)
	if !strings.Contains(one.Text, "+changed") || strings.Contains(one.Text, "notes.md") {
		t.Errorf("diff of one transaction:\n%s", one.Text)
	}
	var cm commitOut
	step("commit_one", false).decode(t, &cm)
	if !slices.Equal(cm.Transactions, []string{ex.Transaction}) || !slices.Contains(cm.Paths, "a.txt") {
		t.Errorf("commit = %+v", cm)
	}
	step("read_after_commit", false).decode(t, &rf)
	if rf.Content != "changed\n" {
		t.Errorf("read_file after commit = %q", rf.Content)
	}
	var dc discardOut
	step("discard_all", false).decode(t, &dc)
	if !slices.Contains(dc.Discarded, wf.Transaction) {
		t.Errorf("discard = %+v", dc)
	}
	var after diffOut
	step("diff_after", false).decode(t, &after)
	if len(after.Transactions) != 0 {
		t.Errorf("still pending after discard: %+v", after)
	}
	step("commit_unknown", true)

	// The disk agrees: committed files landed, discarded ones did not.
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "changed\n" {
		t.Errorf("a.txt on disk = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "sub", "new.txt")); string(b) != "new" {
		t.Errorf("sub/new.txt on disk = %q", b)
	}
	if _, err := os.Stat(filepath.Join(ws, "notes.md")); err == nil {
		t.Error("notes.md was discarded but is on disk")
	}
	// And the audit log saw the session, as for pulse exec.
	log, err := os.ReadFile(filepath.Join(ws, ".pulse", "audit.jsonl"))
	must(t, err)
	for _, want := range []string{`"action":"shell"`, `"action":"commit"`, `"decision":"deny"`} {
		if !bytes.Contains(log, []byte(want)) {
			t.Errorf("audit log lacks %s", want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestMCPAgentLoopEndsInOneCommit: an agent's edit → build → test → fix
// loop, driven by the MCP TypeScript SDK, ends in one commit with no step
// outside MCP: the fix touches the file the first attempt wrote, the
// second test run rewrites what the first wrote, and commit without an id
// applies the whole stack. On each isolating backend.
func TestMCPAgentLoopEndsInOneCommit(t *testing.T) {
	node, dir := requireNode(t)
	self, err := os.Executable()
	must(t, err)
	for _, be := range mcpBackends {
		t.Run(be, func(t *testing.T) {
			if be == "docker" {
				requireDockerEngine(t)
			}
			ws := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "loop.mjs"), self, "mcp", "--workspace", ws, "--backend", be)
			cmd.Env = append(os.Environ(), asPulseEnv+"=1")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				if strings.Contains(stderr.String(), "unavailable") {
					testenv.Missing(t, testenv.Namespace, be+" backend unavailable here: "+stderr.String())
				}
				t.Fatalf("client: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
			}
			var rep struct {
				Steps map[string]nodeStep `json:"steps"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
				t.Fatalf("report is not JSON: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
			}
			step := func(name string) nodeStep {
				t.Helper()
				s, ok := rep.Steps[name]
				if !ok || s.IsError {
					t.Fatalf("step %q: %+v", name, s)
				}
				return s
			}
			var fail, pass executeOut
			step("test_fails").decode(t, &fail)
			if fail.ExitCode != 1 || !strings.Contains(fail.Stderr, "FAIL: add 2 3 = -1") {
				t.Fatalf("first test run = %+v, want it to fail", fail)
			}
			step("test_passes").decode(t, &pass)
			if pass.ExitCode != 0 || pass.Stdout != "PASS\n" {
				t.Fatalf("test run after the fix = %+v, want PASS", pass)
			}
			var cm commitOut
			step("commit").decode(t, &cm)
			if len(cm.Transactions) != 5 || !slices.Contains(cm.Transactions, fail.Transaction) || !slices.Contains(cm.Transactions, pass.Transaction) {
				t.Fatalf("commit {} = %+v, want the five transactions of the loop", cm)
			}
			var after diffOut
			step("diff_after").decode(t, &after)
			if len(after.Transactions) != 0 {
				t.Fatalf("still pending after commit {}: %+v", after)
			}
			for p, want := range map[string]string{
				"calc.sh":          "add() { echo $(($1 + $2)); }\n",
				"build/report.txt": "add 2 3 = 5\n",
			} {
				if b, err := os.ReadFile(filepath.Join(ws, p)); err != nil || string(b) != want {
					t.Errorf("%s in the workspace = %q (%v), want %q", p, b, err, want)
				}
			}
			if _, err := os.Stat(filepath.Join(ws, "test.sh")); err != nil {
				t.Errorf("test.sh: %v", err)
			}
		})
	}
}
