package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// mcpSession starts `pulse mcp` (this test binary) on ws under the Go
// SDK's client.
func mcpSession(t *testing.T, ctx context.Context, args ...string) *mcp.ClientSession {
	t.Helper()
	self, err := os.Executable()
	must(t, err)
	cmd := exec.CommandContext(ctx, self, append([]string{"mcp"}, args...)...)
	cmd.Env = append(os.Environ(), asPulseEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	s, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		if strings.Contains(stderr.String(), "unavailable") {
			c := testenv.Namespace
			if slices.Contains(args, "docker") {
				c = testenv.Docker
			}
			testenv.Missing(t, c, string(c)+" backend unavailable here: "+stderr.String())
		}
		t.Fatalf("connect: %v\nstderr:\n%s", err, stderr.String())
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// callTool calls name and decodes its structured result into out (when
// not nil), returning the text of the reply and whether it is an error.
func callTool(t *testing.T, ctx context.Context, s *mcp.ClientSession, name string, args map[string]any, out any) (string, bool) {
	t.Helper()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if out != nil && !res.IsError {
		b, err := json.Marshal(res.StructuredContent)
		must(t, err)
		must(t, json.Unmarshal(b, out))
	}
	return text.String(), res.IsError
}

func TestMCPPendingLinkToAWorkspaceLinkHonoursReadDenials(t *testing.T) {
	ws := t.TempDir()
	must(t, os.WriteFile(filepath.Join(ws, "key.pem"), []byte("PRIVATE-KEY-BYTES\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("a\n"), 0o644))
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	must(t, os.WriteFile(pol, []byte(`rules:
  - {action: read, target: "*.pem", decision: deny}
`), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := mcpSession(t, ctx, "--workspace", ws, "--backend", "namespace", "--policy", pol)

	var ex executeOut
	if txt, isErr := callTool(t, ctx, s, "execute", map[string]any{"command": "ln -s key.pem b"}, &ex); isErr || ex.ExitCode != 0 {
		t.Fatalf("execute ln: %s %+v", txt, ex)
	}
	if txt, isErr := callTool(t, ctx, s, "commit", map[string]any{}, nil); isErr {
		t.Fatalf("commit: %s", txt)
	}
	if txt, isErr := callTool(t, ctx, s, "read_file", map[string]any{"path": "b"}, nil); !isErr {
		t.Fatalf("read_file b (a link to key.pem) = %q, want a refusal", txt)
	}
	if txt, isErr := callTool(t, ctx, s, "execute", map[string]any{"command": "ln -s b a"}, &ex); isErr || ex.ExitCode != 0 {
		t.Fatalf("execute ln: %s %+v", txt, ex)
	}
	txt, isErr := callTool(t, ctx, s, "read_file", map[string]any{"path": "a"}, nil)
	if strings.Contains(txt, "PRIVATE-KEY") || !isErr {
		t.Fatalf("read_file a (pending link to b, a link to key.pem) = %q (error %v), want a refusal", txt, isErr)
	}
}
