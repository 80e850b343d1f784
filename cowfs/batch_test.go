package cowfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tree describes a workspace (without .pulse): each entry's type, mode
// and content or link target.
func tree(t *testing.T, ws string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(ws, p)
		if rel == ".pulse" {
			return filepath.SkipDir
		}
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "link " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %o", fi.Mode().Perm())
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %o %q", fi.Mode().Perm(), b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func batchFixture(t *testing.T) string {
	t.Helper()
	ws := newWS(t)
	writeFile(t, ws, "mod.txt", "old\n", 0o644)
	writeFile(t, ws, "gone.txt", "bye\n", 0o644)
	writeFile(t, ws, "olddir/a", "a\n", 0o644)
	writeFile(t, ws, "olddir/sub/b", "b\n", 0o600)
	writeFile(t, ws, "was-file", "will be a directory\n", 0o644)
	return ws
}

// batchOps covers every kind, parents, replacement, duplicates, an
// unstage inside the batch and each refusal a single call can give.
func batchOps() []Op {
	return []Op{
		WriteOp("mod.txt", []byte("new\n"), 0),
		WriteOp("bin/data.bin", []byte{0, 1, 2, 0xff, '\n'}, 0o600),
		WriteOp("bin/same.bin", []byte{0, 1, 2, 0xff, '\n'}, 0o644), // same bytes: one copy in the pack
		WriteOp("empty", nil, 0o755),
		DeleteOp("gone.txt"),
		DeleteOp("olddir"),
		MkdirOp("newdir", 0o700),
		SymlinkOp("../mod.txt", "bin/link"),
		WriteOp("was-file/inside", []byte("x"), 0),
		WriteOp("temp", []byte("short-lived"), 0),
		DeleteOp("temp"),                         // unstages what the batch created
		WriteOp("mod.txt", []byte("newer\n"), 0), // the last write of a path wins
		DeleteOp("no-such-file"),                 // ErrNotFound
		WriteOp("../escape", []byte("x"), 0),     // ErrInvalidPath
		WriteOp(".pulse/cow/lock", nil, 0),       // ErrInvalidPath
		SymlinkOp("/etc/passwd", "abs-link"),     // ErrInvalidPath
		{Kind: "chmod", Path: "mod.txt"},         // unknown kind
	}
}

func perCall(tx *Tx, op Op) error {
	switch op.Kind {
	case KindWrite:
		return tx.Write(context.Background(), op.Path, op.Data, op.Mode)
	case KindMkdir:
		return tx.Mkdir(context.Background(), op.Path, op.Mode)
	case KindSymlink:
		return tx.Symlink(context.Background(), op.Target, op.Path)
	case KindDelete:
		return tx.Delete(context.Background(), op.Path)
	}
	return fmt.Errorf("unknown kind %q", op.Kind)
}

func sentinel(err error) error {
	for _, s := range []error{ErrNotFound, ErrInvalidPath, ErrLimit, ErrClosed} {
		if errors.Is(err, s) {
			return s
		}
	}
	return err
}

// TestStageMatchesPerCall stages the same ops one call at a time and as
// one batch, in twin workspaces: the refusals, the staged changes (also
// after reopening), the diff and the committed trees must all agree.
func TestStageMatchesPerCall(t *testing.T) {
	wsA, wsB := batchFixture(t), batchFixture(t)
	fA, fB := openFS(t, wsA), openFS(t, wsB)
	txA, err := fA.Begin(t.Context(), "per call")
	if err != nil {
		t.Fatal(err)
	}
	txB, err := fB.Begin(t.Context(), "batch")
	if err != nil {
		t.Fatal(err)
	}
	ops := batchOps()
	errs, err := txB.Stage(context.Background(), ops)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != len(ops) {
		t.Fatalf("%d errors for %d ops", len(errs), len(ops))
	}
	refused := 0
	for i, op := range ops {
		want := perCall(txA, op)
		if (want == nil) != (errs[i] == nil) || want != nil && sentinel(want) != sentinel(errs[i]) && op.Kind != "chmod" {
			t.Errorf("op %d (%s %s): batch %v, single call %v", i, op.Kind, op.Path, errs[i], want)
		}
		if errs[i] != nil {
			refused++
		}
	}
	if refused != 5 {
		t.Errorf("%d ops refused, want 5", refused)
	}
	if a, b := txA.Changes(), txB.Changes(); !reflect.DeepEqual(a, b) {
		t.Fatalf("changes differ:\nper call %+v\nbatch    %+v", a, b)
	}
	// What a fresh process reads from disk is the same.
	fB2 := openFS(t, wsB)
	txB2, err := fB2.Tx(t.Context(), txB.ID())
	if err != nil {
		t.Fatal(err)
	}
	if a, b := txA.Changes(), txB2.Changes(); !reflect.DeepEqual(a, b) {
		t.Fatalf("changes after reopening differ:\nper call %+v\nbatch    %+v", a, b)
	}
	dA, err := txA.Diff(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	dB, err := txB2.Diff(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if dA != dB || !strings.Contains(dB, "+newer") {
		t.Fatalf("diffs differ:\n%s\n----\n%s", dA, dB)
	}
	packs, _ := filepath.Glob(filepath.Join(wsB, StateDir, "tx", txB.ID(), "blobs", "pack-*"))
	if len(packs) != 1 {
		t.Fatalf("packs: %v", packs)
	}
	// data.bin and same.bin share their bytes; temp's stay, unreferenced.
	want := int64(len("new\n") + 5 + len("x") + len("short-lived") + len("newer\n"))
	if fi, err := os.Stat(packs[0]); err != nil || fi.Size() != want {
		t.Fatalf("pack: %v, %v; want %d bytes", fi, err, want)
	}
	if _, err := txA.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := txB2.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	a, b := tree(t, wsA), tree(t, wsB)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("committed trees differ:\nper call %v\nbatch    %v", a, b)
	}
	if b["mod.txt"] != `file 644 "newer\n"` || b["bin/link"] != "link ../mod.txt" || b["was-file"] != "dir 755" {
		t.Fatalf("batch tree: %v", b)
	}
	// The commit of packed bytes can be undone like any other.
	if _, err := fB2.Undo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, wsB); !reflect.DeepEqual(got, tree(t, batchFixture(t))) {
		t.Fatalf("undo did not restore the workspace: %v", got)
	}
}

func TestStageBatchThenSingleCalls(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "mixed")
	if err != nil {
		t.Fatal(err)
	}
	if errs, err := tx.Stage(context.Background(), []Op{WriteOp("d/a", []byte("a"), 0), WriteOp("d/b", []byte("b"), 0)}); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatal(errs, err)
	}
	if err := tx.Write(t.Context(), "d/a", []byte("a2"), 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Delete(t.Context(), "d/b"); err != nil {
		t.Fatal(err)
	}
	if errs, err := tx.Stage(context.Background(), []Op{WriteOp("d/c", []byte("c"), 0)}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	if errs, err := tx.Stage(context.Background(), nil); err != nil || len(errs) != 0 {
		t.Fatal(errs, err)
	}
	if _, err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := tree(t, ws)
	want := map[string]string{"d": "dir 755", "d/a": `file 644 "a2"`, "d/c": `file 644 "c"`}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("tree %v, want %v", got, want)
	}
	if _, err := tx.Stage(context.Background(), []Op{WriteOp("x", nil, 0)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stage on a committed tx: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tx2, _ := f.Begin(ctx, "cancelled")
	if _, err := tx2.Stage(ctx, []Op{WriteOp("x", nil, 0)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stage with a cancelled context: %v", err)
	}
}

// stateFiles lists a transaction's directory with each file's size.
func stateFiles(t *testing.T, ws, id string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	dir := filepath.Join(ws, StateDir, "tx", id)
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if !d.IsDir() {
			fi, _ := d.Info()
			rel, _ := filepath.Rel(dir, p)
			out[rel] = fi.Size()
		}
		return nil
	})
	return out
}

// TestStageLimits: each limit refuses the op that would pass it, the
// others are staged, and the refused ops' bytes are never written; a
// batch refused whole leaves the transaction's files as they were.
func TestStageLimits(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws, WithMaxStagedBytes(10_000), WithMaxChanges(12), WithMaxFileBytes(3000))
	other, err := f.Begin(t.Context(), "other")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Write(t.Context(), "held", make([]byte, 2000), 0); err != nil {
		t.Fatal(err)
	}
	tx, err := f.Begin(t.Context(), "limits")
	if err != nil {
		t.Fatal(err)
	}
	var ops []Op
	for i := 0; i < 6; i++ { // 6 × 1000 fit beside other's 2000
		ops = append(ops, WriteOp(fmt.Sprintf("k%d", i), []byte(strings.Repeat(strconv.Itoa(i), 1000)), 0))
	}
	ops = append(ops,
		WriteOp("too-big", make([]byte, 3001), 0),             // file bytes
		WriteOp("over", []byte(strings.Repeat("o", 2001)), 0), // 8000 + 2001 > 10000
		WriteOp("k0", []byte(strings.Repeat("0", 500)), 0),    // shrinking is fine: 7500
		WriteOp("fits", []byte(strings.Repeat("f", 2500)), 0), // 10000 exactly
		WriteOp("d1/d2/deep", nil, 0),                         // 3 changes: 10 in all
		WriteOp("n1", nil, 0),                                 // 11
		WriteOp("n2", nil, 0),                                 // 12
		WriteOp("n3", nil, 0),                                 // 13 > 12
		DeleteOp("n2"),                                        // back to 11
		WriteOp("n4", nil, 0),                                 // 12 again
	)
	errs, err := tx.Stage(context.Background(), ops)
	if err != nil {
		t.Fatal(err)
	}
	wantLimit := map[int]string{6: LimitFileBytes, 7: LimitStagedBytes, 13: LimitChanges}
	for i, e := range errs {
		var le *LimitError
		if name, ok := wantLimit[i]; ok {
			if !errors.As(e, &le) || le.Name != name || !errors.Is(e, ErrLimit) {
				t.Errorf("op %d (%s): %v, want limit %s", i, ops[i].Path, e, name)
			}
		} else if e != nil {
			t.Errorf("op %d (%s): %v", i, ops[i].Path, e)
		}
	}
	info := func() TxInfo {
		infos, err := f.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if in.ID == tx.ID() {
				return in
			}
		}
		t.Fatal("tx not listed")
		return TxInfo{}
	}
	if in := info(); in.Changes != 12 || in.Bytes != 8000 {
		t.Fatalf("staged %d changes, %d bytes; want 12, 8000", in.Changes, in.Bytes)
	}
	files := stateFiles(t, ws, tx.ID())
	var pack int64 = -1
	for name, size := range files {
		if strings.HasPrefix(name, "blobs/pack-") {
			pack = size
		}
	}
	// Only the accepted bytes reached the pack: 6000 + 500 + 2500 + 0.
	if pack != 9000 {
		t.Fatalf("pack holds %d bytes, want 9000: %v", pack, files)
	}

	// Every op over a limit: nothing is written at all.
	errs, err = tx.Stage(context.Background(), []Op{
		WriteOp("more", []byte("x"), 0),
		WriteOp("k1", make([]byte, 1001), 0),
		MkdirOp("newdir", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if !errors.Is(e, ErrLimit) {
			t.Fatalf("op %d: %v, want ErrLimit", i, e)
		}
	}
	if after := stateFiles(t, ws, tx.ID()); !reflect.DeepEqual(after, files) {
		t.Fatalf("a refused batch wrote files:\nbefore %v\nafter  %v", files, after)
	}
	// Once the other transaction is gone, its bytes are free again, also
	// to a batch (which recounts before refusing).
	f2 := openFS(t, ws)
	o2, _ := f2.Tx(t.Context(), other.ID())
	if err := o2.Discard(t.Context()); err != nil {
		t.Fatal(err)
	}
	if errs, err := tx.Stage(context.Background(), []Op{WriteOp("k1", make([]byte, 1001), 0)}); err != nil || errs[0] != nil {
		t.Fatalf("after the discard: %v %v", errs, err)
	}
}

// TestReplayTornBatch cuts a stage log at every byte inside a batch: the
// batch counts wholly or not at all, and through Open the cut tail is
// removed so that staging carries on.
func TestReplayTornBatch(t *testing.T) {
	ws := newWS(t)
	f := openFS(t, ws)
	tx, err := f.Begin(t.Context(), "torn")
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(t.Context(), "first", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(ws, StateDir, "tx", tx.ID(), "stage.log")
	before, _ := os.ReadFile(logPath)
	sealPath := filepath.Join(ws, StateDir, "tx", tx.ID(), "seal")
	sealBefore, _ := os.ReadFile(sealPath)
	var ops []Op
	for i := 0; i < 8; i++ {
		ops = append(ops, WriteOp(fmt.Sprintf("dir%d/f", i%3), []byte{byte(i)}, 0))
	}
	if _, err := tx.Stage(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	full, _ := os.ReadFile(logPath)
	recsBefore, _, _, err := replayLog(before, true)
	if err != nil {
		t.Fatal(err)
	}
	recsFull, good, tail, err := replayLog(full, true)
	if err != nil || tail || good != len(full) {
		t.Fatalf("whole log: good %d of %d, tail %v, %v", good, len(full), tail, err)
	}
	if n := len(recsFull) - len(recsBefore); n != 8+3 {
		t.Fatalf("batch has %d records, want 11 (8 writes, 3 parents)", n)
	}
	for cut := len(before); cut < len(full); cut++ {
		recs, good, tail, err := replayLog(full[:cut], true)
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if len(recs) != len(recsBefore) || good != len(before) || tail != (cut > len(before)) {
			t.Fatalf("cut at %d: %d records, good %d, tail %v; want %d, %d", cut, len(recs), good, tail, len(recsBefore), len(before))
		}
	}
	// Through the real path: a log cut just before the batch's last
	// record, with the seal as the append left it before it returned
	// (a cut of records whose append returned is lost records, refused:
	// TestStageLogDamage).
	frames, _, _ := decodeFrames(full)
	lastStart := len(full) - frameHeader - len(frames[len(frames)-1])
	if err := os.WriteFile(logPath, full[:lastStart], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sealPath, sealBefore, 0o600); err != nil {
		t.Fatal(err)
	}
	f2 := openFS(t, ws)
	tx2, err := f2.Tx(t.Context(), tx.ID())
	if err != nil {
		t.Fatal(err)
	}
	if ch := tx2.Changes(); len(ch) != 1 || ch[0].Path != "first" {
		t.Fatalf("changes after a torn batch: %+v", ch)
	}
	if b, _ := os.ReadFile(logPath); string(b) != string(before) {
		t.Fatalf("the torn batch was not cut: %d bytes, want %d", len(b), len(before))
	}
	if errs, err := tx2.Stage(context.Background(), ops[:2]); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatal(errs, err)
	}
	if n := len(tx2.Changes()); n != 5 {
		t.Fatalf("%d changes after restaging, want 5", n)
	}
}

// TestCrashWhileStagingBatch SIGKILLs a process inside Stage: after Open
// the transaction holds all of the batch or none of it, never part.
func TestCrashWhileStagingBatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		fp   int
		all  bool
	}{
		{"streamed", fpBatchStreamed, false},
		{"packed", fpBatchPacked, false},
		{"torn", fpBatchTorn, false},
		{"appended", fpStageAppended, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ws := newWS(t)
			writeFile(t, ws, "victim", "delete me\n", 0o644)
			f := openFS(t, ws)
			tx, err := f.Begin(t.Context(), "batch crash")
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Write(t.Context(), "before", []byte("staged before"), 0); err != nil {
				t.Fatal(err)
			}
			cmd := helperCmd(ws, tx.ID(), "PULSE_COWFS_HELPER=batch", failpointEnv(tc.fp, 1))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
				t.Fatalf("helper not killed: %v\n%s", err, out)
			}
			f2 := openFS(t, ws)
			tx2, err := f2.Tx(t.Context(), tx.ID())
			if err != nil {
				t.Fatal(err)
			}
			want := 1
			if tc.all {
				want += len(helperBatch()) + 2 // and the parents b and b/sub
			}
			if n := len(tx2.Changes()); n != want {
				t.Fatalf("%d changes after the crash, want %d: %+v", n, want, tx2.Changes())
			}
			if _, err := tx2.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := tree(t, ws)
			if got["before"] != `file 644 "staged before"` {
				t.Fatalf("the earlier write was lost: %v", got)
			}
			if _, ok := got["victim"]; ok == tc.all {
				t.Fatalf("victim present %v after a crash at %s", ok, tc.name)
			}
			for i := 0; i < 40; i++ {
				p := fmt.Sprintf("b/sub/f%02d", i)
				if v, ok := got[p]; ok != tc.all || ok && v != fmt.Sprintf("file 644 %q", fmt.Sprint("batch ", i)) {
					t.Fatalf("%s = %q, present %v, want present %v", p, v, ok, tc.all)
				}
			}
		})
	}
}

// helperBatch is what the "batch" helper stages: 40 files two
// directories down and the deletion of victim.
func helperBatch() []Op {
	var ops []Op
	for i := 0; i < 40; i++ {
		ops = append(ops, WriteOp(fmt.Sprintf("b/sub/f%02d", i), []byte(fmt.Sprint("batch ", i)), 0))
	}
	// One op streamed, so that every crash point of a batch covers it.
	data := []byte(fmt.Sprint("batch ", 0))
	ops[0] = StreamOp(ops[0].Path, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, 0)
	return append(ops, DeleteOp("victim"))
}

// BenchmarkStage1000Files stages 1,000 new 4 KiB files through one Stage
// batch and through 1,000 Write calls, and, as the reference, writes the
// same files to a directory with an fsync each and one of the directory
// (the least a durable writer of separate files does), all in one run.
func BenchmarkStage1000Files(b *testing.B) {
	data := make([][]byte, 1000)
	for j := range data {
		data[j] = []byte(strings.Repeat(fmt.Sprintf("%04d", j), 1024))
	}
	var batch, single, ref time.Duration
	for i := 0; i < b.N; i++ {
		for _, mode := range []string{"batch", "single"} {
			ws := b.TempDir()
			f, err := Open(b.Context(), ws, WithMaxStagedBytes(1<<30))
			if err != nil {
				b.Fatal(err)
			}
			tx, err := f.Begin(b.Context(), "bench")
			if err != nil {
				b.Fatal(err)
			}
			ops := make([]Op, len(data))
			for j := range data {
				ops[j] = WriteOp(fmt.Sprintf("d/f%04d", j), data[j], 0)
			}
			start := time.Now()
			if mode == "batch" {
				errs, err := tx.Stage(context.Background(), ops)
				if err != nil || errs[len(errs)-1] != nil {
					b.Fatal(err, errs[len(errs)-1])
				}
				batch += time.Since(start)
			} else {
				for _, op := range ops {
					if err := tx.Write(b.Context(), op.Path, op.Data, 0); err != nil {
						b.Fatal(err)
					}
				}
				single += time.Since(start)
			}
			if n := len(tx.Changes()); n != 1001 {
				b.Fatalf("%s staged %d changes", mode, n)
			}
			f.Close()
		}
		dir := filepath.Join(b.TempDir(), "d")
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for j := range data {
			fl, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%04d", j)))
			if err != nil {
				b.Fatal(err)
			}
			fl.Write(data[j])
			if err := fl.Sync(); err != nil {
				b.Fatal(err)
			}
			fl.Close()
		}
		d, _ := os.Open(dir)
		d.Sync()
		d.Close()
		ref += time.Since(start)
	}
	b.ReportMetric(float64(batch)/float64(ref), "batch-x-vs-fsync-writes")
	b.ReportMetric(float64(single)/float64(ref), "single-x-vs-fsync-writes")
	b.ReportMetric(float64(batch)/float64(single), "batch-x-vs-single")
	b.ReportMetric(float64(batch)/float64(b.N)/1e6, "batch-ms/op")
	b.ReportMetric(float64(single)/float64(b.N)/1e6, "single-ms/op")
	b.ReportMetric(float64(ref)/float64(b.N)/1e6, "ref-ms/op")
}

// TestStageInterleavesWithOtherWriters: two handles on one workspace
// (each with its own lock, as two processes have) stage into the same
// transaction at once, one in batches and one call at a time. Every
// batch plans against what the other appended before it, so nothing is
// lost and nothing is counted twice.
func TestStageInterleavesWithOtherWriters(t *testing.T) {
	ws := newWS(t)
	fA, fB := openFS(t, ws), openFS(t, ws)
	tx, err := fA.Begin(t.Context(), "two writers")
	if err != nil {
		t.Fatal(err)
	}
	txB, err := fB.Tx(t.Context(), tx.ID())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 30; i++ {
			if err := txB.Write(t.Context(), fmt.Sprintf("single/s%02d", i), []byte("s"), 0); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for k := 0; k < 10; k++ {
		var ops []Op
		for i := 0; i < 10; i++ {
			ops = append(ops, WriteOp(fmt.Sprintf("batch/b%d%d", k, i), []byte("bb"), 0))
		}
		if errs, err := tx.Stage(context.Background(), ops); err != nil || errors.Join(errs...) != nil {
			t.Fatal(err, errs)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f3 := openFS(t, ws)
	infos, err := f3.List(t.Context())
	if err != nil || len(infos) != 1 {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	if in := infos[0]; in.Changes != 100+30+2 || in.Bytes != 100*2+30 {
		t.Fatalf("staged %d changes, %d bytes; want 132, 230", in.Changes, in.Bytes)
	}
}
