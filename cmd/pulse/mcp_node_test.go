package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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

type planStep struct {
	Step  string         `json:"step"`
	Tool  string         `json:"tool,omitempty"`
	Args  map[string]any `json:"args,omitempty"`
	Fetch string         `json:"fetch,omitempty"`
}

type planReport struct {
	Tools []string            `json:"tools"`
	Steps map[string]nodeStep `json:"steps"`
}

// runPlan runs plan (calls.mjs) against `pulse mcp --backend be` with
// args, under the MCP TypeScript SDK.
func runPlan(t *testing.T, be string, plan []planStep, args ...string) planReport {
	t.Helper()
	node, dir := requireNode(t)
	if be == "docker" {
		requireDockerEngine(t)
	}
	self, err := os.Executable()
	must(t, err)
	b, err := json.Marshal(plan)
	must(t, err)
	pf := filepath.Join(t.TempDir(), "plan.json")
	must(t, os.WriteFile(pf, b, 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{filepath.Join(dir, "calls.mjs"), pf, self, "mcp", "--backend", be}, args...)...)
	cmd.Env = append(os.Environ(), asPulseEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stderr.String(), "unavailable") {
			testenv.Missing(t, testenv.Namespace, be+" backend unavailable here: "+stderr.String())
		}
		t.Fatalf("client: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}
	var rep planReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return rep
}

func (r planReport) step(t *testing.T, name string, wantError bool) nodeStep {
	t.Helper()
	s, ok := r.Steps[name]
	if !ok {
		t.Fatalf("no step %q in the report", name)
	}
	if s.IsError != wantError {
		t.Fatalf("%s: isError = %v, want %v: %s", name, s.IsError, wantError, s.Text)
	}
	return s
}

// TestMCPProcessesExposeAndNetworkRefusals: through the MCP TypeScript
// SDK, an agent starts a server in the background, reads its output as a
// snapshot and then only what is new, exposes its port (an unlisted one
// is refused) and a request from the host reaches it, kills it (its
// writes are staged); a command reaches a host --allow-host lets through,
// and the destination the proxy refused it is in the result, structured
// and in the text, with the proxy's reason. On each isolating backend.
func TestMCPProcessesExposeAndNetworkRefusals(t *testing.T) {
	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "allowed host\n") }))
	defer allowed.Close()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer refused.Close()
	for _, be := range mcpBackends {
		t.Run(be, func(t *testing.T) {
			ws := t.TempDir()
			pol := filepath.Join(t.TempDir(), "policy.yaml")
			must(t, os.WriteFile(pol, []byte("network: {expose: [8000]}\n"), 0o644))
			site := fmt.Sprintf("site-%d-%d", os.Getpid(), time.Now().UnixNano())
			viaProxy := `p=${HTTP_PROXY#http://}; exec 3<>/dev/tcp/${p%:*}/${p##*:}; `
			plan := []planStep{
				{Step: "site", Tool: "execute", Args: map[string]any{"command": "mkdir " + site + " && echo hello from the sandbox > " + site + "/index.html"}},
				{Step: "start", Tool: "start", Args: map[string]any{"command": "echo serving; echo up > served.txt; exec busybox httpd -f -v -p 127.0.0.1:8000 -h " + site, "timeout_seconds": 120}},
				{Step: "out1", Tool: "process_output", Args: map[string]any{"process_id": "${start.process_id}", "wait_seconds": 30}},
				{Step: "expose_unlisted", Tool: "expose", Args: map[string]any{"port": 9000}},
				{Step: "expose", Tool: "expose", Args: map[string]any{"port": 8000}},
				{Step: "get", Fetch: "${expose.url}/index.html"},
				{Step: "out2", Tool: "process_output", Args: map[string]any{"process_id": "${start.process_id}", "offset": "${out1.next_offset}", "wait_seconds": 30}},
				{Step: "list", Tool: "list_processes"},
				{Step: "kill", Tool: "kill", Args: map[string]any{"process_id": "${start.process_id}"}},
				{Step: "out_all", Tool: "process_output", Args: map[string]any{"process_id": "${start.process_id}"}},
				{Step: "reader", Tool: "start", Args: map[string]any{"command": "read line; rest=$(cat); echo \"got $line, then $rest, then eof\""}},
				{Step: "input", Tool: "send_input", Args: map[string]any{"process_id": "${reader.process_id}", "input": "hello\nrest\n", "close": true}},
				// It prints once, after the end of its input: what
				// process_output waits for is all of it.
				{Step: "reader_out", Tool: "process_output", Args: map[string]any{"process_id": "${reader.process_id}", "wait_seconds": 30}},
				{Step: "reader_end", Tool: "kill", Args: map[string]any{"process_id": "${reader.process_id}"}},
				{Step: "reader_all", Tool: "process_output", Args: map[string]any{"process_id": "${reader.process_id}"}},
				{Step: "net", Tool: "execute", Args: map[string]any{"command": viaProxy +
					`printf "GET http://` + allowed.Listener.Addr().String() + `/ HTTP/1.1\r\nHost: ` + allowed.Listener.Addr().String() + `\r\nConnection: close\r\n\r\n" >&3; cat <&3; ` +
					viaProxy + `printf "CONNECT ` + refused.Addr().String() + ` HTTP/1.1\r\n\r\n" >&3; cat <&3`}},
			}
			rep := runPlan(t, be, plan, "--workspace", ws, "--policy", pol, "--allow-host", allowed.Listener.Addr().String())
			for _, tool := range []string{"start", "process_output", "send_input", "kill", "list_processes", "expose", "squash"} {
				if !slices.Contains(rep.Tools, tool) {
					t.Errorf("tools/list lacks %q: %v", tool, rep.Tools)
				}
			}
			var st startOut
			rep.step(t, "start", false).decode(t, &st)
			var o1, o2, all outputOut
			rep.step(t, "out1", false).decode(t, &o1)
			if !strings.HasPrefix(o1.Output, "serving\n") || !o1.Running || o1.NextOffset != int64(len(o1.Output)) {
				t.Errorf("first output snapshot = %+v", o1)
			}
			if s := rep.step(t, "expose_unlisted", true); !strings.Contains(s.Text, "network.expose") {
				t.Errorf("unlisted port: %q", s.Text)
			}
			var ex exposeOut
			rep.step(t, "expose", false).decode(t, &ex)
			if !strings.HasPrefix(ex.Address, "127.0.0.1:") {
				t.Errorf("expose = %+v", ex)
			}
			if s := rep.step(t, "get", false); s.Text != "hello from the sandbox\n" {
				t.Errorf("GET through the exposed port = %q", s.Text)
			}
			rep.step(t, "out2", false).decode(t, &o2)
			rep.step(t, "out_all", false).decode(t, &all)
			after := ""
			if int64(len(all.Output)) >= o1.NextOffset {
				after = all.Output[o1.NextOffset:]
			}
			// httpd logs the request in more than one write: what came
			// first is enough here, the whole log is checked below.
			if o2.Offset != o1.NextOffset || o2.Output == "" || strings.Contains(o2.Output, "serving") || !strings.HasPrefix(after, o2.Output) {
				t.Errorf("output since %d = %+v, want only what came after", o1.NextOffset, o2)
			}
			var ls listProcessesOut
			rep.step(t, "list", false).decode(t, &ls)
			if len(ls.Processes) != 1 || ls.Processes[0].ProcessID != st.ProcessID || !ls.Processes[0].Running {
				t.Errorf("list_processes = %+v", ls)
			}
			var k executeOut
			rep.step(t, "kill", false).decode(t, &k)
			if k.Termination != "cancelled" || !slices.Contains(k.Staged, "served.txt") {
				t.Errorf("kill = %+v, want it cancelled and served.txt staged", k)
			}
			if all.Running || all.Result == nil || all.Result.Transaction != k.Transaction || !strings.HasPrefix(all.Output, o1.Output) ||
				!strings.Contains(all.Output, "response:200") {
				t.Errorf("output after kill = %+v", all)
			}

			var in inputOut
			rep.step(t, "input", false).decode(t, &in)
			if in.Written != len("hello\nrest\n") || !in.Closed {
				t.Errorf("send_input = %+v", in)
			}
			var rd outputOut
			rep.step(t, "reader_all", false).decode(t, &rd)
			if rd.Output != "got hello, then rest, then eof\n" || rd.Running {
				t.Errorf("a process's output after send_input and close = %+v", rd)
			}

			s := rep.step(t, "net", false)
			var ne executeOut
			s.decode(t, &ne)
			if !strings.Contains(ne.Stdout, "allowed host") {
				t.Errorf("the --allow-host destination was not reached: %+v", ne)
			}
			want := netRefusedOut{Destination: refused.Addr().String(), Reason: "127.0.0.1 is in 127.0.0.0/8, which is reached only when listed explicitly"}
			if !slices.Equal(ne.NetRefused, []netRefusedOut{want}) {
				t.Errorf("network_refused = %+v, want %+v", ne.NetRefused, want)
			}
			if !strings.Contains(s.Text, "network refused: "+want.Destination+" ("+want.Reason+")") {
				t.Errorf("the text does not name the refusal:\n%s", s.Text)
			}
		})
	}
}
