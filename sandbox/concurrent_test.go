package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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

// gateSandbox is a sandbox of ws on a new gateBackend, with opts.
func gateSandbox(t *testing.T, ws string, opts ...Option) (*Sandbox, *gateBackend) {
	t.Helper()
	g := &gateBackend{release: make(chan struct{}), started: make(chan struct{})}
	sb, err := New(context.Background(), ws, append([]Option{WithBackend(g)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb, g
}

type execOutcome struct {
	res *Result
	err error
}

// startGated runs a "write-after" command in the background, returning
// once its backend has started it; its outcome arrives once g.release
// is closed.
func startGated(sb *Sandbox, g *gateBackend, args ...string) <-chan execOutcome {
	done := make(chan execOutcome, 1)
	go func() {
		res, err := sb.Execute(context.Background(), Command{Args: append([]string{"write-after"}, args...)})
		done <- execOutcome{res, err}
	}()
	<-g.started
	return done
}

// TestConcurrentChangesAreReported: a command that ran while another
// staged a change to a path it also writes is told so (and the audit log
// says so), since it made its version without seeing the other's; paths
// only one of them wrote, and commands one after the other, are not.
func TestConcurrentChangesAreReported(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	sb, g := gateSandbox(t, ws)
	ctx := context.Background()
	slow := startGated(sb, g, "shared", "slow\n", "mine", "m\n", "gone", "-")
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

// TestAutoCommitHoldsWhatChangedInTheWorkspaceMeanwhile: a file of the
// workspace changed while a command ran (another command's commit, an
// edit) is not overwritten by auto-commit with the version the command
// made without it: the transaction stays pending with ErrConcurrentChange,
// and the change is reported. A command with no such change commits.
func TestAutoCommitHoldsWhatChangedInTheWorkspaceMeanwhile(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	if err := os.WriteFile(filepath.Join(ws, "shared"), []byte("base\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb, g := gateSandbox(t, ws, WithAutoCommit())
	ctx := context.Background()
	slow := startGated(sb, g, "shared", "base\nslow\n", "mine", "m\n")
	// The kernel stamps inode times from a clock that lags the one
	// Execute reads by up to a tick: a change within it goes unseen.
	time.Sleep(30 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(ws, "shared"), []byte("base\nedit\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	o := <-slow
	if o.err != nil {
		t.Fatal(o.err)
	}
	if !errors.Is(o.res.CommitErr, ErrConcurrentChange) || o.res.Transaction == "" || len(o.res.Committed) != 0 {
		t.Fatalf("auto-commit over a change made meanwhile: CommitErr %v, transaction %q, committed %v", o.res.CommitErr, o.res.Transaction, o.res.Committed)
	}
	if !slices.Equal(o.res.ConcurrentChanges, []string{"shared"}) {
		t.Errorf("ConcurrentChanges = %v, want [shared]", o.res.ConcurrentChanges)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "shared")); string(b) != "base\nedit\n" {
		t.Errorf("the edit made meanwhile was overwritten: %q", b)
	}
	if _, err := sb.DiscardAll(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, Command{Args: []string{"write", "shared", "base\nedit\nlater\n"}})
	if err != nil || res.CommitErr != nil || len(res.Committed) != 1 || len(res.ConcurrentChanges) != 0 {
		t.Fatalf("a command with nothing changed meanwhile: %v, CommitErr %v, committed %v, concurrent %v", err, res.CommitErr, res.Committed, res.ConcurrentChanges)
	}
}

// TestAutoCommitHoldsWhatWasRemovedInTheWorkspaceMeanwhile: a file (or
// the directory holding it) removed from the workspace while a command
// ran, which the command then wrote, is not brought back by auto-commit:
// the command may have made its version from what was removed. A new
// file in a directory nothing else changed commits; so does one beside
// a commit that finished while the command ran (the commit changed the
// directory, not a removal).
func TestAutoCommitHoldsWhatWasRemovedInTheWorkspaceMeanwhile(t *testing.T) {
	for _, tc := range []struct {
		name, path, remove string
	}{
		{"file", "shared", "shared"},
		{"tree", "dir/sub/shared", "dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, _ := filepath.EvalSymlinks(t.TempDir())
			full := filepath.Join(ws, filepath.FromSlash(tc.path))
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, []byte("base\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			sb, g := gateSandbox(t, ws, WithAutoCommit())
			slow := startGated(sb, g, tc.path, "base\nslow\n")
			// Inode times come from a clock a tick behind Execute's.
			time.Sleep(30 * time.Millisecond)
			if err := os.RemoveAll(filepath.Join(ws, tc.remove)); err != nil {
				t.Fatal(err)
			}
			close(g.release)
			o := <-slow
			if o.err != nil {
				t.Fatal(o.err)
			}
			if !errors.Is(o.res.CommitErr, ErrConcurrentChange) || o.res.Transaction == "" || len(o.res.Committed) != 0 {
				t.Fatalf("auto-commit over a removal made meanwhile: CommitErr %v, transaction %q, committed %v", o.res.CommitErr, o.res.Transaction, o.res.Committed)
			}
			if !slices.Equal(o.res.ConcurrentChanges, []string{tc.path}) {
				t.Errorf("ConcurrentChanges = %v, want [%s]", o.res.ConcurrentChanges, tc.path)
			}
			if _, err := os.Lstat(full); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the removed file was brought back: %v", err)
			}
		})
	}
	t.Run("new-file", func(t *testing.T) {
		ws, _ := filepath.EvalSymlinks(t.TempDir())
		sb, g := gateSandbox(t, ws, WithAutoCommit())
		slow := startGated(sb, g, "new", "n\n")
		time.Sleep(30 * time.Millisecond)
		close(g.release)
		o := <-slow
		if o.err != nil || o.res.CommitErr != nil || len(o.res.Committed) != 1 || len(o.res.ConcurrentChanges) != 0 {
			t.Fatalf("a new file, nothing changed meanwhile: %v, CommitErr %v, committed %v, concurrent %v", o.err, o.res.CommitErr, o.res.Committed, o.res.ConcurrentChanges)
		}
	})
	t.Run("by-a-commit", func(t *testing.T) {
		// Another command of the sandbox removes the file and auto-commits
		// while this one writes it.
		ws, _ := filepath.EvalSymlinks(t.TempDir())
		if err := os.WriteFile(filepath.Join(ws, "shared"), []byte("base\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		sb, g := gateSandbox(t, ws, WithAutoCommit())
		slow := startGated(sb, g, "shared", "base\nslow\n")
		time.Sleep(30 * time.Millisecond)
		rm, err := sb.Execute(context.Background(), Command{Args: []string{"write", "shared", "-"}})
		if err != nil || !slices.Equal(rm.Committed, []string{"shared"}) {
			t.Fatalf("the removing command: %v, committed %v, CommitErr %v", err, rm.Committed, rm.CommitErr)
		}
		close(g.release)
		o := <-slow
		if o.err != nil {
			t.Fatal(o.err)
		}
		if !errors.Is(o.res.CommitErr, ErrConcurrentChange) || !slices.Equal(o.res.ConcurrentChanges, []string{"shared"}) {
			t.Fatalf("a file a commit removed meanwhile: CommitErr %v, concurrent %v, committed %v", o.res.CommitErr, o.res.ConcurrentChanges, o.res.Committed)
		}
		if _, err := os.Lstat(filepath.Join(ws, "shared")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the removed file was brought back: %v", err)
		}
	})
	t.Run("beside-a-commit", func(t *testing.T) {
		ws, _ := filepath.EvalSymlinks(t.TempDir())
		sb, g := gateSandbox(t, ws)
		ctx := context.Background()
		other, err := sb.Execute(ctx, Command{Args: []string{"write", "other", "o\n"}})
		if err != nil || other.Transaction == "" {
			t.Fatalf("other: %v %+v", err, other)
		}
		slow := startGated(sb, g, "new", "n\n")
		time.Sleep(30 * time.Millisecond)
		tx, err := sb.OpenTx(ctx, other.Transaction)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		close(g.release)
		o := <-slow
		if o.err != nil || len(o.res.ConcurrentChanges) != 0 {
			t.Fatalf("a new file beside a commit made meanwhile: %v, concurrent %v", o.err, o.res.ConcurrentChanges)
		}
	})
}

// TestConcurrentCommitOfWhatTheCommandSawIsNoChange: a command that saw a
// pending transaction's version of a path, which is committed while the
// command runs, made its version on top of what the workspace now holds:
// nothing to report, and auto-commit goes ahead. Had that transaction
// been discarded instead, the command's version would bring back what it
// saw there, and it is reported.
func TestConcurrentCommitOfWhatTheCommandSawIsNoChange(t *testing.T) {
	for _, end := range []string{"commit", "discard"} {
		t.Run(end, func(t *testing.T) {
			ws, _ := filepath.EvalSymlinks(t.TempDir())
			sb, g := gateSandbox(t, ws)
			ctx := context.Background()
			first, err := sb.Execute(ctx, Command{Args: []string{"write", "shared", "one\n"}})
			if err != nil || first.Transaction == "" {
				t.Fatalf("first: %v %+v", err, first)
			}
			slow := startGated(sb, g, "shared", "one\ntwo\n")
			// Inode times come from a clock a tick behind Execute's.
			time.Sleep(30 * time.Millisecond)
			tx, err := sb.OpenTx(ctx, first.Transaction)
			if err != nil {
				t.Fatal(err)
			}
			if end == "commit" {
				_, err = tx.Commit(ctx)
			} else {
				err = tx.Discard(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			close(g.release)
			o := <-slow
			if o.err != nil {
				t.Fatal(o.err)
			}
			if want := end == "discard"; (len(o.res.ConcurrentChanges) > 0) != want {
				t.Errorf("after a %s meanwhile: ConcurrentChanges %v, want reported: %v", end, o.res.ConcurrentChanges, want)
			}
		})
	}
}

// TestReadFileWhileACommandRunsSeesThePendingStack: ReadFile reads through
// the pending stack while a command runs on it, also when the last stack
// read before was an empty one (its cached view once stood in for the
// command's stack, and ReadFile answered from the workspace).
func TestReadFileWhileACommandRunsSeesThePendingStack(t *testing.T) {
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("workspace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb, g := gateSandbox(t, ws)
	ctx := context.Background()
	if b, err := sb.ReadFile(ctx, "a.txt"); err != nil || string(b) != "workspace\n" {
		t.Fatalf("ReadFile before: %q, %v", b, err)
	}
	if _, err := sb.Execute(ctx, Command{Args: []string{"write", "a.txt", "pending\n"}}); err != nil {
		t.Fatal(err)
	}
	slow := startGated(sb, g, "b.txt", "b\n")
	b, err := sb.ReadFile(ctx, "a.txt")
	close(g.release)
	if o := <-slow; o.err != nil {
		t.Fatal(o.err)
	}
	if err != nil || string(b) != "pending\n" {
		t.Fatalf("ReadFile while a command runs: %q, %v; want the pending version", b, err)
	}
}
