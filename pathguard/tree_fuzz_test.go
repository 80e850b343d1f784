//go:build unix

package pathguard

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzCheckLinkTarget creates every link the rule accepts in a real
// workspace and checks that the kernel, following it, stays inside the
// root and out of the reserved directory; every refusal must wrap
// ErrLinkTarget.
func FuzzCheckLinkTarget(f *testing.F) {
	root, err := filepath.EvalSymlinks(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	dirs := []string{"", "a", "a/b", "a/b/c"}
	for _, d := range append(dirs, ReservedDir) {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for _, s := range []string{"x", "..", "../..", "../../..", "b/c", "../a/../..", ".pulse", "./.PULSE/x",
		"c/../..", "/etc", `..\x`, "C:x", "l/l", ".", "a/./b/", strings.Repeat("../", 5)} {
		f.Add(uint8(3), s)
	}
	f.Fuzz(func(t *testing.T, at uint8, target string) {
		rel := path.Join(dirs[int(at)%len(dirs)], "l")
		err := CheckLinkTarget(rel, target)
		if err != nil {
			if !errors.Is(err, ErrLinkTarget) {
				t.Fatalf("CheckLinkTarget(%q, %q) = %v, not ErrLinkTarget", rel, target, err)
			}
			return
		}
		if j := path.Join(path.Dir(rel), target); j == ".." || strings.HasPrefix(j, "../") || IsReserved(j) {
			t.Fatalf("CheckLinkTarget(%q, %q) accepted a target that reads as %q", rel, target, j)
		}
		link := filepath.Join(root, filepath.FromSlash(rel))
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			return // a name the file system refuses (too long, say)
		}
		defer os.Remove(link)
		phys, err := filepath.EvalSymlinks(link)
		if err != nil {
			return // dangling or a loop through itself: leads nowhere
		}
		if !within(phys, root) {
			t.Fatalf("%s -> %q resolves to %q, outside %q", rel, target, phys, root)
		}
		if r := relTo(root, phys); IsReserved(r) {
			t.Fatalf("%s -> %q resolves into %s", rel, target, r)
		}
	})
}

// FuzzIsReserved checks the reserved-name rule on arbitrary input: any
// spelling whose first clean element is the reserved name in some ASCII
// case is reserved, and so is everything beneath a reserved path.
func FuzzIsReserved(f *testing.F) {
	for _, s := range []string{".pulse", "./.Pulse/x", "a/../.PULSE", "/.pulse", ".pulsex", "a/.pulse", "", "..", `.pulse\x`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got := IsReserved(p)
		first, _, _ := strings.Cut(strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(p)), "/"), "/")
		if strings.ToLower(first) == ReservedDir && !got {
			t.Fatalf("IsReserved(%q) = false, first element %q", p, first)
		}
		if got && !IsReserved(p+"/x") {
			t.Fatalf("IsReserved(%q) but not beneath it", p)
		}
		if got && !IsReserved(strings.ToUpper(p)) && !IsReserved(strings.ToLower(p)) {
			t.Fatalf("IsReserved(%q) depends on case", p)
		}
	})
}
