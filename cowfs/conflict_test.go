package cowfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConflictReasons(t *testing.T) {
	cases := []struct {
		name   string
		stage  func(tx *Tx) error
		mutate func(t *testing.T, ws string)
		path   string
		reason string
	}{
		{
			name:  "created",
			stage: func(tx *Tx) error { return tx.Write(t.Context(), "new.txt", []byte("mine\n"), 0) },
			mutate: func(t *testing.T, ws string) {
				writeFile(t, ws, "new.txt", "theirs\n", 0o644)
			},
			path: "new.txt", reason: ReasonCreated,
		},
		{
			name:  "deleted",
			stage: func(tx *Tx) error { return tx.Write(t.Context(), "a.txt", []byte("mine\n"), 0) },
			mutate: func(t *testing.T, ws string) {
				if err := os.Remove(filepath.Join(ws, "a.txt")); err != nil {
					t.Fatal(err)
				}
			},
			path: "a.txt", reason: ReasonDeleted,
		},
		{
			name:  "replaced by another file",
			stage: func(tx *Tx) error { return tx.Delete(t.Context(), "a.txt") },
			mutate: func(t *testing.T, ws string) {
				// Same bytes, new inode: an editor's save-by-rename.
				writeFile(t, ws, "tmp", "original\n", 0o644)
				if err := os.Rename(filepath.Join(ws, "tmp"), filepath.Join(ws, "a.txt")); err != nil {
					t.Fatal(err)
				}
			},
			path: "a.txt", reason: ReasonReplaced,
		},
		{
			name:  "modified with same size and mtime",
			stage: func(tx *Tx) error { return tx.Write(t.Context(), "a.txt", []byte("mine\n"), 0) },
			mutate: func(t *testing.T, ws string) {
				p := filepath.Join(ws, "a.txt")
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				f, err := os.OpenFile(p, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt([]byte("ORIGINAL\n"), 0); err != nil {
					t.Fatal(err)
				}
				f.Close()
				// Put the mtime back: only the hash can tell now.
				if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
					t.Fatal(err)
				}
			},
			path: "a.txt", reason: ReasonModified,
		},
		{
			name:  "mode changed",
			stage: func(tx *Tx) error { return tx.Write(t.Context(), "a.txt", []byte("mine\n"), 0) },
			mutate: func(t *testing.T, ws string) {
				if err := os.Chmod(filepath.Join(ws, "a.txt"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			path: "a.txt", reason: ReasonModified,
		},
		{
			name:  "symlink swapped in for the staged path",
			stage: func(tx *Tx) error { return tx.Write(t.Context(), "a.txt", []byte("mine\n"), 0) },
			mutate: func(t *testing.T, ws string) {
				p := filepath.Join(ws, "a.txt")
				if err := os.Rename(p, filepath.Join(ws, "moved.txt")); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("moved.txt", p); err != nil {
					t.Fatal(err)
				}
			},
			path: "a.txt", reason: ReasonReplaced,
		},
		{
			name:  "parent directory swapped for a symlink",
			stage: func(tx *Tx) error { return tx.Write(t.Context(), "d/x.txt", []byte("mine\n"), 0) },
			mutate: func(t *testing.T, ws string) {
				if err := os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, "e")); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("e", filepath.Join(ws, "d")); err != nil {
					t.Fatal(err)
				}
			},
			path: "d", reason: ReasonReplaced,
		},
		{
			name:  "file appears in a directory staged for deletion",
			stage: func(tx *Tx) error { return tx.Delete(t.Context(), "d") },
			mutate: func(t *testing.T, ws string) {
				writeFile(t, ws, "d/late.txt", "late\n", 0o644)
			},
			path: "d/late.txt", reason: ReasonCreated,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := newWS(t)
			writeFile(t, ws, "a.txt", "original\n", 0o644)
			writeFile(t, ws, "d/keep.txt", "keep\n", 0o644)
			f := openFS(t, ws)
			tx, err := f.Begin(t.Context(), tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.stage(tx); err != nil {
				t.Fatal(err)
			}
			tc.mutate(t, ws)
			before := snapshotTree(t, ws)
			_, err = tx.Commit(context.Background())
			if !errors.Is(err, ErrConflict) {
				t.Fatalf("commit: %v, want ErrConflict", err)
			}
			var ce *ConflictError
			if !errors.As(err, &ce) || ce.Path != tc.path || ce.Reason != tc.reason {
				t.Fatalf("conflict = %+v, want %s %s", ce, tc.path, tc.reason)
			}
			if after := snapshotTree(t, ws); !equalTrees(before, after) {
				t.Fatalf("a refused commit changed the workspace:\nbefore %v\nafter  %v", before, after)
			}
			// The transaction is kept for inspection.
			infos, err := f.List(t.Context())
			if err != nil || len(infos) != 1 || infos[0].ID != tx.ID() || infos[0].State != StateOpen {
				t.Fatalf("after conflict List = %+v, %v", infos, err)
			}
		})
	}
}

// snapshotTree maps every workspace path outside .pulse to its type and
// content, for before/after comparisons.
func snapshotTree(t *testing.T, ws string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(ws, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(ws, p)
		if rel == ".pulse" {
			return filepath.SkipDir
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out[rel] = "link:" + l
		case fi.IsDir():
			out[rel] = "dir:" + fi.Mode().Perm().String()
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fi.Mode().Perm().String() + ":" + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func equalTrees(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestUndoConflict(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "a.txt", "one\n", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "edit")
	if err := tx.Write(t.Context(), "a.txt", []byte("two\n"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	writeFile(t, ws, "a.txt", "three\n", 0o644)
	_, err := f.Undo(context.Background())
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Reason != ReasonModified || !errors.Is(err, ErrConflict) {
		t.Fatalf("undo over a changed file: %v", err)
	}
	if got := readFile(t, ws, "a.txt"); got != "three\n" {
		t.Fatalf("refused undo changed a.txt to %q", got)
	}
	// The refused undo left no transaction behind, and the entry is kept.
	infos, _ := f.List(t.Context())
	if len(infos) != 1 || infos[0].State != StateCommitted || infos[0].ID != tx.ID() {
		t.Fatalf("List after refused undo = %+v", infos)
	}
}

func TestInvalidPaths(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "bad paths")
	for _, p := range []string{"", ".", "../x", "a/../../x", ".pulse/cow/lock", ".PULSE/x", "/etc/passwd", "a\x00b"} {
		if err := tx.Write(t.Context(), p, []byte("x"), 0); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("Write(%q) = %v, want ErrInvalidPath", p, err)
		}
	}
	for _, target := range []string{"/etc/passwd", "../../outside", "../.pulse/cow/lock", "../.PULSE"} {
		if err := tx.Symlink(t.Context(), target, "sub/link"); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("Symlink(%q) = %v, want ErrInvalidPath", target, err)
		}
	}
	// An absolute path inside the workspace is accepted.
	if err := tx.Write(t.Context(), filepath.Join(f.Workspace(), "ok.txt"), []byte("x"), 0); err != nil {
		t.Fatalf("absolute path inside the workspace: %v", err)
	}
	writeFile(t, ws, "file", "x", 0o644)
	// Writing under a file stages the file's replacement by a directory,
	// which is what a command's overlay holding file/child means.
	if err := tx.Write(t.Context(), "file/child", []byte("x"), 0); err != nil {
		t.Errorf("write under a file: %v", err)
	}
	var sawFile bool
	for _, c := range tx.Changes() {
		if c.Path == "file" && c.Kind == KindMkdir && !c.New {
			sawFile = true
		}
	}
	if !sawFile {
		t.Errorf("file not staged for replacement: %+v", tx.Changes())
	}
	if err := tx.Delete(t.Context(), "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete of a missing path: %v", err)
	}
	if _, err := f.Tx(t.Context(), "../../etc"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Tx with a path as id: %v", err)
	}
}

func TestLimits(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws, WithMaxFileBytes(100), WithMaxStagedBytes(150), WithMaxOpenTransactions(2))
	a, _ := f.Begin(t.Context(), "a")
	b, err := f.Begin(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	var le *LimitError
	if _, err := f.Begin(t.Context(), "c"); !errors.As(err, &le) || le.Name != LimitOpenTx || le.Value != 2 || !errors.Is(err, ErrLimit) {
		t.Fatalf("third Begin: %v", err)
	}
	if err := a.Write(t.Context(), "big", make([]byte, 101), 0); !errors.As(err, &le) || le.Name != LimitFileBytes {
		t.Fatalf("oversize file: %v", err)
	}
	if err := a.Write(t.Context(), "x", make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Write(t.Context(), "y", make([]byte, 60), 0); !errors.As(err, &le) || le.Name != LimitStagedBytes {
		t.Fatalf("over total: %v", err)
	}
	// Rewriting a path counts only the difference.
	if err := a.Write(t.Context(), "x", make([]byte, 90), 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Write(t.Context(), "y", make([]byte, 60), 0); err != nil {
		t.Fatalf("after shrinking x: %v", err)
	}
	if err := a.Discard(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Write(t.Context(), "z", make([]byte, 80), 0); err != nil {
		t.Fatalf("after discard freed space: %v", err)
	}
	// A new FS counts the staged bytes from disk.
	f2 := openFS(t, ws, WithMaxStagedBytes(150))
	b2, _ := f2.Tx(t.Context(), b.ID())
	if err := b2.Write(t.Context(), "w", make([]byte, 20), 0); !errors.As(err, &le) || le.Name != LimitStagedBytes {
		t.Fatalf("reopened FS lost the count: %v", err)
	}
}

func TestTornStageLogIsCut(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "torn")
	if err := tx.Write(t.Context(), "a", []byte("a"), 0); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(ws, StateDir, "tx", tx.ID(), "stage.log")
	fl, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fl.Write([]byte{200, 0, 0, 0, 1, 2, 3, 4, '{'}) // a frame cut short
	fl.Close()
	f2 := openFS(t, ws)
	tx2, err := f2.Tx(t.Context(), tx.ID())
	if err != nil {
		t.Fatalf("torn tail: %v", err)
	}
	if err := tx2.Write(t.Context(), "b", []byte("b"), 0); err != nil {
		t.Fatal(err)
	}
	if n := len(tx2.Changes()); n != 2 {
		t.Fatalf("changes = %d, want 2", n)
	}
	if _, err := tx2.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "a")+readFile(t, ws, "b") != "ab" {
		t.Fatal("wrong content")
	}
}

func TestReplaceTypes(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "dir/one", "1", 0o644)
	writeFile(t, ws, "dir/sub/two", "2", 0o644)
	writeFile(t, ws, "file", "f", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "types")
	// A directory becomes a file, and a file becomes a directory.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tx.Delete(t.Context(), "dir"))
	must(tx.Write(t.Context(), "dir", []byte("now a file"), 0))
	must(tx.Delete(t.Context(), "file"))
	must(tx.Write(t.Context(), "file/inside", []byte("now a dir"), 0))
	before := snapshotTree(t, ws)
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "dir") != "now a file" || readFile(t, ws, "file/inside") != "now a dir" {
		t.Fatal("wrong result")
	}
	if _, err := f.Undo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := snapshotTree(t, ws); !equalTrees(before, after) {
		t.Fatalf("undo did not restore:\nwant %v\ngot  %v", before, after)
	}
}

func TestNoWriteOrDeleteThroughSymlinkedDir(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "real/x.txt", "x\n", 0o644)
	if err := os.Symlink("real", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "through a link")
	if err := tx.Delete(t.Context(), "link/x.txt"); !errors.Is(err, ErrInvalidPath) {
		t.Fatalf("Delete through a symlinked dir: %v", err)
	}
	// Writing beneath the link is refused: the user's link is never
	// replaced implicitly. Staged as a directory first, it is replaced;
	// the path is literal, so link/x.txt is new even though real/x.txt
	// exists.
	if err := tx.Write(t.Context(), "link/x.txt", []byte("mine\n"), 0); !errors.Is(err, ErrInvalidPath) || !strings.Contains(err.Error(), `"link/x.txt"`) {
		t.Fatalf("Write through a symlinked dir: %v", err)
	}
	if err := tx.Mkdir(t.Context(), "link", 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(t.Context(), "link/x.txt", []byte("mine\n"), 0); err != nil {
		t.Fatal(err)
	}
	got := map[string]Change{}
	for _, c := range tx.Changes() {
		got[c.Path] = c
	}
	if c := got["link"]; c.Kind != KindMkdir || c.New {
		t.Fatalf("link change = %+v", c)
	}
	if c := got["link/x.txt"]; !c.New {
		t.Fatalf("link/x.txt change = %+v, want new", c)
	}
	d, err := tx.Diff(t.Context())
	if err != nil || !strings.Contains(d, "deleted file mode 120000") || strings.Contains(d, "-x\n") {
		t.Fatalf("diff shows the link's target or hides the link's removal:\n%s", d)
	}
	before := snapshotTree(t, ws)
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "real/x.txt") != "x\n" || readFile(t, ws, "link/x.txt") != "mine\n" {
		t.Fatal("wrong result")
	}
	if fi, err := os.Lstat(filepath.Join(ws, "link")); err != nil || !fi.IsDir() {
		t.Fatalf("link is not a directory now: %v %v", fi, err)
	}
	if _, err := f.Undo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := snapshotTree(t, ws); !equalTrees(before, after) {
		t.Fatalf("undo did not restore the link:\nwant %v\ngot  %v", before, after)
	}
}

// TestStagingThroughEscapingSymlinkIsRefused: with "up -> .." in the
// workspace, staging up/x (one call or in a batch, as a file, directory
// or symlink) is refused with an error naming the path and saying the
// link leads outside; the link is kept by the commit of the rest.
func TestStagingThroughEscapingSymlinkIsRefused(t *testing.T) {
	ws := newWS(t)
	if err := os.Symlink("..", filepath.Join(ws, "up")); err != nil {
		t.Fatal(err)
	}
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "up")
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrInvalidPath) || !strings.Contains(err.Error(), `"up/x"`) || !strings.Contains(err.Error(), "outside the workspace") {
			t.Fatalf("%s through up -> ..: %v", what, err)
		}
	}
	check("Write", tx.Write(t.Context(), "up/x", []byte("x"), 0))
	check("Mkdir", tx.Mkdir(t.Context(), "up/x", 0))
	check("Symlink", tx.Symlink(t.Context(), "y", "up/x"))
	errs, err := tx.Stage(context.Background(), []Op{WriteOp("up/x", []byte("x"), 0), WriteOp("fine", []byte("f"), 0)})
	if err != nil || errs[1] != nil {
		t.Fatal(err, errs)
	}
	check("Stage", errs[0])
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(filepath.Join(ws, "up")); err != nil || l != ".." {
		t.Fatalf("up is now %q, %v", l, err)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(ws), "x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("something was written outside: %v", err)
	}
}

func TestDeleteThroughLaterSymlinkIsConflict(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "d/x.txt", "x\n", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "late link")
	if err := tx.Delete(t.Context(), "d/x.txt"); err != nil {
		t.Fatal(err)
	}
	// d is swapped for a symlink to a directory holding the same inode.
	if err := os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, "e")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("e", filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
	_, err := tx.Commit(context.Background())
	var ce *ConflictError
	// The staged path no longer exists as a literal path: its parent is
	// a symlink now.
	if !errors.As(err, &ce) || ce.Path != "d/x.txt" || ce.Reason != ReasonDeleted {
		t.Fatalf("commit = %v, want d/x.txt deleted", err)
	}
	if readFile(t, ws, "e/x.txt") != "x\n" {
		t.Fatal("deleted through the symlink")
	}
}

func TestOneTxManyGoroutines(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "parallel")
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		go func(g int) {
			errs <- tx.Write(t.Context(), filepath.Join("p", string(rune('a'+g))), []byte{byte(g)}, 0)
		}(g)
	}
	for g := 0; g < 16; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := len(tx.Changes()); n != 17 { // 16 files and the implicit p
		t.Fatalf("changes = %d", n)
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}
