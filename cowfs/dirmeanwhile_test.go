package cowfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A command made a directory and a file in it; before the change is
// committed, the user makes the same directory (or a file or link at
// its path) in the workspace. A directory there is what the command
// made, so the files inside commit and the user's directory is kept as
// it is; anything else at that path is still a conflict. Every way of
// committing a stack must agree.
func TestMkdirOfDirectoryMadeMeanwhile(t *testing.T) {
	commits := []struct {
		name   string
		commit func(t *testing.T, f *FS, ids []string) error
	}{
		{"commit by id", func(t *testing.T, f *FS, ids []string) error {
			for _, id := range ids {
				tx, err := f.Tx(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Commit(context.Background()); err != nil {
					return err
				}
			}
			return nil
		}},
		{"commit all", func(t *testing.T, f *FS, _ []string) error {
			_, _, err := f.CommitAll(context.Background())
			return err
		}},
		{"squash then commit", func(t *testing.T, f *FS, _ []string) error {
			id, _, err := f.Squash(context.Background(), 0)
			if err != nil {
				return err
			}
			tx, err := f.Tx(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Commit(context.Background())
			return err
		}},
	}
	meanwhile := []struct {
		name   string
		make   func(t *testing.T, ws string)
		reason string // "" when the commit must succeed
	}{
		{"directory", func(t *testing.T, ws string) {
			if err := os.Mkdir(filepath.Join(ws, "d"), 0o750); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"directory holding a file", func(t *testing.T, ws string) {
			writeFile(t, ws, "d/theirs", "theirs\n", 0o644)
			if err := os.Chmod(filepath.Join(ws, "d"), 0o750); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"file", func(t *testing.T, ws string) { writeFile(t, ws, "d", "file\n", 0o644) }, ReasonCreated},
		{"symlink to a directory", func(t *testing.T, ws string) {
			if err := os.Mkdir(filepath.Join(ws, "e"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("e", filepath.Join(ws, "d")); err != nil {
				t.Fatal(err)
			}
		}, ReasonCreated},
	}
	for _, c := range commits {
		for _, m := range meanwhile {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				ws := newWS(t)
				f := openFS(t, ws)
				// Two commands, as `mkdir d && echo a > d/a` then an edit
				// in d make them: the second depends on the first.
				id1 := stageCmd(t, f, "mkdir", MkdirOp("d", 0o755), WriteOp("d/a", []byte("a\n"), 0o644))
				id2 := stageCmd(t, f, "edit", WriteOp("d/b", []byte("b\n"), 0o644))
				m.make(t, ws)
				before := snapshotTree(t, ws)
				was, err := os.Lstat(filepath.Join(ws, "d"))
				if err != nil {
					t.Fatal(err)
				}
				err = c.commit(t, f, []string{id1, id2})
				if m.reason != "" {
					var ce *ConflictError
					if !errors.As(err, &ce) || ce.Path != "d" || ce.Reason != m.reason {
						t.Fatalf("commit: %v, want a %s conflict at d", err, m.reason)
					}
					if after := snapshotTree(t, ws); !equalTrees(before, after) {
						t.Fatalf("a refused commit changed the workspace:\nbefore %v\nafter  %v", before, after)
					}
					return
				}
				if err != nil {
					t.Fatalf("commit: %v, want the files inside the directory committed", err)
				}
				for name, want := range map[string]string{"d/a": "a\n", "d/b": "b\n"} {
					if got, err := os.ReadFile(filepath.Join(ws, name)); err != nil || string(got) != want {
						t.Fatalf("%s = %q, %v; want %q", name, got, err, want)
					}
				}
				// The user's directory stays theirs: same inode, same mode.
				fi, err := os.Lstat(filepath.Join(ws, "d"))
				if err != nil || fi.Mode().Perm() != 0o750 || !fi.IsDir() {
					t.Fatalf("d after commit: %v, %v; want the user's directory, mode 0750", fi, err)
				}
				if !os.SameFile(fi, was) {
					t.Fatal("d was replaced by another directory")
				}
				infos, err := f.List(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				for _, in := range infos {
					if in.State != StateCommitted {
						t.Fatalf("after commit: %+v, want every transaction committed", in)
					}
				}
				// Undo takes back what the commit wrote and leaves the
				// directory the user made.
				for range 2 {
					if _, err := f.Undo(context.Background()); err != nil {
						if errors.Is(err, ErrNotFound) {
							break
						}
						t.Fatalf("undo: %v", err)
					}
				}
				for _, name := range []string{"d/a", "d/b"} {
					if _, err := os.Lstat(filepath.Join(ws, name)); !os.IsNotExist(err) {
						t.Fatalf("%s after undo: %v, want gone", name, err)
					}
				}
				if fi, err := os.Lstat(filepath.Join(ws, "d")); err != nil || !fi.IsDir() {
					t.Fatalf("d after undo: %v, %v; want the user's directory kept", fi, err)
				}
			})
		}
	}
}
