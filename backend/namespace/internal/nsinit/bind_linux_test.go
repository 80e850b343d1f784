package nsinit

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenBindSourceRefusesTheWorkspace: a bind source that was a plain
// directory when the backend checked it, swapped for a symlink to the
// workspace (or to a directory holding it, or inside it) before the init
// mounts it, is refused by what the init opens, which is what it mounts.
// A real directory beside the workspace, or a symlink to one, is bound.
func TestOpenBindSourceRefusesTheWorkspace(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(root, "work", "ws")
	data := filepath.Join(root, "data")
	for _, d := range []string{filepath.Join(ws, "sub"), filepath.Join(data, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(data, "sub")
	f, err := openBindSource(src, ws)
	if err != nil {
		t.Fatalf("a plain directory: %v", err)
	}
	f.Close()
	for _, target := range []string{ws, filepath.Join(root, "work"), filepath.Join(ws, "sub"), "../work/ws"} {
		if err := os.Remove(src); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if err := os.Symlink(target, src); err != nil {
			t.Fatal(err)
		}
		if f, err := openBindSource(src, ws); !errors.Is(err, errBindOverlap) {
			if f != nil {
				f.Close()
			}
			t.Errorf("source swapped for a symlink to %s: %v, want errBindOverlap", target, err)
		}
	}
	os.Remove(src)
	other := filepath.Join(root, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, src); err != nil {
		t.Fatal(err)
	}
	f, err = openBindSource(src, ws)
	if err != nil {
		t.Fatalf("a symlink to a directory beside the workspace: %v", err)
	}
	f.Close()
	if _, err := openBindSource(filepath.Join(root, "missing"), ws); err == nil || errors.Is(err, errBindOverlap) {
		t.Errorf("a missing source: %v", err)
	}
}
