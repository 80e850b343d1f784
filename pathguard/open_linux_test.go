//go:build linux

package pathguard

import (
	"path/filepath"
	"testing"
)

// TestOpenFallback runs the read tests again on the os.Root path that is
// used where openat2(2) is missing, so both ways of opening are proven.
func TestOpenFallback(t *testing.T) {
	prev := openat2State.Load()
	openat2State.Store(openat2Missing)
	defer openat2State.Store(prev)
	t.Run("ReadFile", TestReadFile)
	t.Run("FIFO", TestOpenFIFODoesNotBlock)
	t.Run("SwapRace", TestSymlinkSwapRace)
	t.Run("ExternalReads", TestExternalReads)
}

// TestOpenat2Used checks that the fast path is taken where the kernel has
// it, so that TestReadFile and the race tests exercise it.
func TestOpenat2Used(t *testing.T) {
	root, _ := workspace(t)
	g := newGuard(t, root)
	if _, err := g.ReadFile(filepath.Join("sub", "deep", "b.txt")); err != nil {
		t.Fatal(err)
	}
	if openat2State.Load() == openat2Missing {
		t.Skip("kernel or seccomp filter lacks openat2; only the os.Root path is tested")
	}
	f, err := openBeneath(g.Root(), "sub/deep/b.txt")
	if err != nil {
		t.Fatalf("openBeneath: %v", err)
	}
	f.Close()
	if _, err := openBeneath(g.Root(), "../outside/secret"); err != errEscape {
		t.Errorf("openBeneath(..) = %v, want errEscape", err)
	}
}
