package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// gateBackend is a strong capturing backend (ovBackend's capabilities)
// whose commands are named by their first argument: "write PATH DATA"
// returns an overlay writing DATA to PATH, after waiting for release when
// the command is "write-after". It records the pending view each saw.
type gateBackend struct {
	ovBackend
	release chan struct{}
	started chan struct{}
}

func (g *gateBackend) Exec(_ context.Context, r *backend.Request) (*backend.Result, error) {
	if r.Args[0] == "write-after" {
		g.started <- struct{}{}
		<-g.release
	}
	ov := &backend.Overlay{}
	for i := 1; i+1 < len(r.Args); i += 2 {
		if r.Args[i+1] == "-" {
			ov.Deleted = append(ov.Deleted, r.Args[i])
			continue
		}
		ov.Files = append(ov.Files, backend.File{Path: r.Args[i], Mode: 0o644, Data: []byte(r.Args[i+1])})
	}
	return &backend.Result{Termination: backend.Exited, Overlay: ov}, nil
}

// TestConcurrentChangesAreReported: a command that ran while another
// staged a change to a path it also writes is told so (and the audit log
// says so), since it made its version without seeing the other's; paths
// only one of them wrote, and commands one after the other, are not.
func TestConcurrentChangesAreReported(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	g := &gateBackend{release: make(chan struct{}), started: make(chan struct{})}
	sb, err := New(context.Background(), ws, WithBackend(g))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	type out struct {
		res *Result
		err error
	}
	slow := make(chan out, 1)
	go func() {
		res, err := sb.Execute(ctx, Command{Args: []string{"write-after", "shared", "slow\n", "mine", "m\n", "gone", "-"}})
		slow <- out{res, err}
	}()
	<-g.started
	fast, err := sb.Execute(ctx, Command{Args: []string{"write", "shared", "fast\n", "gone", "g\n", "theirs", "t\n"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(fast.ConcurrentChanges) != 0 {
		t.Errorf("the command that finished first reports %v", fast.ConcurrentChanges)
	}
	close(g.release)
	o := <-slow
	if o.err != nil {
		t.Fatal(o.err)
	}
	got := slices.Sorted(slices.Values(o.res.ConcurrentChanges))
	if want := []string{"gone", "shared"}; !slices.Equal(got, want) {
		t.Errorf("ConcurrentChanges = %v, want %v (staged %v)", got, want, o.res.Staged)
	}
	raw, err := os.ReadFile(filepath.Join(ws, ".pulse", "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	log := string(raw)
	for _, p := range []string{"shared", "gone"} {
		if !strings.Contains(log, fmt.Sprintf(`"target":"%s"`, p)) || !strings.Contains(log, "concurrent_change") {
			t.Errorf("no concurrent_change event for %s in the audit log", p)
		}
	}
	// One after the other: the second sees the first's change.
	after, err := sb.Execute(ctx, Command{Args: []string{"write", "shared", "later\n"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.ConcurrentChanges) != 0 {
		t.Errorf("a command after the others reports %v", after.ConcurrentChanges)
	}
}
