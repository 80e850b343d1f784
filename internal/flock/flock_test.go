//go:build unix

package flock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// open opens path anew: flock locks belong to the open file description,
// so two opens in one process contend like two processes do.
func open(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestLockExcludesAndReleases(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	a, b := open(t, p), open(t, p)
	if err := Lock(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if err := TryLock(b); !errors.Is(err, ErrLocked) || !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("TryLock of a held lock = %v, want ErrLocked", err)
	}
	got := make(chan error, 1)
	go func() { got <- Lock(t.Context(), b) }()
	select {
	case err := <-got:
		t.Fatalf("Lock returned %v while the lock was held", err)
	case <-time.After(20 * time.Millisecond):
	}
	if err := Unlock(a); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Lock after release = %v", err)
	}
	if err := TryLock(a); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock while b holds = %v, want ErrLocked", err)
	}
}

// TestLockHonoursContext: a wait for a held lock ends with ctx's error
// once ctx ends, both for a cancel and a deadline, exclusive and shared.
func TestLockHonoursContext(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	holder := open(t, p)
	if err := Lock(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		lock func(context.Context, *os.File) error
	}{{"exclusive", Lock}, {"shared", LockShared}} {
		t.Run(c.name+"/cancel", func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			got := make(chan error, 1)
			go func() { got <- c.lock(ctx, open(t, p)) }()
			cancel()
			if err := <-got; !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
		})
		t.Run(c.name+"/deadline", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
			defer cancel()
			if err := c.lock(ctx, open(t, p)); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want context.DeadlineExceeded", err)
			}
		})
	}
}

// TestDoneContextStillTakesAFreeLock: a cancelled caller is refused a wait,
// not a lock that is free.
func TestDoneContextStillTakesAFreeLock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	a := open(t, p)
	if err := Lock(ctx, a); err != nil {
		t.Fatalf("Lock of a free lock with a done ctx = %v", err)
	}
	if err := TryLock(open(t, p)); !errors.Is(err, ErrLocked) {
		t.Fatalf("the lock was not taken: %v", err)
	}
}

func TestSharedLocksShare(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	a, b := open(t, p), open(t, p)
	if err := LockShared(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := LockShared(ctx, b); err != nil {
		t.Fatalf("a second shared lock = %v", err)
	}
	if err := TryLock(open(t, p)); !errors.Is(err, ErrLocked) {
		t.Fatalf("an exclusive lock beside shared ones = %v, want ErrLocked", err)
	}
}

// TestBackgroundWaitsInKernel: with a context that cannot end, Lock blocks
// in flock(2) and returns once the holder lets go.
func TestBackgroundWaitsInKernel(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	a, b := open(t, p), open(t, p)
	if err := TryLock(a); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- Lock(context.Background(), b) }()
	time.Sleep(10 * time.Millisecond)
	a.Close()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestTryLockShared: shared holders coexist, an exclusive holder keeps a
// shared one out (ErrLocked), and a shared holder keeps an exclusive one
// out.
func TestTryLockShared(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	a, b, c := open(t, p), open(t, p), open(t, p)
	if err := TryLockShared(a); err != nil {
		t.Fatal(err)
	}
	if err := TryLockShared(b); err != nil {
		t.Fatalf("second shared lock = %v", err)
	}
	if err := TryLock(c); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock beside shared holders = %v, want ErrLocked", err)
	}
	for _, f := range []*os.File{a, b} {
		if err := Unlock(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := TryLock(c); err != nil {
		t.Fatalf("TryLock once the shared holders left = %v", err)
	}
	if err := TryLockShared(a); !errors.Is(err, ErrLocked) || !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("TryLockShared beside an exclusive holder = %v, want ErrLocked", err)
	}
}
