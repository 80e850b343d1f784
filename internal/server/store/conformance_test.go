package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// impl is one implementation of Interface under the conformance suite.
type impl struct {
	name string
	// start prepares the implementation for the tests under t (ending
	// them, skipped or failed, when it cannot run here) and returns what
	// makes a new, empty database for OpenDatabase.
	start func(t *testing.T) (location func(t *testing.T) string)
	// bumpSchema marks the database at location as written by a newer
	// version.
	bumpSchema func(t *testing.T, location string)
}

// db is one test's database: open opens it (again) as OpenDatabase does,
// closing the store when the test ends.
type db struct {
	t        *testing.T
	location string
}

func (d db) open(opts ...Option) Interface {
	d.t.Helper()
	s, err := OpenDatabase(context.Background(), d.location, opts...)
	if err != nil {
		d.t.Fatalf("OpenDatabase: %v", err)
	}
	d.t.Cleanup(func() { s.Close() })
	return s
}

func sqliteImpl() impl {
	return impl{
		name: "sqlite",
		start: func(*testing.T) func(t *testing.T) string {
			return func(t *testing.T) string { return filepath.Join(t.TempDir(), "db.sqlite3") }
		},
		bumpSchema: func(t *testing.T, location string) {
			s := open(t, location)
			if _, err := s.db.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, SchemaVersion()+1)); err != nil {
				t.Fatal(err)
			}
			s.Close()
		},
	}
}

// TestConformance runs every case of conformanceCases on every
// implementation, each case on a database of its own.
func TestConformance(t *testing.T) {
	for _, im := range implementations() {
		t.Run(im.name, func(t *testing.T) {
			location := im.start(t)
			for _, c := range conformanceCases {
				t.Run(c.name, func(t *testing.T) {
					c.run(t, im, db{t: t, location: location(t)})
				})
			}
		})
	}
}

var conformanceCases = []struct {
	name string
	run  func(t *testing.T, im impl, d db)
}{
	{"CreateGetFinishIsTenantScoped", func(t *testing.T, _ impl, d db) {
		ctx := context.Background()
		s := d.open(WithReplica("r1"))
		if err := s.Create(ctx, Execution{ID: "e1", Tenant: "ta", CorrelationID: "c-1", Encoding: "base64", Owner: "ignored"}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, "e1", "ta")
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != "e1" || got.Tenant != "ta" || got.Status != StatusRunning || got.CorrelationID != "c-1" ||
			got.Encoding != "base64" || got.Result != nil || got.Owner != "r1" {
			t.Fatalf("got %+v", got)
		}
		if got.CreatedAt.IsZero() || got.UpdatedAt.IsZero() {
			t.Fatalf("timestamps not parsed: %+v", got)
		}
		if _, err := s.Get(ctx, "e1", "tb"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("other tenant: err = %v, want ErrNotFound", err)
		}
		if _, err := s.Get(ctx, "never", "ta"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown id: err = %v, want ErrNotFound", err)
		}
		if err := s.Create(ctx, Execution{ID: "e1", Tenant: "tb"}); !errors.Is(err, ErrExists) {
			t.Fatalf("duplicate id from another tenant: err = %v, want ErrExists", err)
		}
		if ok, err := s.Exists(ctx, "e1"); err != nil || !ok {
			t.Fatalf("Exists = %v, %v", ok, err)
		}
		if ok, err := s.Exists(ctx, "nope"); err != nil || ok {
			t.Fatalf("Exists(nope) = %v, %v", ok, err)
		}
		res := json.RawMessage(`{"exit_code":3}`)
		if err := s.Finish(ctx, "e1", StatusCompleted, res); err != nil {
			t.Fatal(err)
		}
		got, _ = s.Get(ctx, "e1", "ta")
		if got.Status != StatusCompleted || string(got.Result) != string(res) {
			t.Fatalf("after finish: %+v", got)
		}
		// A terminal record is never overwritten (a late cancel loses).
		if err := s.Finish(ctx, "e1", StatusFailed, nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second Finish: err = %v, want ErrNotFound", err)
		}
		if err := s.Finish(ctx, "never", StatusFailed, nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Finish of an unknown id: err = %v, want ErrNotFound", err)
		}
		// A record finished without a result keeps none.
		if err := s.Create(ctx, Execution{ID: "e2", Tenant: "ta"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(ctx, "e2", StatusFailed, nil); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Get(ctx, "e2", "ta"); got.Status != StatusFailed || got.Result != nil || got.CorrelationID != "" {
			t.Fatalf("e2 = %+v", got)
		}
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	}},
	{"EventsAreOrderedAndIdempotent", func(t *testing.T, _ impl, d db) {
		ctx := context.Background()
		s := d.open()
		if err := s.Create(ctx, Execution{ID: "e", Tenant: "t"}); err != nil {
			t.Fatal(err)
		}
		batch := []Event{
			{ExecutionID: "e", Seq: 2, Stream: "stderr", Data: []byte{0xff, 0}},
			{ExecutionID: "e", Seq: 1, Stream: "stdout", Data: []byte("a")},
			{ExecutionID: "other", Seq: 1, Stream: "stdout", Data: []byte("o")},
		}
		for range 2 { // the retry must not duplicate
			if err := s.AppendEvents(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
		// A re-sent seq with other bytes does not replace the first, in
		// a later batch or in the same one.
		if err := s.AppendEvents(ctx, []Event{
			{ExecutionID: "e", Seq: 1, Stream: "stdout", Data: []byte("changed")},
			{ExecutionID: "e", Seq: 3, Stream: "stdout", Data: nil},
			{ExecutionID: "e", Seq: 3, Stream: "stderr", Data: []byte("second")},
		}); err != nil {
			t.Fatal(err)
		}
		all, err := s.Events(ctx, "e", 0)
		if err != nil {
			t.Fatal(err)
		}
		want := []Event{
			{ExecutionID: "e", Seq: 1, Stream: "stdout", Data: []byte("a")},
			{ExecutionID: "e", Seq: 2, Stream: "stderr", Data: []byte{0xff, 0}},
			{ExecutionID: "e", Seq: 3, Stream: "stdout", Data: []byte{}},
		}
		sameEvents(t, all, want)
		tail, err := s.Events(ctx, "e", 2)
		if err != nil {
			t.Fatal(err)
		}
		sameEvents(t, tail, want[2:])
		other, err := s.Events(ctx, "other", 0)
		if err != nil {
			t.Fatal(err)
		}
		sameEvents(t, other, batch[2:])
		if none, err := s.Events(ctx, "nothing", 0); err != nil || len(none) != 0 {
			t.Fatalf("events of an execution without any: %+v, %v", none, err)
		}
		// What cannot be replayed as written is refused, not stored.
		for _, bad := range []Event{
			{ExecutionID: "e", Seq: 9, Stream: "stdin", Data: []byte("x")},
			{ExecutionID: "e", Seq: 0, Stream: "stdout", Data: []byte("x")},
			{ExecutionID: "e", Seq: -1, Stream: "stdout", Data: []byte("x")},
		} {
			if err := s.AppendEvents(ctx, []Event{bad}); err == nil {
				t.Fatalf("event %+v accepted", bad)
			}
		}
		all, _ = s.Events(ctx, "e", 0)
		sameEvents(t, all, want)
	}},
	{"EventsAreSharedBetweenStoresOfOneDatabase", func(t *testing.T, _ impl, d db) {
		ctx := context.Background()
		a, b := d.open(WithReplica("a")), d.open(WithReplica("b"))
		if err := a.Create(ctx, Execution{ID: "e", Tenant: "t"}); err != nil {
			t.Fatal(err)
		}
		ev := []Event{{ExecutionID: "e", Seq: 1, Stream: "stdout", Data: []byte("from a")}}
		if err := a.AppendEvents(ctx, ev); err != nil {
			t.Fatal(err)
		}
		// The other store re-sends it (a retry after a lost reply) and
		// adds the next.
		if err := b.AppendEvents(ctx, append(ev, Event{ExecutionID: "e", Seq: 2, Stream: "stdout", Data: []byte("from b")})); err != nil {
			t.Fatal(err)
		}
		for _, s := range []Interface{a, b} {
			got, err := s.Events(ctx, "e", 0)
			if err != nil {
				t.Fatal(err)
			}
			sameEvents(t, got, []Event{ev[0], {ExecutionID: "e", Seq: 2, Stream: "stdout", Data: []byte("from b")}})
			if e, err := s.Get(ctx, "e", "t"); err != nil || e.Owner != "a" {
				t.Fatalf("Get = %+v, %v", e, err)
			}
		}
	}},
	{"RestartMarksRunningUnknown", func(t *testing.T, _ impl, d db) {
		ctx := context.Background()
		s := d.open()
		for _, id := range []string{"r1", "r2", "done"} {
			if err := s.Create(ctx, Execution{ID: id, Tenant: "t"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Finish(ctx, "done", StatusCompleted, json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
		s.Close()

		s = d.open()
		n, err := s.MarkRunningUnknown(ctx)
		if err != nil || n != 2 {
			t.Fatalf("MarkRunningUnknown = %d, %v; want 2", n, err)
		}
		for id, want := range map[string]string{"r1": StatusUnknown, "r2": StatusUnknown, "done": StatusCompleted} {
			e, err := s.Get(ctx, id, "t")
			if err != nil || e.Status != want {
				t.Fatalf("%s: %+v, %v; want %s", id, e, err, want)
			}
		}
		counts, err := s.CountByStatus(ctx)
		if err != nil || len(counts) != 2 || counts[StatusUnknown] != 2 || counts[StatusCompleted] != 1 {
			t.Fatalf("counts = %v, %v", counts, err)
		}
		// An UNKNOWN record is terminal: nothing finishes it later.
		if err := s.Finish(ctx, "r1", StatusCompleted, nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Finish of an UNKNOWN record: %v, want ErrNotFound", err)
		}
	}},
	// A replica starting beside another on one database quarantines only
	// what it created itself: the other's executions are still running.
	{"MarkRunningUnknownTouchesOnlyItsReplica", func(t *testing.T, _ impl, d db) {
		ctx := context.Background()
		a, b := d.open(WithReplica("replica-a")), d.open(WithReplica("replica-b"))
		for _, c := range []struct {
			s  Interface
			id string
		}{{a, "a1"}, {a, "a2"}, {b, "b1"}} {
			if err := c.s.Create(ctx, Execution{ID: c.id, Tenant: "t"}); err != nil {
				t.Fatal(err)
			}
		}
		b.Close()
		b = d.open(WithReplica("replica-b")) // replica-b restarts
		n, err := b.MarkRunningUnknown(ctx)
		if err != nil || n != 1 {
			t.Fatalf("replica-b's MarkRunningUnknown = %d, %v; want 1", n, err)
		}
		for id, want := range map[string]string{"a1": StatusRunning, "a2": StatusRunning, "b1": StatusUnknown} {
			if e, err := a.Get(ctx, id, "t"); err != nil || e.Status != want {
				t.Fatalf("%s: %+v, %v; want %s", id, e, err, want)
			}
		}
		// replica-a finishes its executions through its own store as if
		// nothing happened.
		if err := a.Finish(ctx, "a1", StatusCompleted, json.RawMessage(`{"exit_code":0}`)); err != nil {
			t.Fatal(err)
		}
		// A store with no replica name is another owner again.
		if n, err := d.open().MarkRunningUnknown(ctx); err != nil || n != 0 {
			t.Fatalf("unnamed MarkRunningUnknown = %d, %v; want 0", n, err)
		}
	}},
	{"CleanupOldRemovesOnlyOldTerminalRecords", func(t *testing.T, _ impl, d db) {
		ctx := context.Background()
		var mu sync.Mutex
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		advance := func(dt time.Duration) { mu.Lock(); now = now.Add(dt); mu.Unlock() }
		s := d.open(WithClock(clock))

		for _, id := range []string{"old-done", "old-running", "new-done"} {
			if err := s.Create(ctx, Execution{ID: id, Tenant: "t"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AppendEvents(ctx, []Event{{ExecutionID: "old-done", Seq: 1, Stream: "stdout", Data: []byte("x")},
			{ExecutionID: "new-done", Seq: 1, Stream: "stdout", Data: []byte("y")}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(ctx, "old-done", StatusCompleted, nil); err != nil {
			t.Fatal(err)
		}
		advance(2 * time.Hour)
		if err := s.Finish(ctx, "new-done", StatusFailed, nil); err != nil {
			t.Fatal(err)
		}
		if e, _ := s.Get(ctx, "new-done", "t"); !e.UpdatedAt.Equal(clock()) || !e.CreatedAt.Equal(clock().Add(-2*time.Hour)) {
			t.Fatalf("timestamps %v, %v; want the clock's %v", e.CreatedAt, e.UpdatedAt, clock())
		}
		refs, err := s.CleanupOld(ctx, clock().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) != 1 || refs[0] != (Ref{ExecutionID: "old-done", Tenant: "t"}) {
			t.Fatalf("cleaned %+v, want only old-done", refs)
		}
		if _, err := s.Get(ctx, "old-done", "t"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("old-done still there: %v", err)
		}
		if ev, _ := s.Events(ctx, "old-done", 0); len(ev) != 0 {
			t.Fatalf("events of a cleaned execution remain: %+v", ev)
		}
		for _, id := range []string{"old-running", "new-done"} {
			if _, err := s.Get(ctx, id, "t"); err != nil {
				t.Fatalf("%s removed: %v", id, err)
			}
		}
		if ev, _ := s.Events(ctx, "new-done", 0); len(ev) != 1 {
			t.Fatalf("events of a kept execution: %+v", ev)
		}
	}},
	{"ConcurrentWritersDoNotFail", func(t *testing.T, _ impl, d db) {
		ctx := context.Background()
		s := d.open()
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("e%d", i)
				if err := s.Create(ctx, Execution{ID: id, Tenant: "t"}); err != nil {
					errs <- err
					return
				}
				for seq := int64(1); seq <= 5; seq++ {
					if err := s.AppendEvents(ctx, []Event{{ExecutionID: id, Seq: seq, Stream: "stdout", Data: []byte("x")}}); err != nil {
						errs <- err
						return
					}
				}
				errs <- s.Finish(ctx, id, StatusCompleted, json.RawMessage(`{}`))
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		counts, _ := s.CountByStatus(ctx)
		if counts[StatusCompleted] != 32 {
			t.Fatalf("counts = %v", counts)
		}
		if ev, err := s.Events(ctx, "e7", 0); err != nil || len(ev) != 5 || ev[4].Seq != 5 {
			t.Fatalf("events of e7: %+v, %v", ev, err)
		}
	}},
	{"RefusesNewerSchema", func(t *testing.T, im impl, d db) {
		d.open().Close()
		im.bumpSchema(t, d.location)
		if s, err := OpenDatabase(context.Background(), d.location); !errors.Is(err, ErrNewerSchema) {
			if err == nil {
				s.Close()
			}
			t.Fatalf("err = %v, want ErrNewerSchema", err)
		}
	}},
}

func sameEvents(t *testing.T, got, want []Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].ExecutionID != want[i].ExecutionID || got[i].Seq != want[i].Seq || got[i].Stream != want[i].Stream ||
			!bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("event %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
