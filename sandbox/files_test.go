package sandbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

func names(ents []fs.DirEntry) []string {
	out := make([]string, len(ents))
	for i, e := range ents {
		out[i] = e.Name()
		if e.IsDir() {
			out[i] += "/"
		}
	}
	return out
}

// TestFilesThroughPendingStack: List, Stat and ReadFile show what a
// command and a process wrote (pending, not committed) over the
// workspace, and WriteFile stages under the write policy and the secret
// check.
func TestFilesThroughPendingStack(t *testing.T) {
	ws := t.TempDir()
	for name, data := range map[string]string{"keep.txt": "keep\n", "gone.txt": "gone\n", "edit.txt": "old\n", ".env": "X=1\n"} {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pol := policy.Default()
	pol.Rules = append([]policy.Rule{
		{Action: policy.Read, Target: ".env", Decision: policy.Deny},
		{Action: policy.Write, Target: "locked/*", Decision: policy.Deny},
	}, pol.Rules...)
	const secret = "sekret-value-123456"
	sb := newIsolated(t, ws, WithPolicy(pol), WithSecrets([]secrets.Secret{{Name: "TOKEN", Value: secret}}))
	ctx := context.Background()

	events, err := sb.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Execute(ctx, Command{Shell: "rm gone.txt; echo new > edit.txt; mkdir -p a/b && echo deep > a/b/c.txt"}); err != nil {
		t.Fatal(err)
	}
	p, err := sb.Start(ctx, Command{Shell: "echo served > log.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	id, err := sb.WriteFile(ctx, "w/written.txt", []byte("via the API\n"), 0o600)
	if err != nil || id == "" {
		t.Fatalf("WriteFile = %q, %v", id, err)
	}

	ents, err := sb.List(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(ents), []string{"a/", "edit.txt", "keep.txt", "log.txt", "w/"}; !slices.Equal(got, want) {
		t.Errorf("List(.) = %v, want %v", got, want)
	}
	if ents, err := sb.List(ctx, "a/b"); err != nil || !slices.Equal(names(ents), []string{"c.txt"}) {
		t.Errorf("List(a/b) = %v, %v", names(ents), err)
	}
	if _, err := sb.List(ctx, "gone.txt"); err == nil {
		t.Error("List of a deleted file succeeded")
	}
	if fi, err := sb.Stat(ctx, "edit.txt"); err != nil || fi.Size() != 4 || fi.IsDir() {
		t.Errorf("Stat(edit.txt) = %v, %v; want 4 bytes", fi, err)
	}
	if fi, err := sb.Stat(ctx, "a"); err != nil || !fi.IsDir() {
		t.Errorf("Stat(a) = %v, %v; want a directory", fi, err)
	}
	if fi, err := sb.Stat(ctx, "w/written.txt"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("Stat(w/written.txt) = %v, %v; want mode 0600", fi, err)
	}
	if _, err := sb.Stat(ctx, "gone.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(gone.txt) = %v, want ErrNotExist", err)
	}
	if _, err := sb.Stat(ctx, ".env"); !errors.Is(err, ErrPolicyDenied) {
		t.Errorf("Stat(.env) = %v, want ErrPolicyDenied", err)
	}
	if _, err := sb.List(ctx, ".pulse"); !errors.Is(err, ErrPolicyDenied) {
		t.Errorf("List(.pulse) = %v, want ErrPolicyDenied", err)
	}
	for name, want := range map[string]string{"a/b/c.txt": "deep\n", "log.txt": "served\n", "w/written.txt": "via the API\n", "edit.txt": "new\n"} {
		if got, err := sb.ReadFile(ctx, name); err != nil || string(got) != want {
			t.Errorf("ReadFile(%s) = %q, %v; want %q", name, got, err, want)
		}
	}
	// Nothing reached the workspace.
	if b, _ := os.ReadFile(filepath.Join(ws, "edit.txt")); string(b) != "old\n" {
		t.Errorf("workspace edit.txt = %q: a pending write landed", b)
	}

	if _, err := sb.WriteFile(ctx, "locked/x", []byte("x"), 0o644); !errors.Is(err, ErrPolicyDenied) {
		t.Errorf("WriteFile to a denied path = %v, want ErrPolicyDenied", err)
	}
	if _, err := sb.WriteFile(ctx, "leak.txt", []byte("token="+secret), 0o644); !errors.Is(err, ErrSecretInContent) {
		t.Errorf("WriteFile with a secret = %v, want ErrSecretInContent", err)
	}
	if _, err := sb.Stat(ctx, "leak.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused write left leak.txt: %v", err)
	}

	want := map[string]FileOp{"gone.txt": FileRemoved, "edit.txt": FileChanged, "a/b/c.txt": FileCreated,
		"log.txt": FileCreated, "w/written.txt": FileCreated}
	got := map[string]FileOp{}
	timeout := time.After(10 * time.Second)
	for len(got) < len(want) {
		select {
		case ev := <-events:
			if ev.Path == "a" || ev.Path == "a/b" || ev.Path == "w" {
				continue // the directories on the way
			}
			got[ev.Path] = ev.Op
		case <-timeout:
			t.Fatalf("events so far %v, want %v", got, want)
		}
	}
	for p, op := range want {
		if got[p] != op {
			t.Errorf("event for %s = %q, want %q", p, got[p], op)
		}
	}
	if _, err := sb.DiscardAll(ctx); err != nil {
		t.Fatal(err)
	}
	settled := map[string]bool{}
	timeout = time.After(10 * time.Second)
	for !settled["edit.txt"] || !settled["log.txt"] {
		select {
		case ev := <-events:
			if ev.Op == FileSettled {
				settled[ev.Path] = true
			}
		case <-timeout:
			t.Fatalf("after DiscardAll, settled events %v", settled)
		}
	}
	sb.Close()
	if _, ok := <-events; ok {
		for range events {
		}
	}
}

// TestReadFilePendingLinkThroughAWorkspaceLink: a pending link to a
// workspace path that is itself a link (to a file, or through a
// directory) is read only when the read policy allows where that path
// resolves, as a read of the workspace path itself is.
func TestReadFilePendingLinkThroughAWorkspaceLink(t *testing.T) {
	ws := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(ws, "key.pem"), []byte("PEM-SECRET\n"), 0o600))
	must(os.Mkdir(filepath.Join(ws, "private"), 0o755))
	must(os.WriteFile(filepath.Join(ws, "private", "token"), []byte("TOKEN-SECRET\n"), 0o600))
	must(os.WriteFile(filepath.Join(ws, "a.txt"), []byte("plain\n"), 0o644))
	must(os.Symlink("key.pem", filepath.Join(ws, "b")))
	must(os.Symlink("private", filepath.Join(ws, "d")))
	must(os.Symlink("a.txt", filepath.Join(ws, "c")))
	pol := policy.Default()
	pol.Rules = append([]policy.Rule{
		{Action: policy.Read, Target: "*.pem", Decision: policy.Deny},
		{Action: policy.Read, Target: "private/**", Decision: policy.Deny},
	}, pol.Rules...)
	sb := newIsolated(t, ws, WithPolicy(pol))
	ctx := context.Background()
	if res, err := sb.Execute(ctx, Command{Shell: "ln -s b toB && ln -s d/token toT && ln -s c toC"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("Execute = %+v, %v", res, err)
	}
	for _, name := range []string{"b", "d/token", "toB", "toT"} {
		if b, err := sb.ReadFile(ctx, name); !errors.Is(err, ErrPolicyDenied) {
			t.Errorf("ReadFile(%s) = %q, %v; want ErrPolicyDenied", name, b, err)
		}
	}
	if b, err := sb.ReadFile(ctx, "toC"); err != nil || string(b) != "plain\n" {
		t.Errorf("ReadFile(toC) = %q, %v; want plain", b, err)
	}
}
