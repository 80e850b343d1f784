package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/sandbox"
)

func auditLines(t *testing.T, ws string) []audit.Event {
	t.Helper()
	path := filepath.Join(ws, ".pulse", "audit.jsonl")
	if _, err := audit.Verify(t.Context(), path); err != nil {
		t.Fatalf("audit log: %v", err)
	}
	data, _ := os.ReadFile(path)
	var out []audit.Event
	for _, l := range strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n") {
		e, err := audit.ParseLine([]byte(l))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// TestCowDecisionsAreAudited: `pulse cow commit|reject|discard|undo` go
// through the facade's review path and each leaves its events.
func TestCowDecisionsAreAudited(t *testing.T) {
	ws := t.TempDir()
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := f.Begin(t.Context(), "two files")
	tx.Write(t.Context(), "keep.txt", []byte("keep\n"), 0o644)
	tx.Write(t.Context(), "drop.txt", []byte("drop\n"), 0o644)
	f.Close()
	other := stageTx(t, ws, "other.txt", "other\n")

	for _, args := range [][]string{
		{"cow", "reject", "--workspace", ws, tx.ID(), "drop.txt"},
		{"cow", "commit", "--workspace", ws, tx.ID()},
		{"cow", "undo", "--workspace", ws},
		{"cow", "discard", "--workspace", ws, other},
	} {
		if code, out, errOut := runCLI(t, args...); code != exitOK {
			t.Fatalf("%v: %d %s %s", args, code, out, errOut)
		}
	}
	got := map[string]audit.Event{}
	for _, e := range auditLines(t, ws) {
		if e.Via != sandbox.ViaCLI || e.Actor != sandbox.OSUser() || e.Decision != "allow" {
			t.Fatalf("event not from the CLI's review path: %+v", e)
		}
		got[e.Action+" "+e.Target] = e
	}
	for key, want := range map[string]string{
		"reject drop.txt": tx.ID(), "commit keep.txt": tx.ID(), "undo " + tx.ID(): tx.ID(), "discard other.txt": other,
	} {
		if e, ok := got[key]; !ok || e.TxID != want {
			t.Errorf("no %q event for transaction %s: %v", key, want, got)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, "keep.txt")); !os.IsNotExist(err) {
		t.Errorf("keep.txt after undo: %v", err)
	}
}

// TestAuditVerifyShowsACutTail is issue 13 item 9 from the command line.
func TestAuditVerifyShowsACutTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 4)
	code, out, _ := runCLI(t, "audit", "verify", path)
	if code != exitOK || !strings.Contains(out, "head record: seq 4") || !strings.Contains(out, "not keyed") {
		t.Fatalf("intact: %d %q", code, out)
	}
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(data), "\n")
	os.WriteFile(path, []byte(strings.Join(lines[:2], "")), 0o600)
	code, _, errOut := runCLI(t, "audit", "verify", path)
	if code != exitFailure || !strings.Contains(errOut, "first bad seq: 3") || !strings.Contains(errOut, "cut from the end") {
		t.Fatalf("cut tail: %d %q", code, errOut)
	}
	os.WriteFile(path, nil, 0o600)
	code, _, errOut = runCLI(t, "audit", "verify", path)
	if code != exitFailure || !strings.Contains(errOut, "emptied") {
		t.Fatalf("emptied: %d %q", code, errOut)
	}
}

func TestAuditExportOCSF(t *testing.T) {
	ws := t.TempDir()
	id := stageTx(t, ws, "a.txt", "a\n")
	if code, _, errOut := runCLI(t, "cow", "commit", "--workspace", ws, id); code != exitOK {
		t.Fatal(errOut)
	}
	path := filepath.Join(ws, ".pulse", "audit.jsonl")
	writeAuditLog(t, path, 1)
	code, out, errOut := runCLI(t, "audit", "export", "--format", "ocsf", path)
	if code != exitOK {
		t.Fatalf("%d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	var commit, shell map[string]any
	json.Unmarshal([]byte(lines[0]), &commit)
	json.Unmarshal([]byte(lines[1]), &shell)
	if commit["class_uid"] != 1001.0 || commit["activity_id"] != 3.0 || commit["file"].(map[string]any)["path"] != "a.txt" {
		t.Fatalf("commit: %s", lines[0])
	}
	if shell["class_uid"] != 1007.0 || shell["category_uid"] != 1.0 {
		t.Fatalf("shell: %s", lines[1])
	}
	code, out, _ = runCLI(t, "audit", "export", "--format", "ecs", path)
	if code != exitOK || !strings.Contains(out, `"@timestamp"`) {
		t.Fatalf("ecs: %d %s", code, out)
	}
	if code, _, _ := runCLI(t, "audit", "export", "--format", "xml", path); code != exitUsage {
		t.Fatalf("bad format: %d", code)
	}
}

func TestAuditKeygenAndKeyedVerify(t *testing.T) {
	home := t.TempDir()
	var outb, errb strings.Builder
	env := &cliEnv{stdin: strings.NewReader(""), stdout: &outb, stderr: &errb,
		getenv: func(k string) string { return map[string]string{"HOME": home}[k] }}
	if code := run(t.Context(), env, []string{"audit", "keygen"}); code != exitOK {
		t.Fatalf("keygen: %s", errb.String())
	}
	key, err := audit.ReadKeyFile(filepath.Join(home, ".config", "pulse", "audit.key"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeAuditLog(t, path, 2, audit.WithKey(key))
	outb.Reset()
	if code := run(t.Context(), env, []string{"audit", "verify", path}); code != exitOK || !strings.Contains(outb.String(), "keyed with key "+key.ID()) {
		t.Fatalf("keyed verify: %s %s", outb.String(), errb.String())
	}
	// Without the key the keyed log cannot be checked.
	if code, _, errOut := runCLI(t, "audit", "verify", path); code != exitFailure || !strings.Contains(errOut, "keyed") {
		t.Fatalf("verify without key: %d %s", code, errOut)
	}
}
