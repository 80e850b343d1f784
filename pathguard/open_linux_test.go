//go:build linux

package pathguard

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
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

// TestOpenWalkRefusesSymlinks: the fallback open refuses a symlink at any
// element, leading out of the base or staying inside it, as openat2 with
// RESOLVE_NO_SYMLINKS does, and never follows one out.
func TestOpenWalkRefusesSymlinks(t *testing.T) {
	base, outside := t.TempDir(), t.TempDir()
	mustWrite := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(filepath.Join(base, "sub", "deep", "b.txt"), "inside")
	mustWrite(filepath.Join(outside, "deep", "b.txt"), "secret")
	for _, l := range []struct{ name, target string }{
		{"out", outside},                         // a directory outside
		{"in", filepath.Join(base, "sub")},       // a directory inside
		{"rel", "sub"},                           // relative, inside
		{"filelink", filepath.Join(base, "sub")}, // used as the last element below
	} {
		if err := os.Symlink(l.target, filepath.Join(base, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	f, err := openWalk(base, "sub/deep/b.txt")
	if err != nil {
		t.Fatalf("openWalk of a plain path: %v", err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "inside" {
		t.Fatalf("read %q", b)
	}
	for rel, want := range map[string]error{
		"out/deep/b.txt": errSymlink,
		"in/deep/b.txt":  errSymlink,
		"rel/deep/b.txt": errSymlink,
		"filelink":       errSymlink,
		"../x":           errEscape,
		"sub/../../x":    errEscape,
		"/etc/passwd":    errEscape,
	} {
		f, err := openWalk(base, rel)
		if f != nil {
			f.Close()
		}
		if !errors.Is(err, want) {
			t.Errorf("openWalk(%q) = %v, want %v", rel, err, want)
		}
	}
	if _, err := openWalk(base, "sub/deep/missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("openWalk of a missing file = %v, want not-exist", err)
	}
	if _, err := openWalk(base, "sub/deep/b.txt/x"); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("openWalk through a file = %v, want ENOTDIR", err)
	}
}
