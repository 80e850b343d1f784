package cowfs

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// stageCmd stages ops in a new transaction, as the facade does with a
// command's overlay.
func stageCmd(t *testing.T, f *FS, desc string, ops ...Op) string {
	t.Helper()
	tx, err := f.Begin(t.Context(), desc)
	if err != nil {
		t.Fatal(err)
	}
	errs, err := tx.Stage(context.Background(), ops)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("%s: op %d (%s %s): %v", desc, i, ops[i].Kind, ops[i].Path, e)
		}
	}
	return tx.ID()
}

func stack(t *testing.T, f *FS) *Stack {
	t.Helper()
	st, err := f.Stack(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// seen is what the stack shows at p: its content, "<absent>", or
// "<ws>" when the workspace shows through.
func seen(t *testing.T, st *Stack, p string) string {
	t.Helper()
	e, decided, err := st.Lookup(p)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case !decided:
		return "<ws>"
	case e == nil:
		return "<absent>"
	case e.Kind == KindMkdir:
		return "<dir>"
	case e.Kind == KindSymlink:
		return "->" + e.Target
	}
	r, err := e.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}

func TestStackViewOrderAndWhiteouts(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "keep.txt", "keep\n", 0o644)
	writeFile(t, ws, "old/x.txt", "x\n", 0o644)
	f := openFS(t, ws)

	a := stageCmd(t, f, "one", WriteOp("a.txt", []byte("one\n"), 0o644), WriteOp("d/n.txt", []byte("n\n"), 0o644))
	stageCmd(t, f, "two", WriteOp("a.txt", []byte("two\n"), 0o644), WhiteoutOp("d/n.txt"), WhiteoutOp("old"))
	st := stack(t, f)
	if len(st.Txs) != 2 || st.Txs[0].ID != a {
		t.Fatalf("stack order: %+v", st.Txs)
	}
	for p, want := range map[string]string{
		"a.txt": "two\n", "d/n.txt": "<absent>", "old": "<absent>", "old/x.txt": "<absent>", "keep.txt": "<ws>", "d": "<dir>",
	} {
		if got := seen(t, st, p); got != want {
			t.Errorf("%s: got %q, want %q", p, got, want)
		}
	}
	// old/ is in the workspace, so WhiteoutOp staged a real deletion; d/n.txt
	// only existed below, so it is a whiteout.
	if got := st.Txs[1].whiteouts; len(got) != 1 || got[0] != "d/n.txt" {
		t.Errorf("whiteouts: %v", got)
	}
	d, err := st.TxDiff(st.Txs[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d, "-one\n+two\n") || !strings.Contains(d, "deleted file mode") || !strings.Contains(d, "d/n.txt") {
		t.Errorf("diff of the second command against the first:\n%s", d)
	}
	whole, err := st.Diff()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(whole, "n.txt") || !strings.Contains(whole, "+two\n") || !strings.Contains(whole, "old/x.txt") {
		t.Errorf("diff of the stack:\n%s", whole)
	}

	paths, ids, err := f.CommitAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 {
		t.Errorf("committed %v", ids)
	}
	if got := readFile(t, ws, "a.txt"); got != "two\n" {
		t.Errorf("a.txt = %q", got)
	}
	for _, p := range []string{"d/n.txt", "old"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); !os.IsNotExist(err) {
			t.Errorf("%s should not exist after commit --all: %v (paths %v)", p, err, paths)
		}
	}
	if st := stack(t, f); len(st.Txs) != 0 {
		t.Errorf("stack after commit --all: %+v", st.Txs)
	}
}

func TestStackReplaceAcrossSteps(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "f", "file\n", 0o644)
	f := openFS(t, ws)
	// A file replaced by a directory, a directory (made below) replaced by
	// a file, a symlink.
	stageCmd(t, f, "mkdir", WriteOp("dir/a", []byte("a"), 0o644), WriteOp("dir/sub/b", []byte("b"), 0o600))
	stageCmd(t, f, "replace", DeleteOp("f"), WriteOp("f/inner", []byte("in"), 0o644), WhiteoutOp("dir"), WriteOp("dir", []byte("now a file"), 0o644))
	stageCmd(t, f, "link", SymlinkOp("f/inner", "l"))
	st := stack(t, f)
	for p, want := range map[string]string{"f/inner": "in", "dir": "now a file", "dir/a": "<absent>", "dir/sub/b": "<absent>", "l": "->f/inner", "f": "<dir>"} {
		if got := seen(t, st, p); got != want {
			t.Errorf("%s: got %q, want %q", p, got, want)
		}
	}
	if _, _, err := f.CommitAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "f/inner") != "in" || readFile(t, ws, "dir") != "now a file" {
		t.Error("commit --all did not apply the surviving stack")
	}
	if tgt, err := os.Readlink(filepath.Join(ws, "l")); err != nil || tgt != "f/inner" {
		t.Errorf("link: %q %v", tgt, err)
	}
}

func TestStackDependencies(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	a := stageCmd(t, f, "a", WriteOp("new/a", []byte("a"), 0o644))
	b := stageCmd(t, f, "b", WriteOp("new/b", []byte("b"), 0o644))
	c := stageCmd(t, f, "c", WriteOp("new/a", []byte("a2"), 0o644))
	st := stack(t, f)
	// b only shares the new directory with a: independent.
	if err := st.CheckDiscard(b); err != nil {
		t.Errorf("discard b: %v", err)
	}
	var se *StackError
	if err := st.CheckDiscard(a); !errors.As(err, &se) || !errors.Is(err, ErrStackDependency) || se.Others[0] != c {
		t.Errorf("discard a under c: %v", err)
	}
	if err := st.CheckCommit(c); !errors.Is(err, ErrStackDependency) {
		t.Errorf("commit c over a: %v", err)
	}
	if err := st.CheckCommit(b); err != nil {
		t.Errorf("commit b: %v", err)
	}
	if err := st.CheckDiscard(c); err != nil {
		t.Errorf("discard the top: %v", err)
	}
}

// TestFSCheckCommit: the FS's check, which skips reading the stack when
// one transaction is pending, refuses what the stack's refuses.
func TestFSCheckCommit(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	ctx := context.Background()
	a := stageCmd(t, f, "a", WriteOp("new/a", []byte("a"), 0o644))
	if err := f.CheckCommit(ctx, a); err != nil {
		t.Errorf("commit a alone: %v", err)
	}
	b := stageCmd(t, f, "b", WriteOp("new/b", []byte("b"), 0o644))
	c := stageCmd(t, f, "c", WriteOp("new/a", []byte("a2"), 0o644))
	var se *StackError
	if err := f.CheckCommit(ctx, c); !errors.As(err, &se) || !errors.Is(err, ErrStackDependency) || se.Others[0] != a {
		t.Errorf("commit c over a: %v", err)
	}
	if err := f.CheckCommit(ctx, b); err != nil {
		t.Errorf("commit b: %v", err)
	}
}

func TestStackSquashKeepsViewAndOrder(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "w", "w\n", 0o644)
	f := openFS(t, ws)
	for i := 0; i < 20; i++ {
		stageCmd(t, f, "step", WriteOp("count", []byte{byte('a' + i)}, 0o644), WriteOp("f"+string(rune('a'+i)), []byte("x"), 0o644))
	}
	stageCmd(t, f, "rm", DeleteOp("w"), WhiteoutOp("fa"))
	top := stageCmd(t, f, "top", WriteOp("count", []byte("top"), 0o644))
	before := stack(t, f)
	wantView := map[string]string{}
	for _, e := range before.View() {
		wantView[e.Path] = seen(t, before, e.Path)
	}
	id, gone, err := f.Squash(context.Background(), 21)
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 21 {
		t.Fatalf("squashed %d", len(gone))
	}
	after := stack(t, f)
	if len(after.Txs) != 2 || after.Txs[0].ID != id || after.Txs[1].ID != top {
		t.Fatalf("after squash: %+v", after.Txs)
	}
	for p, want := range wantView {
		if got := seen(t, after, p); got != want {
			t.Errorf("%s: %q after squash, %q before", p, got, want)
		}
	}
	if _, _, err := f.CommitAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if readFile(t, ws, "count") != "top" {
		t.Error("count")
	}
	if _, err := os.Lstat(filepath.Join(ws, "w")); !os.IsNotExist(err) {
		t.Error("w survived")
	}
	if _, err := os.Lstat(filepath.Join(ws, "fa")); !os.IsNotExist(err) {
		t.Error("fa survived its whiteout")
	}
}

// A squash interrupted after writing its result: the originals are
// removed by the next reader, and the view is the same meanwhile.
func TestStackInterruptedSquash(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	a := stageCmd(t, f, "a", WriteOp("x", []byte("1"), 0o644))
	stageCmd(t, f, "b", WriteOp("x", []byte("2"), 0o644))
	st := stack(t, f)
	v := newFold()
	for _, tx := range st.Txs {
		v.apply(tx)
	}
	recs, blobs := squashRecs(v)
	s := &Tx{fs: f, id: newID(), desc: "squash", created: st.Txs[1].Created, squashes: []string{a, st.Txs[1].ID}, changes: map[string]*change{}}
	unlock, err := f.lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	err = f.createTx(s, recs, blobs)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	f2 := openFS(t, ws)
	st2 := stack(t, f2)
	if len(st2.Txs) != 1 || st2.Txs[0].ID != s.id || seen(t, st2, "x") != "2" {
		t.Fatalf("after an interrupted squash: %+v", st2.Txs)
	}
}

// A damaged transaction is left out of the view and reported.
func TestStackDamagedLeftOut(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	stageCmd(t, f, "good", WriteOp("g", []byte("g"), 0o644))
	bad := stageCmd(t, f, "bad", WriteOp("b", []byte("b"), 0o644))
	log := filepath.Join(ws, StateDir, "tx", bad, "stage.log")
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0xff // inside the last record: a checksum mismatch
	if err := os.WriteFile(log, b, 0o600); err != nil {
		t.Fatal(err)
	}
	st := stack(t, openFS(t, ws))
	if len(st.Txs) != 1 || len(st.Damaged) != 1 || st.Damaged[0].ID != bad || !errors.Is(st.Damaged[0].Err, ErrRecovery) {
		t.Fatalf("txs %+v damaged %+v", st.Txs, st.Damaged)
	}
	if seen(t, st, "b") != "<ws>" || seen(t, st, "g") != "g" {
		t.Error("the damaged transaction leaked into the view")
	}
}

// damageCases damage the transaction whose state directory is dir in the
// ways that leave it out of the stack as damaged.
var damageCases = map[string]func(t *testing.T, dir string){
	"stage log checksum": func(t *testing.T, dir string) {
		damageFile(t, filepath.Join(dir, "stage.log"), func(b []byte) []byte { b[len(b)-3] ^= 0xff; return b })
	},
	"stage log cut inside its begin record": func(t *testing.T, dir string) {
		damageFile(t, filepath.Join(dir, "stage.log"), func(b []byte) []byte { return b[:frameHeader+2] })
	},
	"quarantined by recovery": func(t *testing.T, dir string) {
		if err := os.WriteFile(filepath.Join(dir, "quarantine"), []byte("test\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	},
}

// damagedStack is a stack of three transactions, each made on top of the
// one below (f: v0 in the workspace, then v1, v2, v3; the middle one
// makes d, the top one writes in it), whose middle one is damaged, seen
// by a new FS.
type damagedStack struct {
	ws                string
	f                 *FS
	below, bad, above string
	tree              map[string]string // the workspace, before
}

func newDamagedStack(t *testing.T, damage func(t *testing.T, dir string)) *damagedStack {
	t.Helper()
	ws := newWS(t)
	writeFile(t, ws, "f", "v0", 0o644)
	f := openFS(t, ws)
	s := &damagedStack{ws: ws}
	s.below = stageCmd(t, f, "below", WriteOp("f", []byte("v1"), 0o644))
	s.bad = stageCmd(t, f, "damaged", WriteOp("f", []byte("v2"), 0o644), MkdirOp("d", 0o755))
	s.above = stageCmd(t, f, "above", WriteOp("f", []byte("v3"), 0o644), WriteOp("d/x", []byte("x"), 0o644))
	damage(t, filepath.Join(ws, StateDir, "tx", s.bad))
	s.tree = snapshotTree(t, ws)
	s.f = openFS(t, ws)
	return s
}

// check fails unless the workspace is as it was and the stack holds txs
// and, left out as damaged, the damaged one.
func (s *damagedStack) check(t *testing.T, op string, txs ...string) {
	t.Helper()
	if !equalTrees(s.tree, snapshotTree(t, s.ws)) {
		t.Fatalf("%s over a damaged transaction changed the workspace", op)
	}
	st := stack(t, s.f)
	var ids []string
	for _, tx := range st.Txs {
		ids = append(ids, tx.ID)
	}
	if !slices.Equal(ids, txs) || len(st.Damaged) != 1 || st.Damaged[0].ID != s.bad {
		t.Fatalf("after %s: txs %v (want %v), damaged %+v", op, ids, txs, st.Damaged)
	}
}

// TestCommitAllRefusesOverDamaged: the transactions above a damaged one
// may have been made on top of its changes, so committing them without
// it would write a stack no command ever saw. CommitAll refuses with
// ErrDamaged naming it, and nothing is written or squashed.
func TestCommitAllRefusesOverDamaged(t *testing.T) {
	for name, damage := range damageCases {
		t.Run(name, func(t *testing.T) {
			s := newDamagedStack(t, damage)
			paths, ids, err := s.f.CommitAll(t.Context())
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), s.bad) || paths != nil || ids != nil {
				t.Fatalf("CommitAll over a damaged transaction = %v, %v, %v", paths, ids, err)
			}
			s.check(t, "a refused CommitAll", s.below, s.above)
		})
	}
}

// TestSquashRefusesOverDamaged: a squash of the transactions around a
// damaged one would fold the one above it, made on top of its changes,
// with the one below: the squashed transaction would take f's before
// image from below and its content from above, and commit without the
// conflict that the one above alone meets. Squash refuses as CommitAll
// does, and squashes nothing.
func TestSquashRefusesOverDamaged(t *testing.T) {
	for name, damage := range damageCases {
		t.Run(name, func(t *testing.T) {
			s := newDamagedStack(t, damage)
			id, gone, err := s.f.Squash(t.Context(), 0)
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), s.bad) || !strings.Contains(err.Error(), "squash") || id != "" || gone != nil {
				t.Fatalf("Squash over a damaged transaction = %q, %v, %v", id, gone, err)
			}
			s.check(t, "a refused Squash", s.below, s.above)
		})
	}
}

// TestDiscardAllOverDamaged: DiscardAll drops only what it was asked to
// drop, none of which reaches the workspace, so a damaged transaction
// does not stop it; the damaged one is left as it was, for inspection.
func TestDiscardAllOverDamaged(t *testing.T) {
	for name, damage := range damageCases {
		t.Run(name, func(t *testing.T) {
			s := newDamagedStack(t, damage)
			ids, err := s.f.DiscardAll(t.Context())
			if err != nil || !slices.Equal(ids, []string{s.above, s.below}) {
				t.Fatalf("DiscardAll over a damaged transaction = %v, %v", ids, err)
			}
			s.check(t, "DiscardAll")
			if _, err := os.Stat(filepath.Join(s.ws, StateDir, "tx", s.bad, "stage.log")); err != nil {
				t.Fatalf("the damaged transaction was not left: %v", err)
			}
		})
	}
}

// No wall of open transactions by default.
func TestStackNoOpenWall(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	for i := 0; i < 40; i++ {
		stageCmd(t, f, "s", WriteOp("x", []byte{byte(i)}, 0o644))
	}
	if st := stack(t, f); len(st.Txs) != 40 || len(st.Layers()) != 40 {
		t.Fatalf("%d txs", len(st.Txs))
	}
}

// TestListCountsWhiteouts: a transaction whose only change hides a path
// staged below it (a whiteout) is not empty, and List says so: a reviewer
// or a tool skipping transactions with nothing in them would otherwise
// pass over a deletion its diff shows.
func TestListCountsWhiteouts(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	stageCmd(t, f, "one", WriteOp("a.txt", []byte("one\n"), 0o644))
	two := stageCmd(t, f, "two", WhiteoutOp("a.txt"))
	infos, err := f.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.ID != two {
			continue
		}
		if in.Changes != 0 || in.Whiteouts != 1 {
			t.Fatalf("List of the whiteout-only transaction: changes %d, whiteouts %d; want 0, 1", in.Changes, in.Whiteouts)
		}
		return
	}
	t.Fatalf("transaction %s not listed: %+v", two, infos)
}

// TestStackDecider names the transaction whose entry decides a path: its
// own, an ancestor's deletion, or none where the workspace shows through.
func TestStackDecider(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "ws.txt", "w\n", 0o644)
	f := openFS(t, ws)
	a := stageCmd(t, f, "one", WriteOp("d/a.txt", []byte("a\n"), 0o644), WriteOp("b.txt", []byte("b\n"), 0o644))
	b := stageCmd(t, f, "two", WriteOp("b.txt", []byte("b2\n"), 0o644), WhiteoutOp("d"))
	st := stack(t, f)
	for p, want := range map[string]string{"b.txt": b, "d/a.txt": b, "d": b, "ws.txt": "", "nothing": ""} {
		if got := st.Decider(p); got != want {
			t.Errorf("Decider(%q) = %q, want %q (a is %s)", p, got, want, a)
		}
	}
}

// TestStackLookupAfterLayersOfANewStack: the view a stack folds is its
// own, whatever was folded or laid out for the stacks before it: Layers
// of a new stack once left the previous stack's fold cached under the new
// key, and Lookup then answered from the old stack.
func TestStackLookupAfterLayersOfANewStack(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	first := stack(t, f)
	if _, decided, err := first.Lookup("a.txt"); err != nil || decided {
		t.Fatalf("empty stack: decided %v, %v", decided, err)
	}
	stageCmd(t, f, "one", WriteOp("a.txt", []byte("one\n"), 0o644))
	st := stack(t, f)
	st.Layers()
	e, decided, err := st.Lookup("a.txt")
	if err != nil || !decided || e == nil || e.Size != 4 {
		t.Fatalf("Lookup after Layers of the new stack: %+v, decided %v, %v", e, decided, err)
	}
	if d := st.Decider("a.txt"); d == "" {
		t.Errorf("Decider after Layers of the new stack: none")
	}
}

// TestCommitStackOnlyTheCheckedStack: a caller that vetted the stack
// commits exactly it; a transaction staged after the check refuses the
// commit, and nothing of either reaches the workspace.
func TestCommitStackOnlyTheCheckedStack(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	a := stageCmd(t, f, "one", WriteOp("a.txt", []byte("one\n"), 0o644))
	checked := []string{a}
	b := stageCmd(t, f, "two", WriteOp("b.txt", []byte("two\n"), 0o644))
	paths, ids, err := f.CommitStack(t.Context(), checked)
	if !errors.Is(err, ErrStackChanged) || paths != nil || ids != nil {
		t.Fatalf("CommitStack of a stale check = %v, %v, %v; want ErrStackChanged", paths, ids, err)
	}
	for _, p := range []string{"a.txt", "b.txt"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
			t.Fatalf("%s reached the workspace through a refused commit", p)
		}
	}
	if st := stack(t, f); len(st.Txs) != 2 {
		t.Fatalf("the refused commit changed the stack: %+v", st.Txs)
	}
	paths, ids, err = f.CommitStack(t.Context(), []string{a, b})
	if err != nil || !slices.Equal(ids, []string{a, b}) || !slices.Equal(paths, []string{"a.txt", "b.txt"}) {
		t.Fatalf("CommitStack of the current stack = %v, %v, %v", paths, ids, err)
	}
	if paths, ids, err = f.CommitStack(t.Context(), nil); err != nil || ids != nil || paths != nil {
		t.Fatalf("CommitStack of the empty stack = %v, %v, %v", paths, ids, err)
	}
}
