package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
)

// noStackBackend captures writes but cannot run a command on top of
// pending transactions. No local backend is like that (a remote server
// of an older protocol is), so a fake stands in for it.
type noStackBackend struct{ ovBackend }

func (n *noStackBackend) Capabilities() backend.Capabilities {
	c := n.ovBackend.Capabilities()
	c.StacksPending = false
	return c
}

// TestPendingInTheWayNamesNoCommand: a command refused because of the
// pending stack (a backend that cannot stack it; a store with no room
// for one more open transaction) is refused with ErrPendingInTheWay, and
// the sandbox's message names no command line: an MCP client has none.
func TestPendingInTheWayNamesNoCommand(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		be   backend.Backend
		opts []Option
	}{
		{"backend cannot stack", &noStackBackend{}, nil},
		{"open transactions bounded", &ovBackend{}, []Option{withCOWOptions(cowfs.WithMaxOpenTransactions(1))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, _ := filepath.EvalSymlinks(t.TempDir())
			sb, err := New(ctx, ws, append([]Option{withGetenv(noEnv), WithBackend(tc.be)}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if _, err := sb.WriteFile(ctx, "a.txt", []byte("pending\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = sb.Execute(ctx, Command{Args: []string{"true"}})
			if !errors.Is(err, ErrPendingInTheWay) {
				t.Fatalf("Execute with a transaction pending: %v, want ErrPendingInTheWay", err)
			}
			if strings.Contains(err.Error(), "pulse ") {
				t.Errorf("the sandbox's refusal names a command line: %v", err)
			}
		})
	}
}
