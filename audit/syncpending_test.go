package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// What SyncPending and Close fsync under SyncEvery follows the dirty mark:
// set by an append and by a torn tail's repair, cleared by a sync. A
// mark lost would let Close skip the fsync of an event it must make
// durable.
func TestSyncPendingFollowsWhatIsUnsynced(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(ctx, path, WithDurability(SyncEvery(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if l.dirty {
		t.Fatal("a new log is marked unsynced before any append")
	}
	if err := l.Record(ctx, Event{Action: "exec", Target: "true", Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	if !l.dirty {
		t.Fatal("an append under SyncEvery is not marked unsynced")
	}
	if err := l.SyncPending(); err != nil {
		t.Fatal(err)
	}
	if l.dirty {
		t.Fatal("SyncPending left the log marked unsynced")
	}
	if err := l.Record(ctx, Event{Action: "exec", Target: "false", Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncPending(); err != nil {
		t.Fatalf("SyncPending after Close: %v", err)
	}
	rep, err := Verify(ctx, path)
	if err != nil || rep.LastSeq != 2 {
		t.Fatalf("Verify: %+v, %v; want 2 intact events", rep, err)
	}

	// A torn tail cut off at Open is synced like an append.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"torn":`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l, err = Open(ctx, path, WithDurability(SyncEvery(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.dirty {
		t.Fatal("the repair of a torn tail is not marked unsynced")
	}

	// Under SyncEachEvent every append was synced: nothing is pending.
	e, err := Open(ctx, filepath.Join(t.TempDir(), "audit.jsonl"), WithDurability(SyncEachEvent))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Record(ctx, Event{Action: "exec", Target: "true", Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	if e.dirty {
		t.Fatal("an append under SyncEachEvent is marked unsynced")
	}
}

// An fsync that failed in SyncPending is reported by Close even when
// Close's own fsync succeeds: on Linux a later fsync can succeed although
// the pages the failed one was to write are gone. A pipe stands in for
// the log file while SyncPending runs: fsync of a pipe fails (EINVAL), a
// real failure of the call.
func TestCloseReportsAFailedSyncPending(t *testing.T) {
	ctx := context.Background()
	l, err := Open(ctx, filepath.Join(t.TempDir(), "audit.jsonl"), WithDurability(SyncEvery(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Record(ctx, Event{Action: "exec", Target: "true", Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	withPipeAsLog(t, l, func() {
		if err := l.SyncPending(); err == nil {
			t.Fatal("SyncPending: fsync of a pipe did not fail")
		}
	})
	if err := l.Close(); err == nil {
		t.Fatal("Close after a failed SyncPending reported no error")
	}
}

// The interval's fsync runs without the append lock: an append made
// while it is under way is written at once, and marks the log unsynced
// for the next fsync, which Close then makes; a failure of the interval's
// fsync is reported by Close.
func TestIntervalSyncLetsAppendsThrough(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(ctx, path, WithDurability(SyncEvery(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Record(ctx, Event{Action: "exec", Target: "true", Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	inSync, release := make(chan struct{}), make(chan struct{})
	intervalSyncHook = func() { close(inSync); <-release }
	defer func() { intervalSyncHook = nil }()
	synced := make(chan struct{})
	go func() { defer close(synced); l.syncInterval() }()
	<-inSync
	recorded := make(chan error, 1)
	go func() { recorded <- l.Record(ctx, Event{Action: "exec", Target: "false", Decision: "allow"}) }()
	select {
	case err := <-recorded:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a deadlock, not a slow disk
		t.Fatal("Record waited for the interval's fsync")
	}
	close(release)
	<-synced
	intervalSyncHook = nil
	l.mu.Lock()
	dirty := l.dirty
	l.mu.Unlock()
	if !dirty {
		t.Fatal("an append made during the interval's fsync is not marked unsynced")
	}

	// A failed interval fsync (a pipe's: EINVAL) is Close's error.
	if err := l.Record(ctx, Event{Action: "exec", Target: "true", Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	withPipeAsLog(t, l, l.syncInterval)
	if err := l.Close(); err == nil {
		t.Fatal("Close after a failed interval fsync reported no error")
	}
	rep, err := Verify(ctx, path)
	if err != nil || rep.LastSeq != 3 {
		t.Fatalf("Verify: %+v, %v; want 3 intact events", rep, err)
	}
}

// withPipeAsLog runs fn with a pipe in place of l's log file: fsync of a
// pipe fails (EINVAL), a real failure of the call.
func withPipeAsLog(t *testing.T, l *Logger, fn func()) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	l.mu.Lock()
	logFile := l.f
	l.f = w
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.f = logFile
		l.mu.Unlock()
	}()
	fn()
}
