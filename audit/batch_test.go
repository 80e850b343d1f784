package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/secrets"
)

// readEvents parses every line of every file of the log at path.
func readEvents(t *testing.T, path string) []Event {
	t.Helper()
	files, err := Files(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []Event
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.SplitAfter(data, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			e, err := ParseLine(line)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, e)
		}
	}
	return out
}

func TestRecordBatchChainsScrubsAndKeepsOrder(t *testing.T) {
	const secret = "tok-4f9a-secret"
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(t.Context(), path, WithScrubber(secrets.NewScrubber([]string{secret})), WithSessionID("sess-b"), WithDurability(SyncEachEvent))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Record(ctx, Event{Action: "shell", Target: "make"}); err != nil {
		t.Fatal(err)
	}
	fixed := time.Date(2026, 11, 29, 12, 0, 0, 5, time.FixedZone("x", 3600))
	batch := []Event{
		{Action: "write-staged", Target: "a.txt", Detail: "key " + secret},
		{Action: "write", Target: "b/" + secret + ".txt", Decision: "deny", Reason: "policy"},
		{Action: "delete-staged", Target: "c.txt", SessionID: "other", Time: fixed, ExitCode: Int(0)},
	}
	before := append([]Event(nil), batch...)
	if err := l.RecordBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for i := range batch {
		if batch[i].Seq != before[i].Seq || batch[i].Hash != before[i].Hash || batch[i].Detail != before[i].Detail ||
			!batch[i].Time.Equal(before[i].Time) {
			t.Fatalf("RecordBatch changed the caller's event %d: %+v", i, batch[i])
		}
	}
	if err := l.Record(ctx, Event{Action: "shell", Target: "after"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(t.Context(), path)
	if err != nil || rep.Events != 5 || rep.LastSeq != 5 {
		t.Fatalf("report %+v, err %v", rep, err)
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), secret) {
		t.Fatalf("secret written by a batch:\n%s", raw)
	}
	evs := readEvents(t, path)
	want := []string{"shell make", "write-staged a.txt", "write b/[REDACTED].txt", "delete-staged c.txt", "shell after"}
	for i, e := range evs {
		if got := e.Action + " " + e.Target; got != want[i] || e.Seq != uint64(i+1) {
			t.Fatalf("event %d = seq %d %q, want seq %d %q", i, e.Seq, got, i+1, want[i])
		}
	}
	if evs[1].Detail != "key [REDACTED]" || evs[1].SessionID != "sess-b" {
		t.Fatalf("batched event not scrubbed or missing session: %+v", evs[1])
	}
	if evs[3].SessionID != "other" || !evs[3].Time.Equal(fixed) || evs[3].ExitCode == nil || *evs[3].ExitCode != 0 {
		t.Fatalf("caller's fields not kept: %+v", evs[3])
	}
}

func TestRecordBatchIsAllOrNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 3)
	l, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before, _ := os.ReadFile(path)
	ctx := context.Background()
	err = l.RecordBatch(ctx, []Event{{Action: "a"}, {Action: "b", Detail: strings.Repeat("x", MaxLineLen)}, {Action: "c"}})
	if !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("err = %v, want ErrEventTooLarge", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatalf("a refused batch wrote %d bytes", len(after)-len(before))
	}

	// A lock held elsewhere and a context that ends: nothing written.
	holder, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := flock.TryLock(holder); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if err := l.RecordBatch(tctx, []Event{{Action: "a"}, {Action: "b"}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("batch while locked: %v, want DeadlineExceeded", err)
	}
	flock.Unlock(holder)
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("a batch that gave up on the lock wrote")
	}

	if err := l.RecordBatch(ctx, nil); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
	if err := l.RecordBatch(ctx, []Event{{Action: "a"}, {Action: "b"}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(t.Context(), path); err != nil || rep.LastSeq != 5 {
		t.Fatalf("after refusals: %+v %v", rep, err)
	}
	l.Close()
	if err := l.RecordBatch(ctx, []Event{{Action: "a"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("RecordBatch after Close: %v", err)
	}
}

// TestRecordBatchGoesWholeIntoOneFile checks the documented rotation rule:
// a batch that would carry the live file past the limit rotates it first
// and starts the new file, and the chain runs on across the files.
func TestRecordBatchGoesWholeIntoOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	const limit = 4000
	l, err := Open(t.Context(), path, WithMaxSize(limit), WithDurability(NoSync))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if err := l.Record(ctx, Event{Action: "shell", Target: "single " + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	batch := func(tag string, n int) []Event {
		evs := make([]Event, n)
		for i := range evs {
			evs[i] = Event{Action: "write-staged", Target: fmt.Sprintf("%s/%03d.txt", tag, i)}
		}
		return evs
	}
	// 5 singles plus 15 batched lines do not fit in 4000 bytes.
	if err := l.RecordBatch(ctx, batch("fits-not", 15)); err != nil {
		t.Fatal(err)
	}
	// Larger than the limit by itself: one oversized file, not split.
	if err := l.RecordBatch(ctx, batch("huge", 40)); err != nil {
		t.Fatal(err)
	}
	if err := l.Record(ctx, Event{Action: "shell", Target: "last"}); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(t.Context(), path)
	if err != nil || rep.Events != 61 || rep.LastSeq != 61 {
		t.Fatalf("report %+v, err %v", rep, err)
	}
	files, _ := Files(path)
	if len(files) != 4 {
		t.Fatalf("files %v, want 3 rotated and the live one", files)
	}
	// Each file holds whole batches: its first target starts a batch.
	wantFirst := []string{"single 0", "fits-not/000.txt", "huge/000.txt", "last"}
	wantLines := []int{5, 15, 40, 1}
	for i, f := range files {
		data, _ := os.ReadFile(f)
		lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
		e, err := ParseLine(lines[0])
		if err != nil || e.Target != wantFirst[i] || len(lines) != wantLines[i] {
			t.Fatalf("%s: first %q (%v), %d lines; want %q, %d lines", f, e.Target, err, len(lines), wantFirst[i], wantLines[i])
		}
	}
}

// TestCrashMidBatchLeavesAVerifiablePrefix stands in for a writer killed
// in the middle of a batch's write by cutting the file inside one of the
// batch's lines, which is what such a crash leaves on disk.
func TestCrashMidBatchLeavesAVerifiablePrefix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeEvents(t, path, 2)
	l, err := Open(t.Context(), path, WithDurability(NoSync))
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]Event, 10)
	for i := range evs {
		evs[i] = Event{Action: "write-staged", Target: fmt.Sprintf("f%d", i)}
	}
	// The head record is written after the lines: a writer killed in the
	// middle of them never updated it.
	headBefore, err := os.ReadFile(path + HeadSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.RecordBatch(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if err := os.WriteFile(path+HeadSuffix, headBefore, 0o600); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	lines := bytes.SplitAfter(data, []byte("\n"))
	// Keep the 2 singles and 4 batched lines, and half of the fifth.
	cut := len(bytes.Join(lines[:6], nil)) + len(lines[6])/2
	if err := os.Truncate(path, int64(cut)); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(t.Context(), path)
	if !errors.Is(err, ErrTornTail) || rep.BadSeq != 7 {
		t.Fatalf("torn batch: %+v %v, want ErrTornTail at seq 7", rep, err)
	}
	writeEvents(t, path, 1)
	rep, err = Verify(t.Context(), path)
	if err != nil || rep.Events != 7 || rep.LastSeq != 7 {
		t.Fatalf("after repair: %+v %v", rep, err)
	}
	if got := readEvents(t, path); got[5].Target != "f3" || got[6].Action != "shell" {
		t.Fatalf("after repair: %q then %q", got[5].Target, got[6].Action)
	}
}

// meetHalfWay is called by each of two helper processes (the pairs
// single/batch and agent/review) half-way through its appends: it waits
// until the other is half-way too, so the two are certain to interleave
// whatever the scheduler does on a busy machine (without it, one process
// could finish before the other started). Both halves of each process's
// events then straddle the other's, which makes at least three runs.
func meetHalfWay(t *testing.T, path, id string) {
	t.Helper()
	if err := os.WriteFile(path+".half-"+id, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	other := path + ".half-" + map[string]string{"single": "batch", "batch": "single", "agent": "review", "review": "agent"}[id]
	deadline := time.Now().Add(2 * time.Minute)
	for _, err := os.Stat(other); err != nil; _, err = os.Stat(other) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached half-way", other)
		}
		time.Sleep(time.Millisecond)
	}
}

const batchHelperEnv = "PULSE_AUDIT_BATCH_HELPER_PATH"

// TestHelperAppendMixed is the child process of
// TestBatchesInterleaveWithRecords: it appends N events, one Record at a
// time or in batches of PULSE_AUDIT_HELPER_BATCH.
func TestHelperAppendMixed(t *testing.T) {
	path := os.Getenv(batchHelperEnv)
	if path == "" {
		t.Skip("helper process only: run by TestBatchesInterleaveWithRecords")
	}
	n, _ := strconv.Atoi(os.Getenv("PULSE_AUDIT_HELPER_N"))
	size, _ := strconv.Atoi(os.Getenv("PULSE_AUDIT_HELPER_BATCH"))
	id := os.Getenv("PULSE_AUDIT_HELPER_ID")
	l, err := Open(t.Context(), path, WithDurability(NoSync), WithMaxSize(64<<10), WithSessionID(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := os.Stat(path + ".go"); err != nil; _, err = os.Stat(path + ".go") {
		time.Sleep(time.Millisecond)
	}
	ctx := context.Background()
	for i := 0; i < n; {
		if i == n/2 {
			meetHalfWay(t, path, id)
		}
		if size <= 1 {
			if err := l.Record(ctx, Event{Action: "shell", Target: fmt.Sprint("cmd ", i)}); err != nil {
				t.Fatal(err)
			}
			i++
			continue
		}
		evs := make([]Event, 0, size)
		for k := 0; k < size && i < n; k++ {
			evs = append(evs, Event{Action: "write-staged", Target: fmt.Sprintf("batch %d item %d", i/size, k)})
			i++
		}
		if err := l.RecordBatch(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBatchesInterleaveWithRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	const perProc, batchSize = 2000, 25
	var cmds []*exec.Cmd
	for _, c := range []struct {
		id   string
		size int
	}{{"single", 1}, {"batch", batchSize}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAppendMixed$", "-test.count=1")
		cmd.Env = append(os.Environ(), batchHelperEnv+"="+path, "PULSE_AUDIT_HELPER_N="+strconv.Itoa(perProc),
			"PULSE_AUDIT_HELPER_BATCH="+strconv.Itoa(c.size), "PULSE_AUDIT_HELPER_ID="+c.id)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s output:\n%s", c.id, out.String())
			}
		})
	}
	if err := os.WriteFile(path+".go", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("helper: %v", err)
		}
	}
	rep, err := Verify(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Events != 2*perProc || rep.LastSeq != 2*perProc {
		t.Fatalf("report %+v", rep)
	}
	// Every batch's events are adjacent and in order; the single Records
	// fall only between batches.
	evs := readEvents(t, path)
	counts := map[string]int{}
	runs, last := 0, ""
	for i, e := range evs {
		counts[e.SessionID]++
		if e.SessionID != last {
			runs++
			last = e.SessionID
		}
		var b, k int
		if e.SessionID != "batch" {
			continue
		}
		if _, err := fmt.Sscanf(e.Target, "batch %d item %d", &b, &k); err != nil {
			t.Fatalf("seq %d: target %q", e.Seq, e.Target)
		}
		if k > 0 && (i == 0 || evs[i-1].Target != fmt.Sprintf("batch %d item %d", b, k-1)) {
			t.Fatalf("seq %d (%s) does not follow its batch's previous event", e.Seq, e.Target)
		}
	}
	if counts["single"] != perProc || counts["batch"] != perProc {
		t.Fatalf("events per process: %v", counts)
	}
	if runs < 3 {
		t.Fatalf("the two processes did not interleave (%d runs)", runs)
	}
	t.Logf("%d runs of one process's events in one chain of %d", runs, rep.Events)
}
