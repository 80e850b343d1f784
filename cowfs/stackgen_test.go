package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// checkFresh fails unless r's stack (read after r read it before, so
// from its cache when it may) is the stack a newly opened FS reads.
func checkFresh(t *testing.T, step string, r *FS, ws string) {
	t.Helper()
	got := stack(t, r)
	fresh, err := Open(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	want := stack(t, fresh)
	if got.Key() != want.Key() || !slices.Equal(ids(got), ids(want)) {
		t.Fatalf("after %s: cached stack %v (key %q), fresh %v (key %q)", step, ids(got), got.Key(), ids(want), want.Key())
	}
	for _, e := range want.View() {
		if g, w := seen(t, got, e.Path), seen(t, want, e.Path); g != w {
			t.Fatalf("after %s: %s is %q in the cached stack, %q fresh", step, e.Path, g, w)
		}
	}
	for _, e := range got.View() {
		if _, decided, _ := want.Lookup(e.Path); !decided {
			t.Fatalf("after %s: the cached stack still shows %s", step, e.Path)
		}
	}
}

// The stack a process read before is never reused once anything changed
// the staging area, whoever changed it: this FS, another FS on the same
// workspace (its own lock file description, as another process has), or
// a hand edit of the tx directory.
func TestStackGenerationSeesEveryChange(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "base.txt", "base\n", 0o644)
	r, w := openFS(t, ws), openFS(t, ws)
	ctx := t.Context()
	a := stageCmd(t, w, "a", WriteOp("a.txt", []byte("a1"), 0o644))
	checkFresh(t, "begin+stage", r, ws)
	checkFresh(t, "nothing", r, ws)
	if st := stack(t, r); st.Txs[0] != stack(t, r).Txs[0] {
		t.Fatal("an unchanged stack was read again") // the cache is used at all
	}
	b := stageCmd(t, w, "b", WriteOp("b.txt", []byte("b1"), 0o644), WriteOp("a.txt", []byte("a2"), 0o644))
	checkFresh(t, "second tx", r, ws)
	// An append to a transaction already in the stack: the set of
	// transactions and the tx directory stay the same.
	txB, err := w.Tx(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := txB.Write(ctx, "b.txt", []byte("b2"), 0o644); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "append to a stacked tx", r, ws)
	if err := txB.Delete(ctx, "base.txt"); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "delete staged", r, ws)
	if _, err := txB.Unstage(ctx, "base.txt"); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "unstage", r, ws)
	c := stageCmd(t, w, "c", WriteOp("c.txt", []byte("c"), 0o644))
	txC, err := w.Tx(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := txC.Discard(ctx); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "discard", r, ws)
	if _, _, err := w.Squash(ctx, 2); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "squash", r, ws)
	if _, err := w.Fork(ctx); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "fork", r, ws)
	d := stageCmd(t, w, "d", WriteOp("d.txt", []byte("d"), 0o644))
	checkFresh(t, "tx above the squash", r, ws)
	txD, err := w.Tx(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := txD.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "commit", r, ws)
	// r's own changes, read by r.
	e := stageCmd(t, r, "e", WriteOp("e.txt", []byte("e"), 0o644))
	checkFresh(t, "own tx", r, ws)
	// By hand, without the lock (a person's rm -r): the tx directory
	// changed.
	if err := os.RemoveAll(filepath.Join(ws, StateDir, "tx", e)); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "tx removed by hand", r, ws)
	// The lock file removed: a new generation, never the old one again.
	stack(t, r)
	if err := os.Remove(filepath.Join(ws, StateDir, "lock")); err != nil {
		t.Fatal(err)
	}
	stageCmd(t, w, "f", WriteOp("f.txt", []byte("f"), 0o644))
	checkFresh(t, "lock file made again", r, ws)
	if _, _, err := w.CommitAll(ctx); err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "commit --all", r, ws)
	if st := stack(t, r); len(st.Txs) != 0 {
		t.Fatalf("after commit --all: %v", ids(st))
	}
	_ = a
}

// A process killed in the middle of a change (its stage record durable,
// the call never returned) leaves a new generation behind: the stack
// another process read before is not trusted again.
func TestStackGenerationCrashMidChange(t *testing.T) {
	ws := newWS(t)
	r := openFS(t, ws)
	tx, err := r.Begin(t.Context(), "staging crash")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(t.Context(), "first", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := stack(t, r).Key()
	if stack(t, r).Key() != before {
		t.Fatal("stack changed by itself")
	}
	cmd := helperCmd(ws, tx.ID(), "PULSE_COWFS_HELPER=stage", failpointEnv(fpStageAppended, 3))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
		t.Fatalf("helper not killed: %v\n%s", err, out)
	}
	checkFresh(t, "a writer killed mid-stage", r, ws)
	st := stack(t, r)
	if st.Key() == before || seen(t, st, "s02") != fmt.Sprint("staged ", 2) {
		t.Fatalf("the cached stack hides the killed writer's durable records: key %q, s02 %q", st.Key(), seen(t, st, "s02"))
	}
}

// A generation is written under the lock by every holder but a stack
// reader, before the holder changes anything.
func TestStackGenerationBumpedByWriters(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	read := func() []byte {
		b, err := os.ReadFile(filepath.Join(ws, StateDir, "lock"))
		if err != nil || len(b) < genSize {
			t.Fatalf("lock file: %q, %v", b, err)
		}
		return b[:genSize]
	}
	stack(t, f)
	g0 := read()
	stack(t, f)
	if g := read(); !slices.Equal(g, g0) {
		t.Fatal("a stack read changed the generation")
	}
	unlock, err := f.lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	g1 := read()
	unlock()
	if slices.Equal(g1, g0) {
		t.Fatal("taking the lock to change the staging area kept the generation")
	}
}
