package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/sandbox"
	"github.com/pulse-agent/pulse/secrets"
)

// noStackBackend captures writes but cannot run a command on top of
// pending transactions. No local backend is like that (a remote server
// that cannot stack is), so this fake stands in for one; it never runs
// anything, since the refusal comes first.
type noStackBackend struct{ backend.Backend }

func (noStackBackend) Name() string                    { return "nostack" }
func (noStackBackend) Probe(context.Context) error     { return nil }
func (noStackBackend) Reconcile(context.Context) error { return nil }
func (noStackBackend) Close() error                    { return nil }
func (noStackBackend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Isolation: backend.IsolationContainer, CapturesWrites: true,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{policy.NetworkDenyAll: policy.Strong},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{secrets.DenyAll: policy.Strong}}
}
func (noStackBackend) Exec(context.Context, *backend.Request) (*backend.Result, error) {
	return nil, errors.New("nostack: ran a command over pending transactions")
}

func toolText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestMCPPendingRefusalNamesTools: a command refused because of the
// pending stack tells an MCP agent what to do with the tools it has,
// not a CLI command it cannot run.
func TestMCPPendingRefusalNamesTools(t *testing.T) {
	ctx := t.Context()
	ws := t.TempDir()
	sb, err := sandbox.New(ctx, ws, sandbox.WithBackend(noStackBackend{}))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	tools := &mcpTools{sb: sb}
	if _, _, err := tools.writeFile(ctx, nil, writeFileIn{Path: "a.txt", Content: "pending\n"}); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		tool string
		run  func() error
	}{
		{"execute", func() error { _, _, err := tools.execute(ctx, nil, executeIn{Command: "true"}); return err }},
	} {
		err := call.run()
		if !errors.Is(err, sandbox.ErrPendingInTheWay) || strings.Contains(err.Error(), "pulse ") ||
			!strings.Contains(err.Error(), "commit without an id") || !strings.Contains(err.Error(), "diff") {
			t.Errorf("%s over a pending stack the backend cannot stack: %v, want ErrPendingInTheWay naming the diff and commit tools, no CLI command", call.tool, err)
		}
	}
}

// TestMCPExecuteCancelledKeepsOutput: a command whose call is cancelled
// while it runs reaches the agent as a tool error that still carries the
// output so far, in the text and the structured result. (The SDK drops
// the structured result of a handler that returns an error.) The host
// backend runs it: what is checked is the MCP result, not isolation.
func TestMCPExecuteCancelledKeepsOutput(t *testing.T) {
	ws := t.TempDir()
	hb, err := host.New()
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	sb, err := sandbox.New(t.Context(), ws, sandbox.WithBackend(hb),
		sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	mark := filepath.Join(ws, "started") // the host backend writes in the workspace itself
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if _, err := os.Stat(mark); err == nil {
				cancel()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	res, out, err := (&mcpTools{sb: sb}).execute(ctx, nil, executeIn{Command: "echo partial; : > started; sleep 60"})
	if err != nil {
		t.Fatalf("execute returned an error, which the SDK sends without the result: %v", err)
	}
	if res == nil || !res.IsError {
		t.Fatalf("execute = %+v, want a result marked is_error", res)
	}
	if txt := toolText(res); !strings.Contains(txt, "partial") || !strings.Contains(txt, context.Canceled.Error()) {
		t.Errorf("text %q, want the partial output and the cancellation", txt)
	}
	if out.Stdout != "partial\n" {
		t.Errorf("structured stdout %q, want the partial output", out.Stdout)
	}
}
