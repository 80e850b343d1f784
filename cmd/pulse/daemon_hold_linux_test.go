package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// daemonMCP starts `pulse mcp` through the rig's daemon under the Go
// SDK's client, on the backend the rig's exec uses.
func (r *daemonRig) daemonMCP(ctx context.Context) (*mcp.ClientSession, *exec.Cmd, *testenv.SyncBuffer) {
	r.t.Helper()
	cmd := r.command(false, append([]string{"mcp"}, r.args...)...)
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	s, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		r.t.Fatalf("connect: %v\nstderr:\n%s", err, stderr.String())
	}
	r.t.Cleanup(func() { s.Close() })
	return s, cmd, &stderr
}

// auditActions counts the actions of the workspace's audit log.
func (r *daemonRig) auditActions() map[string]int {
	r.t.Helper()
	data, err := os.ReadFile(filepath.Join(r.ws, ".pulse", "audit.jsonl"))
	must(r.t, err)
	n := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var ev struct {
			Action, Decision string
		}
		must(r.t, json.Unmarshal([]byte(line), &ev))
		n[ev.Action+"/"+ev.Decision]++
	}
	return n
}

// fds counts the open descriptors of process pid.
func fds(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	must(t, err)
	return len(ents)
}

func idleDaemon(r *daemonRig, pid, wantFDs int) func() error {
	return func() error {
		st, err := r.status()
		if err != nil {
			return err
		}
		if st.Active != 0 {
			return fmt.Errorf("%d request(s) active, want 0", st.Active)
		}
		if wantFDs > 0 {
			if n := fds(r.t, pid); n != wantFDs {
				return fmt.Errorf("the daemon has %d descriptors open, want %d", n, wantFDs)
			}
		}
		return nil
	}
}

// TestDaemonHoldsOneSandboxForMCPAndExec: an MCP session and pulse exec
// through one daemon share the workspace's sandbox: what the session
// stages the command sees pending, one sandbox-init is in the audit log
// (one writer), and the chain verifies. The session counts as active
// while it is open; its end, by EOF or by its client being killed,
// leaves the daemon as it was.
func TestDaemonHoldsOneSandboxForMCPAndExec(t *testing.T) {
	r := newDaemonRig(t)
	r.serve()
	inits := r.auditActions()["sandbox-init/allow"] // the rig's probe
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, _, stderr := r.daemonMCP(ctx)
	st, err := r.status()
	must(t, err)
	if st.Active != 1 {
		t.Fatalf("%d request(s) active with an MCP session open, want 1", st.Active)
	}
	var w writeFileOut
	if txt, isErr := callTool(t, ctx, s, "write_file", map[string]any{"path": "from-mcp.txt", "content": "staged by MCP\n"}, &w); isErr {
		t.Fatalf("write_file: %s\n%s", txt, stderr.String())
	}
	if code, out, errOut := r.run(false, "", "exec", "--", "cat", "from-mcp.txt"); code != 0 || out != "staged by MCP\n" {
		t.Fatalf("exec cat: exit %d %q %s", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(r.ws, "from-mcp.txt")); err == nil {
		t.Fatal("the staged write reached the workspace")
	}
	if code, out, errOut := r.run(false, "", "cow", "list"); code != 0 || !strings.Contains(out, w.Transaction) {
		t.Fatalf("cow list: exit %d %q %s; want transaction %s", code, out, errOut, w.Transaction)
	}
	var ex executeOut
	if txt, isErr := callTool(t, ctx, s, "execute", map[string]any{"command": "cat from-mcp.txt"}, &ex); isErr || ex.Stdout != "staged by MCP\n" {
		t.Fatalf("execute: %s %+v", txt, ex)
	}
	must(t, s.Close())
	testenv.Eventually(t, 30*time.Second, idleDaemon(r, 0, 0))
	if n := r.auditActions()["sandbox-init/allow"] - inits; n != 1 {
		t.Errorf("%d sandbox-init events in the audit log, want 1 (one sandbox for the session and the commands)", n)
	}
	if code, out, errOut := r.run(true, "", "audit", "verify"); code != 0 {
		t.Errorf("audit verify: exit %d %s %s", code, out, errOut)
	}

	// A client killed mid-session: the daemon ends the session and is
	// left with what it held before it.
	st, err = r.status()
	must(t, err)
	base := fds(t, st.Pid)
	// Pipes of the test's own: the client's end of stdin stays open
	// after its pulse is killed, as a client's parent may keep it.
	inR, inW, err := os.Pipe()
	must(t, err)
	outR, outW, err := os.Pipe()
	must(t, err)
	defer inW.Close()
	defer outR.Close()
	front := r.command(false, append([]string{"mcp"}, r.args...)...)
	front.Stdin, front.Stdout = inR, outW
	must(t, front.Start())
	inR.Close()
	outW.Close()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	s2, err := c.Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: nopCloser{inW}}, nil)
	must(t, err)
	if txt, isErr := callTool(t, ctx, s2, "read_file", map[string]any{"path": "from-mcp.txt"}, nil); isErr || !strings.Contains(txt, "staged by MCP") {
		t.Fatalf("read_file in a second session: %s", txt)
	}
	must(t, front.Process.Kill())
	front.Wait()
	// The test still holds its end of the session's stdin: the daemon
	// must not wait for it.
	testenv.Eventually(t, 30*time.Second, idleDaemon(r, st.Pid, base))
	if code, out, errOut := r.run(false, "", "exec", "--", "echo", "next"); code != 0 || out != "next\n" {
		t.Fatalf("after the killed session: exit %d %q %s", code, out, errOut)
	}
}

// TestDaemonServesTheReviewPageOfTheHeldSandbox: pulse review through
// the daemon prints its URL on the caller's stdout, shows at once what a
// pulse exec through the same daemon staged, commits it through the
// same audit writer, and ends on Ctrl-C with 130.
func TestDaemonServesTheReviewPageOfTheHeldSandbox(t *testing.T) {
	r := newDaemonRig(t)
	r.serve()
	inits := r.auditActions()["sandbox-init/allow"] // the rig's probe
	if code, _, errOut := r.run(false, "", "exec", "--", "true"); code != 0 {
		t.Fatalf("exec true: exit %d %s", code, errOut)
	}
	cmd := r.command(false, "review")
	out, err := cmd.StdoutPipe()
	must(t, err)
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("no URL: %v; stderr: %s", err, stderr.String())
	}
	u, err := url.Parse(strings.TrimSpace(line))
	must(t, err)
	token := u.Query().Get("token")
	st, err := r.status()
	must(t, err)
	if st.Active != 1 {
		t.Fatalf("%d request(s) active with the review page open, want 1", st.Active)
	}
	if code, _, errOut := r.run(false, "", "exec", "--", "sh", "-c", "echo from the CLI > made-by-cli.txt"); code != 0 {
		t.Fatalf("exec: exit %d %s", code, errOut)
	}
	api := func(method, path string) []byte {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+u.Host+path, strings.NewReader("{}"))
		must(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Origin", "http://"+u.Host)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %s %s", method, path, resp.Status, body)
		}
		return body
	}
	var state struct {
		Pending []struct {
			Files []struct {
				Path string `json:"path"`
			} `json:"files"`
		} `json:"pending"`
	}
	must(t, json.Unmarshal(api("GET", "/api/state"), &state))
	if len(state.Pending) != 1 || len(state.Pending[0].Files) != 1 || state.Pending[0].Files[0].Path != "made-by-cli.txt" {
		t.Fatalf("the page shows %+v, want the CLI's made-by-cli.txt pending", state)
	}
	api("POST", "/api/commit-all")
	if b, err := os.ReadFile(filepath.Join(r.ws, "made-by-cli.txt")); err != nil || string(b) != "from the CLI\n" {
		t.Fatalf("after the page's commit: %q %v", b, err)
	}
	must(t, cmd.Process.Signal(syscall.SIGINT))
	if code := waitExit(t, cmd); code != 130 {
		t.Errorf("exit %d after SIGINT, want 130; stderr: %s", code, stderr.String())
	}
	testenv.Eventually(t, 30*time.Second, idleDaemon(r, 0, 0))
	if n := r.auditActions()["sandbox-init/allow"] - inits; n != 1 {
		t.Errorf("%d sandbox-init events in the audit log, want 1 (one sandbox for the page and the commands)", n)
	}
	if code, out, errOut := r.run(true, "", "audit", "verify"); code != 0 {
		t.Errorf("audit verify: exit %d %s %s", code, out, errOut)
	}
}

// nopCloser keeps the pipe open when the SDK closes its transport.
type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// TestDaemonCowDecidesThroughTheHeldSandbox: pulse cow through the
// daemon lists and commits through the sandbox the daemon holds for the
// workspace, the one pulse exec ran in: one sandbox-init in the audit
// log, and the commit recorded by that sandbox's audit writer (its
// session), where a store and writer opened for the cow command alone
// would record none. The next exec sees the commit. While the daemon
// holds none, a cow decision opens none (no backend is chosen for it).
func TestDaemonCowDecidesThroughTheHeldSandbox(t *testing.T) {
	r := newDaemonRig(t)
	r.serve()
	if code, _, errOut := r.run(true, "", "exec", "--", "sh", "-c", "echo first > first.txt"); code != 0 {
		t.Fatalf("in-process exec: exit %d %s", code, errOut)
	}
	inits := r.auditActions()["sandbox-init/allow"] // the rig's probe, the exec's
	if code, out, errOut := r.run(false, "", "cow", "commit", "--all"); code != 0 || !strings.Contains(out, "first.txt") {
		t.Fatalf("cow commit --all with no sandbox held: exit %d %q %s", code, out, errOut)
	}
	if n := r.auditActions()["sandbox-init/allow"] - inits; n != 0 {
		t.Fatalf("a cow commit with no sandbox held opened %d sandbox(es), want 0", n)
	}
	if code, _, errOut := r.run(false, "", "exec", "--", "sh", "-c", "echo staged > by-exec.txt"); code != 0 {
		t.Fatalf("exec: exit %d %s", code, errOut)
	}
	code, out, errOut := r.run(false, "", "cow", "list", "--json")
	var txs []struct {
		ID, State string
	}
	if code != 0 || json.Unmarshal([]byte(out), &txs) != nil {
		t.Fatalf("cow list: exit %d %q %s", code, out, errOut)
	}
	var open []string
	for _, tx := range txs {
		if tx.State == "open" {
			open = append(open, tx.ID)
		}
	}
	if len(open) != 1 {
		t.Fatalf("cow list: %q; want one open transaction", out)
	}
	if code, out, errOut := r.run(false, "", "cow", "commit", open[0]); code != 0 {
		t.Fatalf("cow commit: exit %d %q %s", code, out, errOut)
	}
	if code, out, errOut := r.run(false, "", "exec", "--", "cat", "by-exec.txt"); code != 0 || out != "staged\n" {
		t.Fatalf("exec cat after the commit: exit %d %q %s", code, out, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(r.ws, "by-exec.txt")); err != nil || string(b) != "staged\n" {
		t.Fatalf("the workspace after cow commit: %q %v", b, err)
	}
	testenv.Eventually(t, 30*time.Second, idleDaemon(r, 0, 0))
	if n := r.auditActions()["sandbox-init/allow"] - inits; n != 1 {
		t.Errorf("%d sandbox-init events in the audit log, want 1 (one sandbox for cow and exec)", n)
	}
	data, err := os.ReadFile(filepath.Join(r.ws, ".pulse", "audit.jsonl"))
	must(t, err)
	var initSession string
	commits := 0
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var ev struct {
			Action, Decision, Target, Via string
			Session                       string `json:"session_id"`
		}
		must(t, json.Unmarshal([]byte(line), &ev))
		switch {
		case ev.Action == "sandbox-init" && ev.Decision == "allow":
			initSession = ev.Session // the last: the daemon's sandbox
		case ev.Action == "commit" && ev.Target == "by-exec.txt":
			commits++
			if ev.Session == "" || ev.Session != initSession {
				t.Errorf("the commit was recorded with session %q, want the held sandbox's %q (its audit writer)", ev.Session, initSession)
			}
		}
	}
	if commits != 1 {
		t.Errorf("%d commit events for by-exec.txt, want 1", commits)
	}
	if code, out, errOut := r.run(true, "", "audit", "verify"); code != 0 {
		t.Errorf("audit verify: exit %d %s %s", code, out, errOut)
	}
}
