package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
)

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// stageFiles stages files in a new transaction of ws from outside any
// sandbox, as a command's overlay would end up.
func stageFiles(t *testing.T, ws string, files map[string]string) string {
	t.Helper()
	f, err := cowfs.Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tx, err := f.Begin(t.Context(), "test")
	if err != nil {
		t.Fatal(err)
	}
	for p, data := range files {
		if err := tx.Write(t.Context(), p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return tx.ID()
}

// reviewEvents verifies the workspace's audit log and returns its events
// with the given action.
func reviewEvents(t *testing.T, ws string, opts ...audit.VerifyOption) map[string][]audit.Event {
	t.Helper()
	path := filepath.Join(ws, ".pulse", "audit.jsonl")
	if _, err := audit.Verify(t.Context(), path, opts...); err != nil {
		t.Fatalf("audit log: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]audit.Event{}
	for _, line := range bytes.SplitAfter(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		e, err := audit.ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		out[e.Action] = append(out[e.Action], e)
	}
	return out
}

func TestReviewActionsAreAudited(t *testing.T) {
	ws := t.TempDir()
	ctx := context.Background()
	keep := stageFiles(t, ws, map[string]string{"a.txt": "accepted\n", "b.txt": "rejected\n"})
	drop := stageFiles(t, ws, map[string]string{"c.txt": "discarded\n"})
	r, err := OpenReview(ctx, ws, ReviewVia(ViaReviewPage), ReviewSession("page-42"), ReviewActor("alice"), ReviewGetenv(noEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pending, err := r.Pending(ctx)
	if err != nil || len(pending) != 2 || pending[0].ID != keep || pending[1].ID != drop {
		t.Fatalf("pending %+v %v", pending, err)
	}
	paths, err := r.CommitPaths(ctx, keep, []string{"a.txt"})
	if err != nil || len(paths) != 1 || paths[0] != "a.txt" {
		t.Fatalf("commit: %q %v", paths, err)
	}
	if err := r.Discard(ctx, drop); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Undo(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Discard(ctx, "0000000000000000"); !errors.Is(err, cowfs.ErrNotFound) {
		t.Fatalf("discard of no transaction: %v", err)
	}

	evs := reviewEvents(t, ws)
	check := func(e audit.Event, action, txID, target, decision, content string) {
		t.Helper()
		if e.Action != action || e.TxID != txID || e.Target != target || e.Decision != decision || e.ContentSHA256 != content ||
			e.Actor != "alice" || e.Via != ViaReviewPage || e.SessionID != "page-42" {
			t.Errorf("event %+v, want %s %s %s %s %s by alice via the page", e, action, txID, target, decision, content)
		}
	}
	if len(evs["reject"]) != 1 || len(evs["commit"]) != 1 || len(evs["discard"]) != 2 || len(evs["undo"]) != 1 {
		t.Fatalf("events: reject %d commit %d discard %d undo %d", len(evs["reject"]), len(evs["commit"]), len(evs["discard"]), len(evs["undo"]))
	}
	check(evs["reject"][0], "reject", keep, "b.txt", "allow", sha("rejected\n"))
	check(evs["commit"][0], "commit", keep, "a.txt", "allow", sha("accepted\n"))
	check(evs["discard"][0], "discard", drop, "c.txt", "allow", sha("discarded\n"))
	check(evs["undo"][0], "undo", keep, keep, "allow", "")
	check(evs["discard"][1], "discard", "0000000000000000", "0000000000000000", "deny", "")
}

func TestSDKCommitAndDiscardGoThroughReview(t *testing.T) {
	ws := t.TempDir()
	ctx := context.Background()
	sb := newHost(t, ws, WithSessionID("sess-1"))
	tx, err := sb.BeginTx(ctx, "sdk")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, "x.txt", []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx2, _ := sb.BeginTx(ctx, "sdk 2")
	if err := tx2.Write(ctx, "y.txt", []byte("y\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tx2.Discard(ctx); err != nil {
		t.Fatal(err)
	}
	evs := reviewEvents(t, ws)
	c, d := evs["commit"], evs["discard"]
	if len(c) != 1 || c[0].Target != "x.txt" || c[0].TxID != tx.ID() || c[0].Via != ViaSDK || c[0].Actor != OSUser() ||
		c[0].ContentSHA256 != sha("x\n") || c[0].SessionID != "sess-1" {
		t.Fatalf("commit events %+v", c)
	}
	if len(d) != 1 || d[0].Target != "y.txt" || d[0].TxID != tx2.ID() || d[0].Via != ViaSDK || d[0].ContentSHA256 != sha("y\n") {
		t.Fatalf("discard events %+v", d)
	}
}

func TestReviewConflictIsAuditedAsDenied(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644)
	id := stageFiles(t, ws, map[string]string{"a.txt": "two\n"})
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("changed meanwhile\n"), 0o644)
	r, err := OpenReview(context.Background(), ws, ReviewGetenv(noEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Commit(context.Background(), id); !errors.Is(err, cowfs.ErrConflict) {
		t.Fatalf("commit: %v", err)
	}
	c := reviewEvents(t, ws)["commit"]
	if len(c) != 1 || c[0].Decision != "deny" || c[0].Target != "a.txt" || c[0].Reason != "conflict: modified" {
		t.Fatalf("%+v", c)
	}
}

func TestReviewKeyedAndKeyInsideWorkspaceRefused(t *testing.T) {
	ws := t.TempDir()
	home := t.TempDir()
	env := map[string]string{"HOME": home}
	getenv := func(k string) string { return env[k] }
	key, err := audit.KeyGen(audit.DefaultKeyFile(getenv))
	if err != nil {
		t.Fatal(err)
	}
	id := stageFiles(t, ws, map[string]string{"a.txt": "a"})
	r, err := OpenReview(context.Background(), ws, ReviewGetenv(getenv))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Discard(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	r.Close()
	evs := reviewEvents(t, ws, audit.VerifyKey(key))
	if d := evs["discard"]; len(d) != 1 || d[0].KeyID != key.ID() {
		t.Fatalf("%+v", d)
	}
	inside := filepath.Join(ws, "audit.key")
	if _, err := audit.KeyGen(inside); err != nil {
		t.Fatal(err)
	}
	env[audit.KeyFileEnv] = inside
	if _, err := OpenReview(context.Background(), ws, ReviewGetenv(getenv)); err == nil {
		t.Fatal("a key inside the workspace was accepted")
	}
}

// An auto-commit goes through the same review path, marked as such.
func TestAutoCommitIsAuditedAsAutoCommit(t *testing.T) {
	ws := t.TempDir()
	// ovBackend stands in for a capturing backend: it returns the overlay
	// a command would have written.
	be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{{Path: "out.txt", Mode: 0o644, Data: []byte("out\n")}}}}
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackend(be), WithAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(context.Background(), Command{Args: []string{"x"}})
	if err != nil || res.CommitErr != nil || len(res.Committed) != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	c := reviewEvents(t, ws)["commit"]
	if len(c) != 1 || c[0].Via != ViaAutoCommit || c[0].ExecutionID == "" || c[0].ContentSHA256 != sha("out\n") || c[0].TxID == "" {
		t.Fatalf("%+v", c)
	}
}

// A partial commit that is refused leaves the transaction whole.
func TestRefusedPartialCommitPutsRejectedBack(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("one\n"), 0o644)
	id := stageFiles(t, ws, map[string]string{"a.txt": "two\n", "b.txt": "b\n"})
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("changed meanwhile\n"), 0o644)
	r, err := OpenReview(context.Background(), ws, ReviewGetenv(noEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.CommitPaths(context.Background(), id, []string{"a.txt"}); !errors.Is(err, cowfs.ErrConflict) {
		t.Fatalf("commit: %v", err)
	}
	tx, err := r.FS().Tx(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tx.Changes()); n != 2 {
		t.Fatalf("%d changes left, want both", n)
	}
	evs := reviewEvents(t, ws)
	if len(evs["reject"]) != 0 || len(evs["commit"]) != 1 || evs["commit"][0].Decision != "deny" {
		t.Fatalf("events %+v", evs)
	}
}
