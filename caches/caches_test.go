package caches

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRoot(t *testing.T) {
	if r, err := Root(func(k string) string { return map[string]string{DirEnv: "/x/y/"}[k] }); err != nil || r != "/x/y" {
		t.Errorf("Root with %s = %q, %v", DirEnv, r, err)
	}
	if _, err := Root(func(k string) string { return map[string]string{DirEnv: "rel"}[k] }); err == nil {
		t.Error("a relative root was accepted")
	}
}

func TestEnsureRefusesWhatIsNotAPlainDirectory(t *testing.T) {
	root := t.TempDir()
	if _, err := Ensure(root, "../up"); err == nil {
		t.Error("Ensure accepted ../up")
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(root, "link"); err == nil {
		t.Error("Ensure accepted a symlink: a command would write where it points")
	}
	d, err := Ensure(root, "ok")
	if err != nil || d != filepath.Join(root, "ok") {
		t.Fatalf("Ensure = %q, %v", d, err)
	}
}

func TestTrimOldestFirstAndPrune(t *testing.T) {
	root := t.TempDir()
	dir, err := Ensure(root, "c")
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"a", "sub/b", "c"} {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, make([]byte, 100), 0o644); err != nil {
			t.Fatal(err)
		}
		ts := time.Unix(int64(1000+i), 0)
		os.Chtimes(p, ts, ts)
	}
	// A read-only directory, as Go's module cache leaves them.
	os.Chmod(filepath.Join(dir, "sub"), 0o555)
	before, removed, err := Trim(dir, 150)
	if err != nil || before != 300 || removed != 2 {
		t.Fatalf("Trim = %d, %d, %v", before, removed, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "c")); err != nil {
		t.Errorf("the newest file was removed: %v", err)
	}
	in, err := Stat(root, "c")
	if err != nil || in.Bytes != 100 || in.Files != 1 {
		t.Errorf("Stat = %+v, %v", in, err)
	}
	if _, removed, _ := Trim(dir, 0); removed != 0 {
		t.Error("Trim without a cap removed files")
	}
	os.Chmod(filepath.Join(dir, "sub"), 0o555)
	if err := Prune(root, "c"); err != nil {
		t.Fatal(err)
	}
	if err := Prune(root, "c"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Prune of a pruned cache = %v, want ErrNotFound", err)
	}
	if list, err := List(root); err != nil || len(list) != 0 {
		t.Errorf("List = %+v, %v", list, err)
	}
}

// A cache is writable by commands, and one may still run while another's
// trim does (two commands of one sandbox, or of two sandboxes sharing the
// cache root): between the walk and the removals it can turn a directory
// the walk saw into a link out of the cache. The trim must not remove the
// file of the same name where the link leads, absolute or relative.
func TestTrimDoesNotFollowALinkSwappedInAfterTheWalk(t *testing.T) {
	for _, relative := range []bool{false, true} {
		dir, err := Ensure(t.TempDir(), "c")
		if err != nil {
			t.Fatal(err)
		}
		outside := t.TempDir()
		victim := filepath.Join(outside, "f")
		if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, name := range []string{"d/f", "new"} {
			p := filepath.Join(dir, name)
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.WriteFile(p, make([]byte, 100), 0o644); err != nil {
				t.Fatal(err)
			}
			ts := time.Unix(int64(1000+i), 0)
			os.Chtimes(p, ts, ts)
		}
		target := outside
		if relative {
			if target, err = filepath.Rel(dir, outside); err != nil {
				t.Fatal(err)
			}
		}
		afterWalk = func() {
			d := filepath.Join(dir, "d")
			if err := os.Rename(d, d+".real"); err != nil {
				t.Error(err)
			}
			if err := os.Symlink(target, d); err != nil {
				t.Error(err)
			}
		}
		_, _, err = Trim(dir, 150)
		afterWalk = nil
		if b, rerr := os.ReadFile(victim); rerr != nil || string(b) != "precious" {
			t.Fatalf("relative=%v: the trim went through the link out of the cache: %s: %q, %v (Trim: %v)", relative, victim, b, rerr, err)
		}
		if err == nil {
			t.Errorf("relative=%v: Trim reported no error, though the file it meant to remove could not be", relative)
		}
	}
}
