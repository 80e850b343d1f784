package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/policy"
)

// sessionPolicy allows the shell and refuses writes under refused/.
func sessionPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte("version: 1\ndefaults: {shell: allow}\nrules:\n  - {action: write, target: \"refused/*\", decision: deny}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkSession runs the multi-step loop on sb: each command sees
// the pending writes of the ones before, a discarded transaction and a
// refused path stay invisible, a host edit is seen, many steps run, and
// commit --all applies exactly the surviving stack, the workspace being
// untouched until then. Every capturing backend must pass it.
func checkSession(t *testing.T, sb *Sandbox, steps int) {
	t.Helper()
	ctx := context.Background()
	ws := sb.Workspace()
	run := func(script string) *Result {
		t.Helper()
		res, err := sb.Execute(ctx, Command{Shell: script})
		if err != nil {
			t.Fatalf("%q: %v", script, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("%q: exit %d\nstdout %s\nstderr %s", script, res.ExitCode, res.Stdout, res.Stderr)
		}
		return res
	}
	if err := os.WriteFile(filepath.Join(ws, "base.txt"), []byte("base\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	run("echo one > a.txt && mkdir -p dir/sub && echo deep > dir/sub/f && ln -s a.txt link")
	if res := run("cat a.txt dir/sub/f link"); res.Stdout != "one\ndeep\none\n" {
		t.Fatalf("the second command does not see the first one's pending writes: %q", res.Stdout)
	}
	dropped := run("echo dropped > dropped.txt").Transaction
	if err := sb.discardID(ctx, dropped); err != nil {
		t.Fatal(err)
	}
	if res := run("test ! -e dropped.txt && echo gone"); res.Stdout != "gone\n" {
		t.Fatalf("a discarded transaction is still seen: %q", res.Stdout)
	}
	res := run("mkdir -p refused && echo no > refused/x; echo kept > kept.txt")
	if len(res.Refused) == 0 {
		t.Fatalf("the policy did not refuse refused/x: staged %v", res.Staged)
	}
	if res := run("test ! -e refused/x && cat kept.txt"); res.Stdout != "kept\n" {
		t.Fatalf("a refused path is seen, or an allowed one is not: %q", res.Stdout)
	}
	if err := os.WriteFile(filepath.Join(ws, "host.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := run("cat host.txt"); res.Stdout != "from the host\n" {
		t.Fatalf("a host edit between commands is not seen: %q", res.Stdout)
	}
	// chmod, rename, rm -r of a directory, a file replaced by a directory.
	run("chmod 600 a.txt && mv dir/sub/f dir/g && rm -r dir/sub && rm base.txt && mkdir base.txt && echo in > base.txt/inner")
	if res := run("stat -c %a a.txt; cat dir/g base.txt/inner; test ! -e dir/sub && echo nosub"); res.Stdout != "600\ndeep\nin\nnosub\n" {
		t.Fatalf("chmod/rename/rm -r/replace across steps: %q", res.Stdout)
	}
	for i := 0; i < steps; i++ {
		run(fmt.Sprintf("n=$(cat count 2>/dev/null || echo 0); echo $((n+1)) > count; echo %d > step-%d", i, i%5))
	}
	if res := run("cat count"); res.Stdout != fmt.Sprintf("%d\n", steps) {
		t.Fatalf("after %d steps count is %q", steps, res.Stdout)
	}
	if got, err := sb.ReadFile(ctx, "count"); err != nil || string(got) != fmt.Sprintf("%d\n", steps) {
		t.Fatalf("ReadFile through the stack: %q %v", got, err)
	}
	if _, err := sb.ReadCommittedFile(ctx, "count"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadCommittedFile of a pending-only file: %v", err)
	}

	// The workspace is untouched until commit --all.
	entries, _ := os.ReadDir(ws)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != ".pulse base.txt host.txt" {
		t.Fatalf("the workspace changed before commit: %v", names)
	}
	if _, err := sb.CommitAll(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"a.txt": "one\n", "dir/g": "deep\n", "base.txt/inner": "in\n", "kept.txt": "kept\n",
		"host.txt": "from the host\n", "count": fmt.Sprintf("%d\n", steps),
	}
	for p, w := range want {
		if b, err := os.ReadFile(filepath.Join(ws, p)); err != nil || string(b) != w {
			t.Errorf("%s after commit --all: %q %v, want %q", p, b, err, w)
		}
	}
	for _, p := range []string{"dropped.txt", "refused/x", "dir/sub"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); !os.IsNotExist(err) {
			t.Errorf("%s after commit --all: %v", p, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(ws, "a.txt")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("a.txt mode after commit --all: %v %v", fi, err)
	}
	if tgt, err := os.Readlink(filepath.Join(ws, "link")); err != nil || tgt != "a.txt" {
		t.Errorf("link: %q %v", tgt, err)
	}
	if st, err := sb.Stack(ctx); err != nil || len(st) != 0 {
		t.Errorf("stack after commit --all: %v %v", st, err)
	}
}

// discardID discards one pending transaction through the facade.
func (s *Sandbox) discardID(ctx context.Context, id string) error {
	tx, err := s.OpenTx(ctx, id)
	if err != nil {
		return err
	}
	return tx.Discard(ctx)
}

func TestSessionNamespace(t *testing.T) {
	sb := newIsolated(t, t.TempDir(), WithPolicy(sessionPolicy(t)))
	checkSession(t, sb, 30)
}

// A stack past WithMaxStack is squashed, and the session goes on the same.
func TestSessionSquashesPastTheBound(t *testing.T) {
	sb := newIsolated(t, t.TempDir(), WithPolicy(sessionPolicy(t)), WithMaxStack(8))
	checkSession(t, sb, 30)
	evs := verifyAudit(t, sb)
	n := 0
	for _, e := range evs {
		if e.Action == "squash" {
			n++
		}
	}
	if n == 0 {
		t.Error("no squash audited")
	}
}

func TestSessionDocker(t *testing.T) {
	checkSession(t, newDocker(t, t.TempDir(), WithPolicy(sessionPolicy(t))), 30)
}

// A path the policy denies never lands through a transaction, however it
// got staged: the facade's Tx refuses it when staged, and Commit refuses a
// transaction holding it (here staged through cowfs directly).
func TestTxChecksThePolicyAtStageAndAtCommit(t *testing.T) {
	p, err := policy.Parse([]byte("version: 1\nrules:\n  - {action: write, target: \".github/*\", decision: deny}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	sb := newHost(t, ws, WithPolicy(p))
	ctx := context.Background()
	tx, err := sb.BeginTx(ctx, "edit")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, ".github/x", []byte("y"), 0o644); !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("staging a denied path: %v", err)
	}
	if err := tx.Write(ctx, "ok.txt", []byte("fine"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Staged around the facade, through cowfs itself.
	cow, err := cowfs.Open(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	defer cow.Close()
	raw, err := cow.Tx(ctx, tx.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Write(ctx, ".github/x", []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(ctx); !errors.Is(err, ErrPolicyDenied) {
		t.Fatalf("committing a transaction holding a denied path: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(ws, ".github")); !os.IsNotExist(err) {
		t.Fatalf(".github landed: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "ok.txt")); !os.IsNotExist(err) {
		t.Fatalf("part of a refused transaction landed: %v", err)
	}
}
