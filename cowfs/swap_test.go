package cowfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// swapFixture is a workspace with d/x.txt and d/y.txt and a transaction
// that rewrites d/x.txt, creates d/new.txt and deletes d/y.txt.
func swapFixture(t *testing.T) (ws, id string, f *FS) {
	t.Helper()
	ws = newWS(t)
	writeFile(t, ws, "d/x.txt", "old x\n", 0o644)
	writeFile(t, ws, "d/y.txt", "old y\n", 0o644)
	writeFile(t, ws, "top.txt", "old top\n", 0o644)
	f = openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "swap")
	ops := []Op{
		WriteOp("d/x.txt", []byte("new x\n"), 0),
		WriteOp("d/new.txt", []byte("new\n"), 0),
		DeleteOp("d/y.txt"),
		WriteOp("top.txt", []byte("new top\n"), 0),
	}
	if errs, err := tx.Stage(context.Background(), ops); err != nil || errors.Join(errs...) != nil {
		t.Fatal(err, errs)
	}
	return ws, tx.ID(), f
}

// swapDir puts a symlink to the directory where d was (now e): every
// path through d still reaches the same files, but not literally.
func swapDir(t *testing.T, ws string) {
	t.Helper()
	if err := os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, "e")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("e", filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
}

func swapBack(t *testing.T, ws string) {
	t.Helper()
	if err := os.Remove(filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(ws, "e"), filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
}

func checkSwapCommitted(t *testing.T, ws string) {
	t.Helper()
	if readFile(t, ws, "d/x.txt") != "new x\n" || readFile(t, ws, "d/new.txt") != "new\n" || readFile(t, ws, "top.txt") != "new top\n" {
		t.Fatal("the commit's changes are not all in the workspace")
	}
	if _, err := os.Lstat(filepath.Join(ws, "d/y.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("d/y.txt not deleted: %v", err)
	}
}

// TestDirSwappedForSymlinkDuringCommit: a directory a commit works in is
// swapped for a symlink to itself after the commit began and before it
// wrote there. The commit refuses with a conflict naming the directory,
// writes nothing through the symlink, leaves the transaction pending, and
// commits once the directory is back.
func TestDirSwappedForSymlinkDuringCommit(t *testing.T) {
	for _, fp := range []int{fpValidated, fpWALSynced, fpApplySynced} {
		t.Run(failpointName(fp), func(t *testing.T) {
			ws, id, f := swapFixture(t)
			done := false
			failpointHook = func(n int) {
				if n == fp && !done {
					done = true
					swapDir(t, ws)
				}
			}
			defer func() { failpointHook = nil }()
			tx, err := f.Tx(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Commit(context.Background())
			failpointHook = nil
			var ce *ConflictError
			if !errors.As(err, &ce) || !(ce.Path == "d" && ce.Reason == ReasonReplaced || ce.Path == "d/y.txt" && ce.Reason == ReasonDeleted) {
				t.Fatalf("Commit with d swapped for a symlink: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(ws, "e/new.txt")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("written through the symlink: %v", err)
			}
			infos, _ := f.List(t.Context())
			if fp == fpApplySynced {
				// d/y.txt was moved aside in d before the swap: the
				// rollback cannot see it, so the commit stays for the
				// next Open, which finishes it once d is back.
				if len(infos) != 1 || infos[0].State != StateCommitting {
					t.Fatalf("List = %+v, want the transaction committing", infos)
				}
				swapBack(t, ws)
				f.Close()
				g, err := Open(t.Context(), ws)
				if err != nil {
					t.Fatalf("Open after d is back: %v", err)
				}
				defer g.Close()
				if infos, _ := g.List(t.Context()); len(infos) != 1 || infos[0].State != StateCommitted {
					t.Fatalf("after recovery List = %+v, want it committed", infos)
				}
				checkSwapCommitted(t, ws)
				return
			}
			// Nothing changed but what the hook did: nothing reached e
			// through d, and top.txt (not beneath d) was put back.
			if readFile(t, ws, "e/x.txt") != "old x\n" || readFile(t, ws, "e/y.txt") != "old y\n" || readFile(t, ws, "top.txt") != "old top\n" {
				t.Fatalf("the workspace changed: %v", snapshotTree(t, ws))
			}
			if len(infos) != 1 || infos[0].State != StateOpen {
				t.Fatalf("List = %+v, want the transaction open", infos)
			}
			swapBack(t, ws)
			tx, err = f.Tx(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Commit(context.Background()); err != nil {
				t.Fatalf("Commit after d is back: %v", err)
			}
			checkSwapCommitted(t, ws)
		})
	}
}

// TestDirSwappedForSymlinkBeforeRecovery: a commit is killed after its
// commit point; before the next Open, a directory it works in is swapped
// for a symlink. Recovery writes nothing through it and does not
// quarantine the transaction for good: once the directory is back, the
// next Open finishes the commit.
func TestDirSwappedForSymlinkBeforeRecovery(t *testing.T) {
	for _, fp := range []int{fpWALSynced, fpApplyRenamed} {
		t.Run(failpointName(fp), func(t *testing.T) {
			ws, id, f := swapFixture(t)
			f.Close()
			cmd := helperCmd(ws, id, failpointEnv(fp, 1))
			if err := cmd.Run(); err == nil {
				t.Fatal("the helper was not killed")
			}
			swapDir(t, ws)
			g, err := Open(t.Context(), ws)
			if err == nil {
				defer g.Close()
			}
			if _, err := os.Lstat(filepath.Join(ws, "e/new.txt")); fp == fpWALSynced && !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("recovery wrote through the symlink: %v", err)
			}
			if g != nil {
				g.Close()
			}
			swapBack(t, ws)
			h, err := Open(t.Context(), ws)
			if err != nil {
				t.Fatalf("Open after d is back: %v", err)
			}
			defer h.Close()
			infos, _ := h.List(t.Context())
			for _, in := range infos {
				if in.State == StateQuarantined {
					t.Fatalf("quarantined for good: %+v", in)
				}
			}
			if len(infos) == 1 && infos[0].State == StateOpen {
				tx, err := h.Tx(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Commit(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			checkSwapCommitted(t, ws)
		})
	}
}

// replaceDir renames d to e and makes a new, empty directory d: a real
// directory at the same path, but not the one the commit validated.
func replaceDir(t *testing.T, ws string) {
	t.Helper()
	if err := os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, "e")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ws, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// putBack removes the new d, which must still be empty (nothing of the
// commit went there), and renames e back to d.
func putBack(t *testing.T, ws string) {
	t.Helper()
	if names, _ := os.ReadDir(filepath.Join(ws, "d")); len(names) != 0 {
		t.Fatalf("written into the directory that replaced d: %v", names)
	}
	if err := os.Remove(filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(ws, "e"), filepath.Join(ws, "d")); err != nil {
		t.Fatal(err)
	}
}

// TestDirReplacedDuringCommit: a directory a commit works in is renamed
// away and another, empty one made at its path, after the commit moved
// d/y.txt aside there (apply-removed) or wrote its new files there
// (apply-synced). What the commit did is in the renamed directory, where
// the commit cannot see it, so it refuses with a conflict naming d, puts
// nothing in the new directory, and stays committing until d is back;
// then the next Open finishes it. Before, the rollback "restored" d/y.txt
// from prev/ into the new directory, which had never held it, left the
// real one in the renamed directory under the commit's hidden name, and
// reported the commit rolled back and pending.
func TestDirReplacedDuringCommit(t *testing.T) {
	for _, fp := range []int{fpApplyRemoved, fpApplySynced} {
		t.Run(failpointName(fp), func(t *testing.T) {
			ws, id, f := swapFixture(t)
			done := false
			failpointHook = func(n int) {
				if n == fp && !done {
					done = true
					replaceDir(t, ws)
				}
			}
			defer func() { failpointHook = nil }()
			tx, err := f.Tx(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Commit(context.Background())
			failpointHook = nil
			if names, _ := os.ReadDir(filepath.Join(ws, "d")); len(names) != 0 {
				t.Fatalf("written into the directory that replaced d: %v (Commit: %v)", names, err)
			}
			var ce *ConflictError
			if !errors.As(err, &ce) || ce.Path != "d" || ce.Reason != ReasonReplaced {
				t.Fatalf("Commit with d replaced by another directory: %v", err)
			}
			if infos, _ := f.List(t.Context()); len(infos) != 1 || infos[0].State != StateCommitting {
				t.Fatalf("List = %+v, want the transaction committing", infos)
			}
			putBack(t, ws)
			f.Close()
			g := openFS(t, ws)
			if err := g.RecoveryErr(); err != nil {
				t.Fatalf("recovery once d is back: %v", err)
			}
			if infos, _ := g.List(t.Context()); len(infos) != 1 || infos[0].State != StateCommitted {
				t.Fatalf("after recovery List = %+v, want it committed", infos)
			}
			checkSwapCommitted(t, ws)
			checkNoTempsIn(t, ws)
		})
	}
}

// TestDirReplacedDuringUndo: as TestDirReplacedDuringCommit, for an
// Undo of the fixture's commit. Before, the undo's rollback put
// d/new.txt, the file the undo removes, into the new directory.
func TestDirReplacedDuringUndo(t *testing.T) {
	ws, id, f := swapFixture(t)
	tx, err := f.Tx(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := false
	failpointHook = func(n int) {
		if n == fpApplyRemoved && !done {
			done = true
			replaceDir(t, ws)
		}
	}
	defer func() { failpointHook = nil }()
	_, err = f.Undo(context.Background())
	failpointHook = nil
	if names, _ := os.ReadDir(filepath.Join(ws, "d")); len(names) != 0 {
		t.Fatalf("written into the directory that replaced d: %v (Undo: %v)", names, err)
	}
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Path != "d" || ce.Reason != ReasonReplaced {
		t.Fatalf("Undo with d replaced by another directory: %v", err)
	}
	putBack(t, ws)
	f.Close()
	g := openFS(t, ws)
	if err := g.RecoveryErr(); err != nil {
		t.Fatalf("recovery once d is back: %v", err)
	}
	if readFile(t, ws, "d/x.txt") != "old x\n" || readFile(t, ws, "d/y.txt") != "old y\n" || readFile(t, ws, "top.txt") != "old top\n" {
		t.Fatal("the undo was not finished")
	}
	if _, err := os.Lstat(filepath.Join(ws, "d/new.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("d/new.txt not removed by the undo: %v", err)
	}
	if infos, _ := g.List(t.Context()); len(infos) != 0 {
		t.Fatalf("after the undo List = %+v", infos)
	}
	checkNoTempsIn(t, ws)
}

// TestDirReplacedBeforeRecovery: a commit is killed after moving d/y.txt
// aside in d; before the next Open, d is renamed away and another
// directory made in its place. Recovery writes nothing there and leaves
// the commit for a later Open; once d is back, that Open finishes it.
// Before, recovery found d/x.txt missing in the new directory and
// quarantined the transaction, for good: it stayed quarantined once d
// was back.
func TestDirReplacedBeforeRecovery(t *testing.T) {
	ws, id, f := swapFixture(t)
	f.Close()
	if err := helperCmd(ws, id, failpointEnv(fpApplyRemoved, 1)).Run(); err == nil {
		t.Fatal("the helper was not killed")
	}
	replaceDir(t, ws)
	g := openFS(t, ws)
	var ce *ConflictError
	if err := g.RecoveryErr(); !errors.As(err, &ce) || ce.Path != "d" || ce.Reason != ReasonReplaced {
		t.Fatalf("RecoveryErr with d replaced = %v", err)
	}
	if infos, _ := g.List(t.Context()); len(infos) != 1 || infos[0].State != StateCommitting {
		t.Fatalf("List = %+v, want the transaction committing", infos)
	}
	g.Close()
	putBack(t, ws)
	h := openFS(t, ws)
	if err := h.RecoveryErr(); err != nil {
		t.Fatalf("recovery once d is back: %v", err)
	}
	if infos, _ := h.List(t.Context()); len(infos) != 1 || infos[0].State != StateCommitted {
		t.Fatalf("after recovery List = %+v, want it committed", infos)
	}
	checkSwapCommitted(t, ws)
	checkNoTempsIn(t, ws)
}

func checkNoTempsIn(t *testing.T, ws string) {
	t.Helper()
	filepath.Walk(ws, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.HasPrefix(fi.Name(), ".pulse-cow-") {
			t.Errorf("temp entry left: %s", p)
		}
		return nil
	})
}
