//go:build unix

package pathguard

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzResolve checks that no input yields a path outside the root, that
// every refusal wraps ErrOutside, and that nothing panics. The workspace
// holds symlinks of every kind (inside, outside, relative, absolute,
// through /proc, loops) for inputs to wander through.
func FuzzResolve(f *testing.F) {
	top := f.TempDir()
	root, outside := filepath.Join(top, "root"), filepath.Join(top, "outside")
	for _, d := range []string{filepath.Join(root, "a", "b"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	links := map[string]string{
		"in":        "a/b",
		"abs-in":    filepath.Join(root, "a"),
		"out":       outside,
		"rel-out":   "../outside",
		"a/up":      "..",
		"a/up2":     "../..",
		"a/b/self":  ".",
		"proc":      "/proc/self/cwd",
		"loop":      "loop",
		"slash":     "/",
		"a/b/chain": "../../in",
	}
	for l, target := range links {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			f.Fatal(err)
		}
	}
	g, err := New(root)
	if err != nil {
		f.Fatal(err)
	}
	real := g.Root()
	for _, s := range []string{"a", "in/x", "abs-in/b", "out/x", "rel-out", "a/up/in", "a/up2/x",
		"a/b/self/self/x", "proc/etc", "loop", "slash/etc", "a/b/chain/y", "../x", "/etc",
		root + "/a", real + "/../outside", "a\x00", "./././a//b/", strings.Repeat("a/", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := g.Resolve(p)
		if err != nil {
			if !errors.Is(err, ErrOutside) {
				t.Fatalf("Resolve(%q) error does not wrap ErrOutside: %v", p, err)
			}
			if got != "" {
				t.Fatalf("Resolve(%q) returned %q with an error", p, got)
			}
			if strings.Contains(err.Error(), outside) && !strings.Contains(p, outside) {
				t.Fatalf("error leaks the outside path: %v", err)
			}
			return
		}
		if got != filepath.Clean(got) || !within(got, real) {
			t.Fatalf("Resolve(%q) = %q, outside %q", p, got, real)
		}
		// Whatever part of the result exists must, with every symlink
		// followed by the kernel, still be inside the root.
		existing := got
		for {
			if _, err := os.Lstat(existing); err == nil {
				break
			}
			existing = filepath.Dir(existing)
		}
		phys, err := filepath.EvalSymlinks(existing)
		if err == nil && !within(phys, real) {
			t.Fatalf("Resolve(%q) = %q, which the kernel resolves to %q", p, got, phys)
		}
	})
}
