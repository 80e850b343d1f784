package sandbox

import (
	"errors"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzWorkspaceRel: whatever path a caller of the files API names (an
// agent's tool call), workspaceRel either refuses it with
// ErrInvalidCommand or returns a clean, relative, slash-separated path
// that stays inside the workspace when joined to it.
func FuzzWorkspaceRel(f *testing.F) {
	for _, s := range []string{"a.txt", "dir/../b", "../x", "/ws/in", "/ws/../etc/passwd", "/etc/passwd", "./", ".",
		"a/../../b", "a//b/", "\x00", "a\x00b", "/ws", "/ws/", "..", "....", "a/..", "/ws/a/../../ws/b", `a\..\..\b`} {
		f.Add(s)
	}
	s := &Sandbox{workspace: "/ws"}
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := s.workspaceRel(p)
		if err != nil {
			if !errors.Is(err, ErrInvalidCommand) {
				t.Fatalf("%q: error %v is not ErrInvalidCommand", p, err)
			}
			return
		}
		if rel == "" || rel == "." || path.IsAbs(rel) || path.Clean(rel) != rel || rel == ".." ||
			strings.HasPrefix(rel, "../") || strings.ContainsRune(rel, 0) {
			t.Fatalf("%q gave %q", p, rel)
		}
		joined := filepath.Join("/ws", filepath.FromSlash(rel))
		if !strings.HasPrefix(joined, "/ws/") {
			t.Fatalf("%q gave %q, which joins to %q", p, rel, joined)
		}
	})
}
