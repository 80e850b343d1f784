package cowfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestUnstageCommitsTheRest(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "keep.txt"), []byte("old\n"), 0o644)
	f, err := Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tx, err := f.Begin(t.Context(), "mixed")
	if err != nil {
		t.Fatal(err)
	}
	for p, data := range map[string]string{"keep.txt": "new\n", "dir/sub/rejected.txt": "no\n", "dir/sub/also.txt": "no\n", "other.txt": "x"} {
		if err := tx.Write(t.Context(), p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum := sha256.Sum256([]byte("new\n"))
	if got := tx.ContentHashes()["keep.txt"]; got != hex.EncodeToString(sum[:]) {
		t.Fatalf("content hash %s", got)
	}
	if _, err := tx.Unstage(t.Context(), "missing.txt"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unstage of a path not staged: %v", err)
	}
	before := tx.Changes()
	u, err := tx.Unstage(t.Context(), "dir/sub/rejected.txt", "dir/sub/also.txt", "other.txt")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"dir", "dir/sub", "dir/sub/also.txt", "dir/sub/rejected.txt", "other.txt"}; !reflect.DeepEqual(u.Paths, want) {
		t.Fatalf("unstaged %q, want %q", u.Paths, want)
	}
	// Restage puts them back as they were; unstage again for the commit.
	if err := tx.Restage(t.Context(), u); err != nil {
		t.Fatal(err)
	}
	if after := tx.Changes(); !reflect.DeepEqual(after, before) {
		t.Fatalf("restaged %+v, want %+v", after, before)
	}
	if u, err = tx.Unstage(t.Context(), "dir/sub/rejected.txt", "dir/sub/also.txt", "other.txt"); err != nil || len(u.Paths) != 5 {
		t.Fatalf("%+v %v", u, err)
	}
	// Another process sees the same transaction.
	f2, err := Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	tx2, err := f2.Tx(t.Context(), tx.ID())
	if err != nil {
		t.Fatal(err)
	}
	paths, err := tx2.Commit(context.Background())
	if err != nil || !reflect.DeepEqual(paths, []string{"keep.txt"}) {
		t.Fatalf("commit: %q %v", paths, err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "keep.txt")); string(b) != "new\n" {
		t.Fatalf("keep.txt: %q", b)
	}
	for _, p := range []string{"dir", "other.txt"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s landed: %v", p, err)
		}
	}
}

func TestUnstageTakesADeletedAncestorAlong(t *testing.T) {
	ws := t.TempDir()
	os.MkdirAll(filepath.Join(ws, "d"), 0o755)
	os.WriteFile(filepath.Join(ws, "d", "f"), []byte("x"), 0o644)
	f, err := Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tx, _ := f.Begin(t.Context(), "rm")
	if err := tx.Delete(t.Context(), "d"); err != nil {
		t.Fatal(err)
	}
	u, err := tx.Unstage(t.Context(), "d/f")
	if err != nil || !reflect.DeepEqual(u.Paths, []string{"d", "d/f"}) {
		t.Fatalf("%q %v", u.Paths, err)
	}
	if n := len(tx.Changes()); n != 0 {
		t.Fatalf("%d changes left", n)
	}
}
