package sandbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// checkFork forks sb after a first command and runs both sides: each sees
// the shared base and its own later writes only, ReadFile too; one side's
// commit --all lands its stack and leaves the other's pending stack as it
// was. Every capturing backend must pass it.
func checkFork(t *testing.T, sb *Sandbox) {
	t.Helper()
	ctx := context.Background()
	ws := sb.Workspace()
	run := func(s *Sandbox, script, want string) *Result {
		t.Helper()
		res, err := s.Execute(ctx, Command{Shell: script})
		if err != nil {
			t.Fatalf("lane %q: %q: %v", s.Lane(), script, err)
		}
		if res.ExitCode != 0 || res.Stdout != want {
			t.Fatalf("lane %q: %q: exit %d, stdout %q (want %q)\nstderr %s", s.Lane(), script, res.ExitCode, res.Stdout, want, res.Stderr)
		}
		return res
	}
	run(sb, "echo shared > s.txt", "")
	fk, err := sb.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fk.Close() })
	if fk.Lane() == "" || fk.Lane() == sb.Lane() {
		t.Fatalf("fork lane %q, parent %q", fk.Lane(), sb.Lane())
	}
	run(sb, "echo parent > p.txt && echo parent > both.txt", "")
	run(fk, "echo fork > f.txt && echo fork > both.txt", "")
	run(sb, "cat s.txt p.txt both.txt; test ! -e f.txt && echo ok", "shared\nparent\nparent\nok\n")
	run(fk, "cat s.txt f.txt both.txt; test ! -e p.txt && echo ok", "shared\nfork\nfork\nok\n")

	for _, c := range []struct {
		s          *Sandbox
		path, want string
	}{{sb, "p.txt", "parent\n"}, {sb, "f.txt", ""}, {fk, "f.txt", "fork\n"}, {fk, "p.txt", ""}, {fk, "s.txt", "shared\n"}} {
		b, err := c.s.ReadFile(ctx, c.path)
		if c.want == "" {
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("lane %q reads %s: %q %v, want not there", c.s.Lane(), c.path, b, err)
			}
			continue
		}
		if err != nil || string(b) != c.want {
			t.Errorf("lane %q reads %s: %q %v, want %q", c.s.Lane(), c.path, b, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, "s.txt")); !os.IsNotExist(err) {
		t.Fatal("the workspace changed before any commit")
	}

	// The fork commits its stack: the shared base and its own writes.
	if _, err := fk.CommitAll(ctx); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"s.txt": "shared\n", "f.txt": "fork\n", "both.txt": "fork\n"} {
		if b, err := os.ReadFile(filepath.Join(ws, p)); err != nil || string(b) != want {
			t.Errorf("after the fork's commit --all, %s is %q %v, want %q", p, b, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, "p.txt")); !os.IsNotExist(err) {
		t.Fatal("the fork's commit --all landed the parent's write")
	}
	// The parent's own transaction is intact and still what its commands
	// see; committing it now meets the fork's both.txt as a conflict.
	st, err := sb.Stack(ctx)
	if err != nil || len(st) != 1 || st[0].Lane != sb.Lane() {
		t.Fatalf("parent's stack after the fork's commit: %+v %v", st, err)
	}
	run(sb, "cat s.txt f.txt p.txt both.txt", "shared\nfork\nparent\nparent\n")
	if _, err := sb.CommitAll(ctx); !errors.Is(err, ErrConflict) {
		t.Fatalf("parent's commit --all over the fork's both.txt: %v", err)
	}
}

func TestForkNamespace(t *testing.T) {
	sb := newIsolated(t, t.TempDir())
	checkFork(t, sb)
}

// The audit log and backend a sandbox opened stay open for its fork when
// the sandbox is closed first.
func TestForkOutlivesItsParent(t *testing.T) {
	ws := t.TempDir()
	sb := newIsolated(t, ws)
	ctx := context.Background()
	if _, err := sb.Execute(ctx, Command{Shell: "echo one > a.txt"}); err != nil {
		t.Fatal(err)
	}
	fk, err := sb.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := fk.Execute(ctx, Command{Shell: "cat a.txt"})
	if err != nil || res.Stdout != "one\n" {
		t.Fatalf("fork after its parent closed: %+v %v", res, err)
	}
	evs := verifyAudit(t, fk)
	found := false
	for _, e := range evs {
		found = found || e.Action == "fork" && e.Target == fk.Lane()
	}
	if !found {
		t.Error("the fork is not audited")
	}
	if _, err := sb.Fork(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("fork of a closed sandbox: %v", err)
	}
}

func TestForkRefusedOnHost(t *testing.T) {
	sb := newHost(t, t.TempDir())
	if _, err := sb.Fork(context.Background()); !errors.Is(err, ErrUnsupportedPolicy) {
		t.Fatalf("fork on the host backend: %v", err)
	}
}

func TestForkDocker(t *testing.T) {
	checkFork(t, newDocker(t, t.TempDir()))
}

// A fork's commands run in a container of their own lane: never in the
// container whose base holds another lane's stack, so that commands of
// the two running at once cannot see each other's writes.
func TestForkDockerOwnContainer(t *testing.T) {
	ctx := context.Background()
	sb := newDocker(t, t.TempDir())
	host := func(s *Sandbox) string {
		t.Helper()
		res, err := s.Execute(ctx, Command{Shell: "cat /proc/sys/kernel/hostname"})
		if err != nil || res.ExitCode != 0 || res.Stdout == "" {
			t.Fatalf("lane %q: hostname: %+v %v", s.Lane(), res, err)
		}
		return res.Stdout
	}
	parent := host(sb)
	fk, err := sb.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fk.Close() })
	if got := host(fk); got == parent {
		t.Fatalf("the fork's command ran in its parent's container %q", got)
	}
	if got := host(sb); got != parent {
		t.Fatalf("the parent's second command ran in %q, its first in %q", got, parent)
	}
	// At the same time, the same path: each sees its own write only.
	var wg sync.WaitGroup
	for _, s := range []*Sandbox{sb, fk} {
		wg.Go(func() {
			me := "lane-" + laneName(s.Lane())
			res, err := s.Execute(ctx, Command{Shell: "echo " + me + " > c.txt; sleep 1; cat c.txt"})
			if err != nil || res.ExitCode != 0 || res.Stdout != me+"\n" {
				t.Errorf("%s: %+v %v", me, res, err)
			}
		})
	}
	wg.Wait()
}
