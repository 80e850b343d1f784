//go:build linux

package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/flock"
)

// TestReconcileRemovesLeftovers: the mounts and directory of an
// execution whose process died (its lock free) are removed; those of a
// live one (its lock held) are left alone.
func TestReconcileRemovesLeftovers(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, hold bool) string {
		xdir := filepath.Join(b.o.stateDir, execPrefix+name)
		if err := os.MkdirAll(xdir, 0o700); err != nil {
			t.Fatal(err)
		}
		lf, err := os.Create(filepath.Join(xdir, lockName))
		if err != nil {
			t.Fatal(err)
		}
		if hold {
			if err := flock.TryLock(lf); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				teardown(xdir)
				lf.Close()
				os.RemoveAll(xdir)
			})
		} else {
			lf.Close()
		}
		if _, err := mountView(xdir, "", &backend.Request{Workspace: ws}, 1<<20); err != nil {
			t.Fatal(err)
		}
		return xdir
	}
	dead, live := mk("dead", false), mk("live", true)
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead execution's directory is still there: %v", err)
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), dead+"/") {
		t.Errorf("mounts of the dead execution are left:\n%s", mounts)
	}
	if _, err := os.Stat(filepath.Join(live, "merged", "f")); err != nil {
		t.Errorf("the live execution's view was touched: %v", err)
	}
}
