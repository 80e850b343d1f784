package cowfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/internal/flock"
)

// TestLockWaitHonoursContext: every operation that waits for the
// workspace lock gives up with ctx's error when ctx ends, whether the
// lock is held by another process (another open file description of the
// lock file stands in for it) or by another goroutine of this one, and it
// changes nothing. Without it a cancelled command could hang behind a
// stopped process for ever.
func TestLockWaitHonoursContext(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "old.txt", "old\n", 0o644)
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "held")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(t.Context(), "a.txt", []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := tx.Unstage(t.Context(), "a.txt")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Restage(t.Context(), u); err != nil {
		t.Fatal(err)
	}
	ops := []struct {
		name string
		op   func(ctx context.Context) error
	}{
		{"Open", func(ctx context.Context) error {
			g, err := Open(ctx, ws)
			if err == nil {
				g.Close()
			}
			return err
		}},
		{"Begin", func(ctx context.Context) error { _, err := f.Begin(ctx, "x"); return err }},
		{"Tx", func(ctx context.Context) error { _, err := f.Tx(ctx, tx.ID()); return err }},
		{"List", func(ctx context.Context) error { _, err := f.List(ctx); return err }},
		{"Stack", func(ctx context.Context) error { _, err := f.Stack(ctx); return err }},
		{"Write", func(ctx context.Context) error { return tx.Write(ctx, "b.txt", []byte("b\n"), 0o644) }},
		{"Mkdir", func(ctx context.Context) error { return tx.Mkdir(ctx, "d", 0o755) }},
		{"Symlink", func(ctx context.Context) error { return tx.Symlink(ctx, "a.txt", "l") }},
		{"Delete", func(ctx context.Context) error { return tx.Delete(ctx, "old.txt") }},
		{"Stage", func(ctx context.Context) error {
			_, err := tx.Stage(ctx, []Op{WriteOp("c.txt", []byte("c\n"), 0o644)})
			return err
		}},
		{"Unstage", func(ctx context.Context) error { _, err := tx.Unstage(ctx, "a.txt"); return err }},
		{"Restage", func(ctx context.Context) error { return tx.Restage(ctx, u) }},
		{"Refresh", func(ctx context.Context) error { return tx.Refresh(ctx) }},
		{"Diff", func(ctx context.Context) error { _, err := tx.Diff(ctx); return err }},
		{"Discard", func(ctx context.Context) error { return tx.Discard(ctx) }},
		{"Commit", func(ctx context.Context) error { _, err := tx.Commit(ctx); return err }},
		{"Undo", func(ctx context.Context) error { _, err := f.Undo(ctx); return err }},
	}
	holders := []struct {
		name string
		hold func(t *testing.T) (release func())
	}{
		{"another process", func(t *testing.T) func() {
			lf, err := os.OpenFile(filepath.Join(ws, StateDir, "lock"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := flock.TryLock(lf); err != nil {
				t.Fatal(err)
			}
			return func() { lf.Close() }
		}},
		{"this process", func(t *testing.T) func() {
			unlock, err := f.lock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return unlock
		}},
	}
	for _, h := range holders {
		for _, o := range ops {
			if h.name == "this process" && o.name == "Open" {
				continue // Open makes a new FS: only the flock can hold it up
			}
			t.Run(h.name+"/"+o.name, func(t *testing.T) {
				release := h.hold(t)
				defer release()
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- o.op(ctx) }()
				cancel()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Fatalf("%s with the lock held and ctx cancelled = %v, want context.Canceled", o.name, err)
				}
			})
		}
	}
	// Nothing the cancelled calls were asked for happened.
	got, err := f.Tx(t.Context(), tx.ID())
	if err != nil {
		t.Fatal(err)
	}
	if ch := got.Changes(); len(ch) != 1 || ch[0].Path != "a.txt" {
		t.Fatalf("changes after the cancelled calls: %+v, want only a.txt", ch)
	}
	if infos, err := f.List(t.Context()); err != nil || len(infos) != 1 {
		t.Fatalf("List = %+v, %v; want the one transaction", infos, err)
	}
}
