//go:build unix

package pathguard

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestCheckLinkTarget(t *testing.T) {
	for _, c := range []struct {
		rel, target string
		ok          bool
	}{
		{"link", "a.txt", true},
		{"bin/link", "../mod.txt", true},
		{"a/b/l", "../..", true}, // the workspace root itself
		{"a/b/l", "../../c/d", true},
		{"l", ".", true},
		{"l", "./x", true},
		{"l", "x/./y//z/", true},
		{"a/l", "./../x", true},
		{"l", "sub/.pulsed", true},
		{"l", "ab:c", true}, // a name with a colon, not a drive
		{"l", "1:x", true},
		{"a/b/l", "../../..", false},
		{"sub/link", "../../outside", false},
		{"l", "/etc/passwd", false},
		{"l", "", false},
		{"l", "a\x00b", false},
		{"l", `..\..\etc`, false},
		{"l", "C:/Windows", false},
		{"l", "c:", false},
		// ".." after a name climbs out of whatever the name links to.
		{"esc", "a/b/l/../outside.txt", false},
		{"l", "x/..", false},
		{"a/l", "../x/../y", false},
		{"l", "x/./../y", false},
		{"l", "d0/d1/../../etc", false},
		// .pulse anywhere, in any case: a link above can make a nested
		// one the real one.
		{"l", ".pulse", false},
		{"sub/link", "../.PULSE/cow", false},
		{"l", "up/.pulse/cow/lock", false},
		{"l", "up/.Pulse", false},
	} {
		err := CheckLinkTarget(c.rel, c.target)
		if c.ok && err != nil {
			t.Errorf("CheckLinkTarget(%q, %q) = %v, want nil", c.rel, c.target, err)
		}
		if !c.ok && !errors.Is(err, ErrLinkTarget) {
			t.Errorf("CheckLinkTarget(%q, %q) = %v, want ErrLinkTarget", c.rel, c.target, err)
		}
	}
}

// walked runs WalkWorkspace over root and returns the relative paths fn
// saw, in order, checking that abs is always root joined with rel.
func walked(t *testing.T, root string, skip map[string]bool) []string {
	t.Helper()
	var got []string
	err := WalkWorkspace(root, func(rel, abs string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if abs != filepath.Join(root, filepath.FromSlash(rel)) {
			t.Errorf("abs %q for rel %q", abs, rel)
		}
		got = append(got, rel)
		if skip[rel] {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestWalkWorkspaceSkipsReserved(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{".pulse/cow", ".Pulse-not/x", "a/.pulse", "b/c", "skip/me"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(root, ".pulse", "cow", "lock"), "")
	write(t, filepath.Join(root, "a", ".pulse", "kept"), "")
	write(t, filepath.Join(root, "b", "c", "f"), "")
	write(t, filepath.Join(root, "skip", "me", "f"), "")
	// A case spelling of the reserved name is the reserved directory on a
	// case-insensitive file system: skipped everywhere.
	write(t, filepath.Join(root, ".PULSE"), "")
	// A link named .pulse is skipped too, and never followed.
	out := t.TempDir()
	write(t, filepath.Join(out, "secret"), "")
	symlink(t, out, filepath.Join(root, ".pUlse"))
	got := walked(t, root, map[string]bool{"skip": true})
	want := []string{".Pulse-not", ".Pulse-not/x", "a", "a/.pulse", "a/.pulse/kept", "b", "b/c", "b/c/f", "skip"}
	if !slices.Equal(got, want) {
		t.Errorf("walked\n %q\nwant\n %q", got, want)
	}
}

func TestWalkWorkspaceRoot(t *testing.T) {
	root := t.TempDir()
	called := false
	fn := func(string, string, fs.DirEntry, error) error { called = true; return nil }
	if err := WalkWorkspace(filepath.Join(root, "missing"), fn); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("walk of a missing root = %v, want fs.ErrNotExist", err)
	}
	if err := WalkWorkspace(root, fn); err != nil || called {
		t.Errorf("walk of an empty root = %v, fn called %v; want nil, false", err, called)
	}
	// fn's error ends the walk and is returned.
	write(t, filepath.Join(root, "f"), "")
	stop := errors.New("stop")
	if err := WalkWorkspace(root, func(string, string, fs.DirEntry, error) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("walk = %v, want fn's error", err)
	}
	// An unreadable subdirectory reaches fn with its error (as
	// filepath.WalkDir gives it), so fn decides.
	if os.Geteuid() == 0 {
		return // root reads every directory
	}
	if err := os.Mkdir(filepath.Join(root, "locked"), 0o000); err != nil {
		t.Fatal(err)
	}
	var errAt []string
	_ = WalkWorkspace(root, func(rel, _ string, _ fs.DirEntry, err error) error {
		if err != nil {
			errAt = append(errAt, rel)
		}
		return nil
	})
	if !slices.Equal(errAt, []string{"locked"}) {
		t.Errorf("errors at %q, want [locked]", errAt)
	}
}

func TestIsWorkspacePath(t *testing.T) {
	for p, want := range map[string]bool{
		"a": true, "a/b": true, "a/.pulse": true, `a\b`: true, ".pulsed/x": true, "...": true,
		"": false, ".": false, "..": false, "../a": false, "/a": false, "a/": false, "a//b": false,
		"./a": false, "a/../b": false, "a\x00": false, ".pulse": false, ".PULSE/x": false,
	} {
		if got := IsWorkspacePath(p); got != want {
			t.Errorf("IsWorkspacePath(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestTopmost(t *testing.T) {
	for _, c := range []struct {
		in, want []string
	}{
		{nil, nil},
		{[]string{"b", "a"}, []string{"a", "b"}},
		{[]string{"a/b/c", "a", "a/b"}, []string{"a"}},
		// "a.b" sorts between "a" and "a/b": a walk of the sorted list that
		// looks only at the last path kept would keep "a/b".
		{[]string{"a/b", "a.b", "a"}, []string{"a", "a.b"}},
		{[]string{"ab/c", "a"}, []string{"a", "ab/c"}},
		{[]string{"x/y", "x/y", "z"}, []string{"x/y", "z"}},
	} {
		if got := Topmost(c.in); !slices.Equal(got, c.want) {
			t.Errorf("Topmost(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
