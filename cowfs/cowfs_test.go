package cowfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func newWS(t *testing.T) string {
	t.Helper()
	return t.TempDir()
}

func writeFile(t *testing.T, ws, rel, content string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(ws, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, ws, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ws, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func openFS(t *testing.T, ws string, opts ...Option) *FS {
	t.Helper()
	f, err := Open(t.Context(), ws, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestStageCommitByteExact(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "keep.txt", "keep\n", 0o644)
	writeFile(t, ws, "mod.txt", "old\n", 0o644)
	writeFile(t, ws, "gone.txt", "bye\n", 0o644)
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "smoke")
	if err != nil {
		t.Fatal(err)
	}
	bin := []byte{0, 1, 2, 0xff, '\n', 0, 'x'}
	steps := []error{
		tx.Write(t.Context(), "mod.txt", []byte("new\n"), 0),
		tx.Write(t.Context(), "bin/data.bin", bin, 0o600),
		tx.Write(t.Context(), "empty", nil, 0o755),
		tx.Delete(t.Context(), "gone.txt"),
		tx.Mkdir(t.Context(), "newdir", 0o700),
		tx.Symlink(t.Context(), "../mod.txt", "bin/link"),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if got := readFile(t, ws, "mod.txt"); got != "old\n" {
		t.Fatalf("workspace changed before commit: %q", got)
	}
	if _, err := os.Stat(filepath.Join(ws, "bin")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bin exists before commit: %v", err)
	}
	// Another FS (as another process would) sees the transaction.
	f2 := openFS(t, ws)
	tx2, err := f2.Tx(t.Context(), tx.ID())
	if err != nil {
		t.Fatal(err)
	}
	if len(tx2.Changes()) != len(tx.Changes()) {
		t.Fatalf("other FS sees %d changes, want %d", len(tx2.Changes()), len(tx.Changes()))
	}
	paths, err := tx2.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 7 { // mod, bin (implicit), bin/data.bin, empty, gone, newdir, bin/link
		t.Fatalf("committed %v", paths)
	}
	if got := readFile(t, ws, "mod.txt"); got != "new\n" {
		t.Fatalf("mod.txt = %q", got)
	}
	if got := readFile(t, ws, "bin/data.bin"); !bytes.Equal([]byte(got), bin) {
		t.Fatalf("binary = %q", got)
	}
	checkMode := func(rel string, want os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(ws, rel))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Fatalf("%s mode %v, want %v", rel, fi.Mode().Perm(), want)
		}
	}
	checkMode("bin/data.bin", 0o600)
	checkMode("empty", 0o755)
	checkMode("newdir", 0o700)
	checkMode("mod.txt", 0o644)
	if fi, err := os.Stat(filepath.Join(ws, "empty")); err != nil || fi.Size() != 0 {
		t.Fatalf("empty: %v %v", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "gone.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("gone.txt still there: %v", err)
	}
	if l, err := os.Readlink(filepath.Join(ws, "bin/link")); err != nil || l != "../mod.txt" {
		t.Fatalf("link = %q %v", l, err)
	}
	if err := tx.Write(t.Context(), "x", []byte("y"), 0); !errors.Is(err, ErrClosed) {
		// tx (the first handle) must notice the commit made through tx2.
		t.Fatalf("write after commit: %v", err)
	}

	info, err := f.Undo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != tx.ID() {
		t.Fatalf("undid %s, want %s", info.ID, tx.ID())
	}
	if got := readFile(t, ws, "mod.txt"); got != "old\n" {
		t.Fatalf("after undo mod.txt = %q", got)
	}
	if got := readFile(t, ws, "gone.txt"); got != "bye\n" {
		t.Fatalf("after undo gone.txt = %q", got)
	}
	for _, p := range []string{"bin", "empty", "newdir"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("after undo %s still exists: %v", p, err)
		}
	}
	if _, err := f.Undo(context.Background()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second undo: %v", err)
	}
	if strings.Contains(readFile(t, ws, "keep.txt"), "x") {
		t.Fatal("keep.txt touched")
	}
}

func TestSetuidIsDropped(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "suid")
	if err := tx.Write(t.Context(), "prog", []byte("#!/bin/sh\n"), 0o755|os.ModeSetuid|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := tx.Mkdir(t.Context(), "shared", 0o775|os.ModeSetgid|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(ws, "prog"))
	if err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("prog mode %v, %v", fi.Mode(), err)
	}
	fi, err = os.Stat(filepath.Join(ws, "shared"))
	if err != nil || fi.Mode()&os.ModeSetuid != 0 || fi.Mode()&os.ModeSetgid == 0 {
		t.Fatalf("shared mode %v, %v", fi.Mode(), err)
	}
}

func TestUndoDepthAndOrder(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws, WithUndoDepth(2))
	for i := 1; i <= 3; i++ {
		tx, _ := f.Begin(t.Context(), fmt.Sprint("v", i))
		if err := tx.Write(t.Context(), "a", []byte(fmt.Sprint(i)), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	infos, _ := f.List(t.Context())
	if len(infos) != 2 || infos[0].Description != "v2" || infos[1].Description != "v3" {
		t.Fatalf("journal = %+v, want v2 and v3", infos)
	}
	for _, want := range []string{"2", "1"} {
		if _, err := f.Undo(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, ws, "a"); got != want {
			t.Fatalf("after undo a = %q, want %q", got, want)
		}
	}
	if _, err := f.Undo(context.Background()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("undo beyond depth: %v", err)
	}
}

// TestUndoPastACommitOfOtherPaths undoes three commits in a row where
// the first and the third change the same paths and the second others.
// Undoing the third restores the first one's bytes under new inodes;
// the first entry's after-images must take them, though it is not the
// entry just before the third, or its Undo refuses those paths as
// replaced for good while they hold exactly what it wrote.
func TestUndoPastACommitOfOtherPaths(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "a", "0", 0o644)
	f := openFS(t, ws)
	commit := func(desc string, stage func(tx *Tx) error) {
		t.Helper()
		tx, err := f.Begin(t.Context(), desc)
		if err != nil {
			t.Fatal(err)
		}
		if err := stage(tx); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	commit("first", func(tx *Tx) error {
		if err := tx.Write(t.Context(), "a", []byte("1"), 0o600); err != nil {
			return err
		}
		return tx.Write(t.Context(), "d/x", []byte("x"), 0)
	})
	commit("second", func(tx *Tx) error { return tx.Write(t.Context(), "b", []byte("b"), 0) })
	commit("third", func(tx *Tx) error {
		if err := tx.Write(t.Context(), "a", []byte("2"), 0o644); err != nil {
			return err
		}
		return tx.Delete(t.Context(), "d/x")
	})
	type state struct{ a, b, x *string }
	read := func(p string) *string {
		b, err := os.ReadFile(filepath.Join(ws, p))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return str(string(b))
	}
	for _, want := range []state{
		{str("1"), str("b"), str("x")}, // the third undone
		{str("1"), nil, str("x")},      // the second
		{str("0"), nil, nil},           // the first
	} {
		info, err := f.Undo(context.Background())
		if err != nil {
			t.Fatalf("undo: %v", err)
		}
		if got := (state{read("a"), read("b"), read("d/x")}); !same(got.a, want.a) || !same(got.b, want.b) || !same(got.x, want.x) {
			t.Fatalf("after undoing %q: a, b, d/x = %v %v %v", info.Description, got.a, got.b, got.x)
		}
	}
	if fi, err := os.Stat(filepath.Join(ws, "a")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("a after the last undo: %v, %v", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "d")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("d after the last undo: %v", err)
	}
	if _, err := f.Undo(context.Background()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("undo of an empty journal: %v", err)
	}
}

func TestStateDirMustBeReal(t *testing.T) {
	ws := newWS(t)
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(ws, ".pulse")); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), ws); err == nil {
		t.Fatal("Open accepted a .pulse symlink")
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("state written through the symlink: %v", entries)
	}
}

func TestDiscardKeepsWorkspace(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "a", "a", 0o644)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "discard me")
	if err := tx.Write(t.Context(), "a", []byte("b"), 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Delete(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Discard(t.Context()); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "a") != "a" {
		t.Fatal("discard touched the workspace")
	}
	if _, err := f.Tx(t.Context(), tx.ID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("discarded tx still found: %v", err)
	}
	if err := tx.Write(t.Context(), "a", []byte("c"), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after discard: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(ws, StateDir, "trash")); len(entries) != 0 {
		t.Fatalf("trash not emptied: %v", entries)
	}
}

// TestOverlayShapes stages what a command's overlay can hold, in any
// order, without Delete calls first: a file over a directory tree, a
// directory over a file, a symlink over a file.
func TestOverlayShapes(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "tree/a", "a", 0o644)
	writeFile(t, ws, "tree/sub/b", "b", 0o644)
	writeFile(t, ws, "plain", "p", 0o644)
	writeFile(t, ws, "lnk", "l", 0o644)
	before := snapshotTree(t, ws)
	f := openFS(t, ws)
	tx, _ := f.Begin(t.Context(), "overlay")
	for _, err := range []error{
		tx.Write(t.Context(), "tree", []byte("now a file"), 0),
		tx.Write(t.Context(), "plain/inside", []byte("i"), 0),
		tx.Mkdir(t.Context(), "plain", 0o750),
		tx.Symlink(t.Context(), "tree", "lnk"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "tree") != "now a file" || readFile(t, ws, "plain/inside") != "i" {
		t.Fatal("wrong content")
	}
	if fi, _ := os.Lstat(filepath.Join(ws, "plain")); fi == nil || !fi.IsDir() || fi.Mode().Perm() != 0o750 {
		t.Fatalf("plain = %v", fi)
	}
	if l, _ := os.Readlink(filepath.Join(ws, "lnk")); l != "tree" {
		t.Fatalf("lnk -> %q", l)
	}
	if _, err := f.Undo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := snapshotTree(t, ws); !equalTrees(before, after) {
		t.Fatalf("undo did not restore:\nwant %v\ngot  %v", before, after)
	}
}

func TestStagedBytesSeenAcrossFS(t *testing.T) {
	ws := newWS(t)
	a := openFS(t, ws, WithMaxStagedBytes(150))
	b := openFS(t, ws, WithMaxStagedBytes(150))
	txb, _ := b.Begin(t.Context(), "other process")
	if err := txb.Write(t.Context(), "x", make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	// a learns of txb's bytes as soon as it reads that transaction.
	if _, err := a.Tx(t.Context(), txb.ID()); err != nil {
		t.Fatal(err)
	}
	txa, _ := a.Begin(t.Context(), "this process")
	var le *LimitError
	if err := txa.Write(t.Context(), "y", make([]byte, 60), 0); !errors.As(err, &le) || le.Name != LimitStagedBytes {
		t.Fatalf("write over the shared total: %v", err)
	}
	if _, err := txb.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	// b committed txb; a still counts it until a refusal makes it recount.
	if err := txa.Write(t.Context(), "y", make([]byte, 60), 0); err != nil {
		t.Fatalf("a counts bytes committed by another FS: %v", err)
	}
}

// TestStagedBytesCountedBeforeFirstStage: Open leaves the staged-bytes
// total uncounted (most Opens never stage), so the first staging of an FS
// opened after another one staged — single and batched, without having
// read that transaction — must count it before its limit check.
func TestStagedBytesCountedBeforeFirstStage(t *testing.T) {
	ws := newWS(t)
	b := openFS(t, ws, WithMaxStagedBytes(150))
	txb, _ := b.Begin(t.Context(), "other process")
	if err := txb.Write(t.Context(), "x", make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
	var le *LimitError
	a := openFS(t, ws, WithMaxStagedBytes(150))
	txa, _ := a.Begin(t.Context(), "this process")
	if err := txa.Write(t.Context(), "y", make([]byte, 60), 0); !errors.As(err, &le) || le.Name != LimitStagedBytes {
		t.Fatalf("single write over the total staged before this FS opened: %v", err)
	}
	c := openFS(t, ws, WithMaxStagedBytes(150))
	txc, _ := c.Begin(t.Context(), "a third process")
	errs, err := txc.Stage(t.Context(), []Op{{Kind: KindWrite, Path: "z", Data: make([]byte, 60)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 1 || !errors.As(errs[0], &le) || le.Name != LimitStagedBytes {
		t.Fatalf("batched write over the total staged before this FS opened: %v", errs)
	}
	if err := txc.Write(t.Context(), "z", make([]byte, 40), 0); err != nil {
		t.Fatalf("a write within the limit: %v", err)
	}
}

// TestCommitModesPastUmask: a committed file has exactly its staged mode,
// also the bits the process umask takes from a new file's mode (the usual
// 022 takes group and other write), and its after-image says so: an
// undo right after finds nothing changed.
func TestCommitModesPastUmask(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "modes")
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]os.FileMode{"open": 0o777, "shared": 0o666, "group": 0o664, "private": 0o600, "none": 0}
	for name, m := range modes {
		if err := tx.Write(t.Context(), name, []byte(name), m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	for name, m := range modes {
		fi, err := os.Lstat(filepath.Join(ws, name))
		if err != nil {
			t.Fatal(err)
		}
		want := m
		if m == 0 {
			want = 0o644 // the default for a new file
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
	if _, err := f.Undo(t.Context()); err != nil {
		t.Fatalf("undo right after the commit: %v", err)
	}
}

// TestWithoutNewWriteBits: group and other write are staged, bit by bit,
// only where the workspace entry of the same type already has them; the
// other bits (exec, setgid on a directory) are kept as given.
func TestWithoutNewWriteBits(t *testing.T) {
	ws := newWS(t)
	for p, m := range map[string]os.FileMode{"f644": 0o644, "f664": 0o664, "f666": 0o666} {
		writeFile(t, ws, p, p, m)
		if err := os.Chmod(filepath.Join(ws, p), m); err != nil {
			t.Fatal(err)
		}
	}
	for p, m := range map[string]os.FileMode{"d755": 0o755, "d775": 0o775, "d777": 0o777} {
		if err := os.Mkdir(filepath.Join(ws, p), m); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(ws, p), m); err != nil {
			t.Fatal(err)
		}
	}
	f := openFS(t, ws, WithoutNewWriteBits(0o022))
	tx, err := f.Begin(t.Context(), "modes")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path string
		dir  bool
		mode os.FileMode
		want os.FileMode
	}{
		{"new", false, 0o666, 0o644},
		{"new-exec", false, 0o777, 0o755},
		{"new-private", false, 0o600, 0o600},
		{"f644", false, 0o666, 0o644},
		{"f664", false, 0o666, 0o664},
		{"f666", false, 0o666, 0o666},
		{"newdir", true, 0o777, os.ModeDir | 0o755},
		{"newdir-setgid", true, 0o777 | os.ModeSetgid, os.ModeDir | os.ModeSetgid | 0o755},
		{"d755", true, 0o777, os.ModeDir | 0o755},
		{"d775", true, 0o777, os.ModeDir | 0o775},
		{"d777", true, 0o777, os.ModeDir | 0o777},
		{"f664-to-dir", true, 0o777, os.ModeDir | 0o755}, // a file's bits say nothing of a directory
	}
	writeFile(t, ws, "f664-to-dir", "x", 0o664)
	if err := os.Chmod(filepath.Join(ws, "f664-to-dir"), 0o664); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if c.dir {
			err = tx.Mkdir(t.Context(), c.path, c.mode)
		} else {
			err = tx.Write(t.Context(), c.path, []byte(c.path+" new"), c.mode)
		}
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
	}
	if _, err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		fi, err := os.Lstat(filepath.Join(ws, c.path))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != c.want {
			t.Errorf("%s staged %v: committed %v, want %v", c.path, c.mode, fi.Mode(), c.want)
		}
	}
}

// TestWorkspaceDescriptorAfterClose: once the FS is closed, the raw
// descriptor paths refuse (fs.ErrClosed) instead of using a number the
// process may since have given to another file.
func TestWorkspaceDescriptorAfterClose(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	if _, err := f.ws.lstatSys("x"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("lstat of a missing file before Close: %v", err)
	}
	f.Close()
	if _, err := f.ws.lstatSys("x"); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("lstat after Close: %v, want fs.ErrClosed", err)
	}
	if err := f.ws.rename2("a", "b", renameNoReplace); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("rename after Close: %v, want fs.ErrClosed", err)
	}
}
