package cowfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// blobDamage are the ways a state file holding bytes is damaged in the
// tests: each returns the new content of the file.
var blobDamage = map[string]func(b []byte) []byte{
	"flip a byte":  func(b []byte) []byte { b[len(b)/2] ^= 0x01; return b },
	"zero all":     func(b []byte) []byte { return make([]byte, len(b)) },
	"truncate":     func(b []byte) []byte { return b[:len(b)/2] },
	"empty":        func(b []byte) []byte { return nil },
	"append bytes": func(b []byte) []byte { return append(b, "extra"...) },
}

// damageFile rewrites the state file p with damage applied, or removes it
// (damage nil).
func damageFile(t *testing.T, p string, damage func([]byte) []byte) {
	t.Helper()
	if damage == nil {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite in place, as a disk error or an editor would: the hard
	// links of a blob (undo links saved copies) see it too.
	if err := os.WriteFile(p, damage(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// blobFiles lists the files under blobs/ of transaction id.
func blobFiles(t *testing.T, ws, id string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(ws, StateDir, "tx", id, "blobs", "*"))
	if err != nil || len(m) == 0 {
		t.Fatalf("no blobs: %v", err)
	}
	return m
}

// TestCommitRefusesDamagedStagedBytes: a staged blob (loose or in a
// batch's pack) that is damaged or missing is found before the commit
// point. Commit fails with ErrDamaged naming the path, the workspace is
// untouched and the transaction stays open.
func TestCommitRefusesDamagedStagedBytes(t *testing.T) {
	cases := map[string]func([]byte) []byte{"missing": nil}
	for k, v := range blobDamage {
		cases[k] = v
	}
	for _, batch := range []bool{false, true} {
		for name, damage := range cases {
			if batch && name == "append bytes" {
				continue // bytes after a file's section of a pack are not its bytes
			}
			t.Run(map[bool]string{false: "loose/", true: "pack/"}[batch]+name, func(t *testing.T) {
				ws := newWS(t)
				writeFile(t, ws, "victim.txt", "old content\n", 0o644)
				f := openFS(t, ws)
				tx, _ := f.Begin(t.Context(), "damage")
				data := []byte(strings.Repeat("new content\n", 100))
				if batch {
					errs, err := tx.Stage(context.Background(), []Op{WriteOp("victim.txt", data, 0)})
					if err != nil || errs[0] != nil {
						t.Fatal(err, errs)
					}
				} else if err := tx.Write(t.Context(), "victim.txt", data, 0); err != nil {
					t.Fatal(err)
				}
				damageFile(t, blobFiles(t, ws, tx.ID())[0], damage)
				before := snapshotTree(t, ws)
				_, err := tx.Commit(context.Background())
				if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `"victim.txt"`) {
					t.Fatalf("Commit over damaged staged bytes: %v", err)
				}
				if !equalTrees(before, snapshotTree(t, ws)) {
					t.Fatal("a refused commit changed the workspace")
				}
				infos, err := f.List(t.Context())
				if err != nil || len(infos) != 1 || infos[0].State != StateOpen {
					t.Fatalf("List = %+v, %v", infos, err)
				}
				if _, err := os.Stat(filepath.Join(ws, StateDir, "tx", tx.ID(), "wal")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("the WAL was written: %v", err)
				}
				if err := tx.Discard(t.Context()); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestApplyChecksBytesWhileCopying damages a blob after the commit point,
// between the check before the WAL and the copy: the copy finds it, the
// damaged bytes never replace the target, and the commit is rolled back,
// its transaction pending with the reason.
func TestApplyChecksBytesWhileCopying(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "victim.txt", "old content\n", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "damage")
	if err := tx.Write(t.Context(), "victim.txt", []byte("new content\n"), 0); err != nil {
		t.Fatal(err)
	}
	blob := blobFiles(t, ws, tx.ID())[0]
	failpointHook = func(fp int) {
		if fp == fpWALSynced {
			damageFile(t, blob, blobDamage["flip a byte"])
		}
	}
	defer func() { failpointHook = nil }()
	_, err := tx.Commit(context.Background())
	failpointHook = nil
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `"victim.txt"`) {
		t.Fatalf("Commit with bytes damaged after the commit point: %v", err)
	}
	if got := readFile(t, ws, "victim.txt"); got != "old content\n" {
		t.Fatalf("victim.txt = %q", got)
	}
	// Rolled back: the transaction is pending again, with the reason.
	infos, err := f.List(t.Context())
	if err != nil || len(infos) != 1 || infos[0].State != StateOpen || !strings.Contains(infos[0].Reason, "victim.txt") {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	f.Close()
	f2 := openFS(t, ws)
	if err := f2.RecoveryErr(); err != nil {
		t.Fatalf("RecoveryErr = %v", err)
	}
	if got := readFile(t, ws, "victim.txt"); got != "old content\n" {
		t.Fatalf("after reopening victim.txt = %q", got)
	}
	if left, _ := filepath.Glob(filepath.Join(ws, ".pulse-cow-*")); len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}
}

// TestRecoveryRefusesDamagedStagedBytes: a commit interrupted after its
// commit point whose remaining bytes are damaged is quarantined, and no
// damaged byte is written.
func TestRecoveryRefusesDamagedStagedBytes(t *testing.T) {
	for name, damage := range blobDamage {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fx := newCrashFixture(t)
			fx.crashAt(t, fpWALSynced, 1)
			for _, p := range blobFiles(t, fx.ws, fx.id) {
				damageFile(t, p, damage)
			}
			wal, _ := os.ReadFile(filepath.Join(fx.ws, StateDir, "tx", fx.id, "wal"))
			fx.checkQuarantined(t, wal)
			if n := fx.checkEach(t); n != 0 {
				t.Fatalf("%d files written from damaged bytes", n)
			}
		})
	}
}

// TestUndoRefusesDamagedSavedCopy: Undo checks the saved previous bytes
// before its commit point; a damaged copy is refused with ErrDamaged
// naming the path, and the workspace keeps the committed content.
func TestUndoRefusesDamagedSavedCopy(t *testing.T) {
	for name, damage := range blobDamage {
		t.Run(name, func(t *testing.T) {
			ws := newWS(t)
			writeFile(t, ws, "a.txt", strings.Repeat("before\n", 10), 0o644)
			f := openFS(t, ws)
			tx, _ := f.Begin(t.Context(), "edit")
			if err := tx.Write(t.Context(), "a.txt", []byte("after\n"), 0); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			prev, _ := filepath.Glob(filepath.Join(ws, StateDir, "done", "*", "prev", "*"))
			if len(prev) != 1 {
				t.Fatalf("saved copies: %v", prev)
			}
			damageFile(t, prev[0], damage)
			_, err := f.Undo(context.Background())
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `"a.txt"`) {
				t.Fatalf("Undo with a damaged saved copy: %v", err)
			}
			if got := readFile(t, ws, "a.txt"); got != "after\n" {
				t.Fatalf("a.txt = %q", got)
			}
			infos, _ := f.List(t.Context())
			if len(infos) != 1 || infos[0].State != StateCommitted {
				t.Fatalf("List after refused undo = %+v", infos)
			}
		})
	}
}

// TestRecoveryFinishesDirectoryWithWrongMode: a directory the commit made
// that exists with another mode than staged (what a crash between mkdir
// and chmod left before directories were made under a temp name) is
// finished by recovery, not quarantined, for explicit and implicit
// directories alike.
func TestRecoveryFinishesDirectoryWithWrongMode(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "was-file", "x", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "dirs")
	for _, op := range []Op{MkdirOp("explicit", 0o750), WriteOp("implicit/f", []byte("f"), 0), MkdirOp("was-file", 0o711)} {
		if errs, err := tx.Stage(context.Background(), []Op{op}); err != nil || errs[0] != nil {
			t.Fatal(err, errs)
		}
	}
	id := tx.ID()
	f.Close()
	fx := &crashFixture{ws: ws, id: id}
	fx.crashAt(t, fpWALSynced, 1)
	os.Remove(filepath.Join(ws, "was-file"))
	for _, d := range []string{"explicit", "implicit", "was-file"} {
		if err := os.Mkdir(filepath.Join(ws, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	f2 := openFS(t, ws)
	if err := f2.RecoveryErr(); err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]os.FileMode{"explicit": 0o750, "implicit": 0o755, "was-file": 0o711} {
		fi, err := os.Stat(filepath.Join(ws, d))
		if err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want mode %v", d, fi.Mode(), err, want)
		}
	}
	if got := readFile(t, ws, "implicit/f"); got != "f" {
		t.Fatalf("implicit/f = %q", got)
	}
}
