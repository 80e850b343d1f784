package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/cowfs"
)

func TestCowStack(t *testing.T) {
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "w.txt"), []byte("w\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	stage := func(ops ...cowfs.Op) string {
		tx, err := f.Begin(t.Context(), "cmd")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Stage(context.Background(), ops); err != nil {
			t.Fatal(err)
		}
		return tx.ID()
	}
	a := stage(cowfs.WriteOp("a.txt", []byte("one\n"), 0o644))
	b := stage(cowfs.WriteOp("a.txt", []byte("one\ntwo\n"), 0o644), cowfs.DeleteOp("w.txt"))
	f.Close()

	code, out, errOut := runCLI(t, "cow", "diff", "--workspace", ws)
	if code != exitOK || !strings.Contains(out, "+one\n+two\n") || !strings.Contains(out, "deleted file mode") {
		t.Fatalf("stack diff: %d %q %s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "cow", "diff", b, "--workspace", ws)
	if code != exitOK || !strings.Contains(out, " one\n+two\n") {
		t.Fatalf("diff of %s against the stack below: %d %q", b, code, out)
	}
	if code, _, errOut := runCLI(t, "cow", "discard", a, "--workspace", ws); code != exitFailure || !strings.Contains(errOut, b) {
		t.Fatalf("discarding a transaction the one above depends on: %d %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "cow", "commit", "--all", "--workspace", ws); code != exitOK {
		t.Fatalf("commit --all: %d %s", code, errOut)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(got) != "one\ntwo\n" {
		t.Errorf("a.txt = %q", got)
	}
	if _, err := os.Lstat(filepath.Join(ws, "w.txt")); !os.IsNotExist(err) {
		t.Errorf("w.txt: %v", err)
	}
	if code, out, _ := runCLI(t, "cow", "discard", "--all", "--json", "--workspace", ws); code != exitOK || !strings.Contains(out, `"discarded": []`) {
		t.Errorf("discard --all of an empty stack: %d %s", code, out)
	}
}
