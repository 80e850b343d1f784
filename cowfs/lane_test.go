package cowfs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// fork makes a lane of f's and opens it.
func fork(t *testing.T, f *FS) *FS {
	t.Helper()
	id, err := f.Fork(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return openFS(t, f.Workspace(), WithLane(id))
}

func ids(st *Stack) []string {
	var out []string
	for _, t := range st.Txs {
		out = append(out, t.ID)
	}
	return out
}

func TestForkDiverges(t *testing.T) {
	ws := newWS(t)
	writeFile(t, ws, "base.txt", "base\n", 0o644)
	f := openFS(t, ws)
	t1 := stageCmd(t, f, "shared", WriteOp("a.txt", []byte("one\n"), 0o644))

	g := fork(t, f)
	if got := ids(stack(t, g)); !slices.Equal(got, []string{t1}) {
		t.Fatalf("fork's stack starts as %v, want [%s]", got, t1)
	}
	t2 := stageCmd(t, f, "parent", WriteOp("b.txt", []byte("parent\n"), 0o644))
	t3 := stageCmd(t, g, "fork", WriteOp("c.txt", []byte("fork\n"), 0o644), WhiteoutOp("a.txt"))

	pst, gst := stack(t, f), stack(t, g)
	if got := ids(pst); !slices.Equal(got, []string{t1, t2}) {
		t.Fatalf("parent stack %v", got)
	}
	if got := ids(gst); !slices.Equal(got, []string{t1, t3}) {
		t.Fatalf("fork stack %v", got)
	}
	for _, c := range []struct {
		st         *Stack
		path, want string
	}{
		{pst, "a.txt", "one\n"}, {pst, "b.txt", "parent\n"}, {pst, "c.txt", "<ws>"},
		{gst, "a.txt", "<absent>"}, {gst, "b.txt", "<ws>"}, {gst, "c.txt", "fork\n"},
	} {
		if got := seen(t, c.st, c.path); got != c.want {
			t.Errorf("%s in lane %q: %q, want %q", c.path, c.st.lane, got, c.want)
		}
	}
	if st := stack(t, g); st.Txs[1].Lane != g.Lane() || st.Txs[0].Lane != DefaultLane {
		t.Errorf("lanes recorded: %q %q", st.Txs[0].Lane, st.Txs[1].Lane)
	}

	// A fork of the fork sees its parent's stack up to then, only.
	h := fork(t, g)
	stageCmd(t, g, "fork later", WriteOp("d.txt", []byte("d\n"), 0o644))
	if got := ids(stack(t, h)); !slices.Equal(got, []string{t1, t3}) {
		t.Fatalf("fork of fork stack %v", got)
	}

	// A lane opened again (another process) reads the same stack.
	g2 := openFS(t, ws, WithLane(g.Lane()))
	if got, want := ids(stack(t, g2)), ids(stack(t, g)); !slices.Equal(got, want) {
		t.Fatalf("reopened lane %v, want %v", got, want)
	}
	infos, err := f.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range infos {
		if i.ID == t3 && i.Lane != g.Lane() {
			t.Errorf("List gives %s lane %q", t3, i.Lane)
		}
	}
}

// A shared transaction the parent commits is in the workspace then: the
// fork's view does not change.
func TestForkParentCommitsShared(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	t1 := stageCmd(t, f, "shared", WriteOp("a.txt", []byte("one\n"), 0o644))
	g := fork(t, f)
	stageCmd(t, g, "fork", WriteOp("c.txt", []byte("fork\n"), 0o644))
	tx, err := f.Tx(t.Context(), t1)
	if err != nil {
		t.Fatal(err)
	}
	if err := stack(t, f).CheckCommit(t1); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	gst := stack(t, g)
	if len(gst.Txs) != 1 || seen(t, gst, "a.txt") != "<ws>" || readFile(t, ws, "a.txt") != "one\n" || seen(t, gst, "c.txt") != "fork\n" {
		t.Fatalf("fork after the parent's commit: %v, a=%q", ids(gst), seen(t, gst, "a.txt"))
	}
}

// What a fork made on top of a shared transaction holds it in place: the
// parent can neither commit nor discard it alone, nor discard --all.
func TestForkDependsOnShared(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	t1 := stageCmd(t, f, "shared", WriteOp("a.txt", []byte("one\n"), 0o644))
	g := fork(t, f)
	t3 := stageCmd(t, g, "fork", WriteOp("a.txt", []byte("two\n"), 0o644))
	st := stack(t, f)
	var se *StackError
	for _, err := range []error{st.CheckCommit(t1), st.CheckDiscard(t1)} {
		if !errors.Is(err, ErrStackDependency) || !errors.As(err, &se) || !slices.Equal(se.Others, []string{t3}) {
			t.Fatalf("got %v, want a dependency on %s", err, t3)
		}
	}
	if _, err := f.DiscardAll(t.Context()); !errors.Is(err, ErrStackDependency) {
		t.Fatalf("discard --all of the parent: %v", err)
	}
	if got := ids(stack(t, g)); !slices.Equal(got, []string{t1, t3}) {
		t.Fatalf("fork's stack after the refusals: %v", got)
	}
	// The fork commits the whole of its stack: the shared transaction
	// goes with it, and the parent's view is the workspace then.
	paths, done, err := g.CommitAll(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(done, []string{t1, t3}) || !slices.Contains(paths, "a.txt") || readFile(t, ws, "a.txt") != "two\n" {
		t.Fatalf("commit --all of the fork: %v %v, a=%q", paths, done, readFile(t, ws, "a.txt"))
	}
	if n := len(stack(t, f).Txs); n != 0 {
		t.Fatalf("parent still has %d pending", n)
	}
}

// The parent's commit --all may not take a shared transaction that a
// fork's own one depends on; discard --all of a lane drops only its own.
func TestForkCommitAllAndDiscardAll(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	t1 := stageCmd(t, f, "shared", WriteOp("a.txt", []byte("one\n"), 0o644))
	g := fork(t, f)
	stageCmd(t, g, "fork", WriteOp("a.txt", []byte("two\n"), 0o644))
	if _, _, err := f.CommitAll(t.Context()); !errors.Is(err, ErrStackDependency) {
		t.Fatalf("parent commit --all: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ws, "a.txt")); !os.IsNotExist(err) {
		t.Fatal("workspace changed by a refused commit --all")
	}
	gone, err := g.DiscardAll(t.Context())
	if err != nil || len(gone) != 1 {
		t.Fatalf("fork discard --all: %v %v", gone, err)
	}
	if got := ids(stack(t, g)); !slices.Equal(got, []string{t1}) {
		t.Fatalf("fork after discard --all keeps what it inherited: %v", got)
	}
	if _, done, err := f.CommitAll(t.Context()); err != nil || !slices.Equal(done, []string{t1}) {
		t.Fatalf("parent commit --all: %v %v", done, err)
	}
}

// A squash never merges across a fork point nor takes what a lane
// inherited, so no fork's view changes.
func TestForkSquash(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	t1 := stageCmd(t, f, "one", WriteOp("a.txt", []byte("1\n"), 0o644))
	t2 := stageCmd(t, f, "two", WriteOp("a.txt", []byte("2\n"), 0o644))
	g := fork(t, f)
	stageCmd(t, f, "three", WriteOp("a.txt", []byte("3\n"), 0o644))
	stageCmd(t, f, "four", WriteOp("b.txt", []byte("4\n"), 0o644))
	stageCmd(t, g, "fork", WriteOp("c.txt", []byte("c\n"), 0o644))
	stageCmd(t, g, "fork2", WriteOp("d.txt", []byte("d\n"), 0o644))

	id, gone, err := f.Squash(t.Context(), 0)
	if err != nil || !slices.Equal(gone, []string{t1, t2}) {
		t.Fatalf("first squash: %s %v %v", id, gone, err)
	}
	if got := seen(t, stack(t, g), "a.txt"); got != "2\n" {
		t.Fatalf("fork sees a=%q after the parent's squash", got)
	}
	if _, gone, err := f.Squash(t.Context(), 0); err != nil || len(gone) != 2 {
		t.Fatalf("second squash (above the fork point): %v %v", gone, err)
	}
	if got := len(stack(t, f).Txs); got != 2 {
		t.Fatalf("parent stack has %d after two squashes, want 2", got)
	}
	gst := stack(t, g)
	if seen(t, gst, "a.txt") != "2\n" || seen(t, gst, "b.txt") != "<ws>" || len(gst.Txs) != 3 {
		t.Fatalf("fork after the parent's squashes: %v a=%q b=%q", ids(gst), seen(t, gst, "a.txt"), seen(t, gst, "b.txt"))
	}
	// The fork squashes its own two, not the one it inherited.
	if _, gone, err := g.Squash(t.Context(), 0); err != nil || len(gone) != 2 || slices.Contains(gone, id) {
		t.Fatalf("fork squash: %v %v", gone, err)
	}
	if got := len(stack(t, g).Txs); got != 2 {
		t.Fatalf("fork stack has %d, want 2", got)
	}
}

// A command of the parent still running at the fork (its transaction
// empty) stays out of the fork when it stages later.
func TestForkExcludesRunning(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	running, err := f.Begin(t.Context(), "running")
	if err != nil {
		t.Fatal(err)
	}
	g := fork(t, f)
	if _, err := running.Stage(t.Context(), []Op{WriteOp("late.txt", []byte("late\n"), 0o644)}); err != nil {
		t.Fatal(err)
	}
	if got := seen(t, stack(t, f), "late.txt"); got != "late\n" {
		t.Fatalf("parent: %q", got)
	}
	if got := seen(t, stack(t, g), "late.txt"); got != "<ws>" {
		t.Fatalf("fork sees a command that ran in the parent after the fork: %q", got)
	}
	// Nor does a squash of it bring it in.
	stageCmd(t, f, "more", WriteOp("late.txt", []byte("later\n"), 0o644))
	if _, _, err := f.Squash(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if got := seen(t, stack(t, g), "late.txt"); got != "<ws>" {
		t.Fatalf("fork sees the parent's squash: %q", got)
	}
}

func TestLaneRefusals(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	if _, err := Open(t.Context(), ws, WithLane("0123456789abcdef")); !errors.Is(err, ErrLane) {
		t.Fatalf("a lane that does not exist: %v", err)
	}
	if _, err := Open(t.Context(), ws, WithLane("../x")); !errors.Is(err, ErrLane) {
		t.Fatalf("a bad lane id: %v", err)
	}
	id, err := f.Fork(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	g := openFS(t, ws, WithLane(id))
	stageCmd(t, g, "fork", WriteOp("c.txt", []byte("c\n"), 0o644))
	// A leftover of a fork that crashed before its rename is not a lane.
	if err := os.WriteFile(filepath.Join(ws, StateDir, "lanes", ".new-0123456789abcdef"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	lanes, err := f.Lanes(t.Context())
	if err != nil || len(lanes) != 1 || lanes[0].ID != id {
		t.Fatalf("lanes %+v %v", lanes, err)
	}
	// A damaged lane file: the lane cannot be opened or read, and its
	// transactions are in no other lane's stack.
	lf := filepath.Join(ws, StateDir, "lanes", id)
	b, err := os.ReadFile(lf)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-2] ^= 1
	if err := os.WriteFile(lf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), ws, WithLane(id)); !errors.Is(err, ErrLane) {
		t.Fatalf("a damaged lane: %v", err)
	}
	g3, err := Open(t.Context(), ws) // default lane, then switched by hand
	if err != nil {
		t.Fatal(err)
	}
	defer g3.Close()
	g3.opts.lane = id
	if _, err := g3.Stack(t.Context()); !errors.Is(err, ErrLane) {
		t.Fatalf("stack of a damaged lane: %v", err)
	}
	if got := seen(t, stack(t, f), "c.txt"); got != "<ws>" {
		t.Fatalf("default lane sees %q", got)
	}
}

// FuzzLaneRecord feeds arbitrary bytes to the lane record decoder: it
// must never panic, and what it accepts names only valid ids and
// re-encodes to a record that decodes the same.
func FuzzLaneRecord(f *testing.F) {
	seed, err := encodeLane(laneRec{V: 1, ID: "0123456789abcdef", Parent: "fedcba9876543210", Cut: 5, Exclude: []string{"00000000000000aa"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-3])
	f.Add(append(seed, seed...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeLane(b)
		if err != nil {
			return
		}
		if !validID(r.ID) || r.Parent != DefaultLane && !validID(r.Parent) || r.Parent == r.ID || r.Cut <= 0 {
			t.Fatalf("accepted %+v", r)
		}
		for _, id := range r.Exclude {
			if !validID(id) {
				t.Fatalf("accepted exclusion %q", id)
			}
		}
		again, err := encodeLane(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := decodeLane(again)
		if err != nil || r2.ID != r.ID || r2.Parent != r.Parent || r2.Cut != r.Cut || !slices.Equal(r2.Exclude, r.Exclude) {
			t.Fatalf("round trip: %+v %v", r2, err)
		}
	})
}

// A transaction begun after a fork sorts after the fork point even when
// the clock says otherwise (here: a fork point in the future).
func TestForkPointOrdersLaterTransactions(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	stageCmd(t, f, "shared", WriteOp("a.txt", []byte("one\n"), 0o644))
	id, err := f.Fork(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Move the fork point an hour ahead, as a clock stepped back after
	// the fork would.
	lf := filepath.Join(ws, StateDir, "lanes", id)
	b, err := os.ReadFile(lf)
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeLane(b)
	if err != nil {
		t.Fatal(err)
	}
	r.Cut += int64(time.Hour)
	if b, err = encodeLane(r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f2 := openFS(t, ws) // reads the lane afresh
	stageCmd(t, f2, "parent later", WriteOp("b.txt", []byte("b\n"), 0o644))
	g := openFS(t, ws, WithLane(id))
	if got := seen(t, stack(t, g), "b.txt"); got != "<ws>" {
		t.Fatalf("the fork sees a transaction its parent began after the fork: %q", got)
	}
}
