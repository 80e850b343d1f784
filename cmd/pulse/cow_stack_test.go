package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/sandbox"
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

// TestWhiteoutOnlyTransactionIsListedAndDiffed: a command that only
// deletes what a command before it wrote stages a whiteout and nothing
// else. `cow list` counts it as a change and MCP's diff of every pending
// transaction shows it: a reviewer who saw "0 changes", or a diff without
// it, would take it for empty and pass over a deletion.
func TestWhiteoutOnlyTransactionIsListedAndDiffed(t *testing.T) {
	ws := t.TempDir()
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []cowfs.Op{cowfs.WriteOp("a.txt", []byte("one\n"), 0o644), cowfs.WhiteoutOp("a.txt")} {
		tx, err := f.Begin(t.Context(), "cmd")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Stage(context.Background(), []cowfs.Op{op}); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := f.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	code, out, errOut := runCLI(t, "cow", "list", "--workspace", ws)
	if code != exitOK {
		t.Fatalf("cow list: %d %s", code, errOut)
	}
	for _, in := range infos {
		var row string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, in.ID) {
				row = l
			}
		}
		if f := strings.Fields(row); len(f) < 3 || f[2] != "1" {
			t.Errorf("cow list row of %s: %q, want 1 change\n%s", in.ID, row, out)
		}
	}

	sb, err := sandbox.New(t.Context(), ws, sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	txs, err := (&mcpTools{sb: sb}).pending(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(txs) != 2 {
		t.Fatalf("MCP's pending transactions: %d, want both", len(txs))
	}
}

// TestCommitAllIntoDirectoryMadeMeanwhile: a command makes a directory
// and a file in it; the user makes the same directory in the workspace
// before committing. The directory is no conflict: commit --all writes
// the file into the user's directory.
func TestCommitAllIntoDirectoryMadeMeanwhile(t *testing.T) {
	ws := t.TempDir()
	code, _, stderr := runCLI(t, "exec", "--workspace", ws, "--backend", "namespace", "--", "sh", "-c", "mkdir d && echo a > d/a")
	if code == exitSandbox && strings.Contains(stderr, "namespace:") {
		testenv.Missing(t, testenv.Namespace, "namespace backend unavailable here: "+stderr)
	}
	if code != exitOK {
		t.Fatalf("exec: %d %s", code, stderr)
	}
	if err := os.Mkdir(filepath.Join(ws, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCLI(t, "cow", "commit", "--all", "--workspace", ws); code != exitOK {
		t.Fatalf("commit --all: %d %s", code, errOut)
	}
	if got, err := os.ReadFile(filepath.Join(ws, "d", "a")); err != nil || string(got) != "a\n" {
		t.Fatalf("d/a = %q, %v", got, err)
	}
	// A file where the command made its directory is still a conflict.
	code, _, stderr = runCLI(t, "exec", "--workspace", ws, "--backend", "namespace", "--", "sh", "-c", "mkdir e && echo a > e/a")
	if code != exitOK {
		t.Fatalf("exec: %d %s", code, stderr)
	}
	if err := os.WriteFile(filepath.Join(ws, "e"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCLI(t, "cow", "commit", "--all", "--workspace", ws); code == exitOK || !strings.Contains(errOut, `"e" was created`) {
		t.Fatalf("commit --all over a file made meanwhile: %d %s", code, errOut)
	}
}
