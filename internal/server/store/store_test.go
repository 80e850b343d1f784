package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func open(t *testing.T, path string, opts ...Option) *Store {
	t.Helper()
	s, err := Open(context.Background(), path, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestCreateGetFinishIsTenantScoped(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "db.sqlite3"))
	if err := s.Create(ctx, Execution{ID: "e1", Tenant: "ta", CorrelationID: "c-1", Encoding: "base64"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "e1", "ta")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != StatusRunning || got.CorrelationID != "c-1" || got.Encoding != "base64" || got.Result != nil {
		t.Fatalf("got %+v", got)
	}
	if got.CreatedAt.IsZero() || got.UpdatedAt.IsZero() {
		t.Fatalf("timestamps not parsed: %+v", got)
	}
	if _, err := s.Get(ctx, "e1", "tb"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("other tenant: err = %v, want ErrNotFound", err)
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
}

func TestEventsAreOrderedAndIdempotent(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "db.sqlite3"))
	if err := s.Create(ctx, Execution{ID: "e", Tenant: "t"}); err != nil {
		t.Fatal(err)
	}
	batch := []Event{
		{ExecutionID: "e", Seq: 2, Stream: "stderr", Data: []byte{0xff, 0}},
		{ExecutionID: "e", Seq: 1, Stream: "stdout", Data: []byte("a")},
	}
	for range 2 { // the retry must not duplicate
		if err := s.AppendEvents(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AppendEvents(ctx, []Event{{ExecutionID: "e", Seq: 3, Stream: "stdout", Data: []byte("c")}}); err != nil {
		t.Fatal(err)
	}
	all, err := s.Events(ctx, "e", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].Seq != 1 || all[1].Seq != 2 || all[2].Seq != 3 {
		t.Fatalf("events = %+v", all)
	}
	if string(all[1].Data) != "\xff\x00" || all[1].Stream != "stderr" {
		t.Fatalf("binary event not byte-exact: %+v", all[1])
	}
	tail, _ := s.Events(ctx, "e", 2)
	if len(tail) != 1 || tail[0].Seq != 3 {
		t.Fatalf("after 2: %+v", tail)
	}
}

func TestRestartMarksRunningUnknown(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db.sqlite3")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"r1", "r2", "done"} {
		if err := s.Create(ctx, Execution{ID: id, Tenant: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Finish(ctx, "done", StatusCompleted, json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = open(t, path)
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
	if err != nil || counts[StatusUnknown] != 2 || counts[StatusCompleted] != 1 {
		t.Fatalf("counts = %v, %v", counts, err)
	}
}

func TestCleanupOldRemovesOnlyOldTerminalRecords(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	s := open(t, filepath.Join(t.TempDir(), "db.sqlite3"), WithClock(clock))

	for _, id := range []string{"old-done", "old-running", "new-done"} {
		if err := s.Create(ctx, Execution{ID: id, Tenant: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AppendEvents(ctx, []Event{{ExecutionID: "old-done", Seq: 1, Stream: "stdout", Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "old-done", StatusCompleted, nil); err != nil {
		t.Fatal(err)
	}
	advance(2 * time.Hour)
	if err := s.Finish(ctx, "new-done", StatusFailed, nil); err != nil {
		t.Fatal(err)
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
}

// A database written by the Python server at schema version 1 (no
// correlation_id column) upgrades in place and keeps its rows.
func TestMigratesPythonVersionOneDatabase(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.sqlite3")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE executions (execution_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, status TEXT NOT NULL,
			result_json TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)`,
		`INSERT INTO executions VALUES ('legacy', 't', 'COMPLETED', '{"exit_code":0}',
			'2026-01-01T00:00:00.000000+00:00', '2026-01-01T00:00:00.000000+00:00')`,
		`PRAGMA user_version = 1`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	s := open(t, path)
	e, err := s.Get(ctx, "legacy", "t")
	if err != nil || e.Status != StatusCompleted || string(e.Result) != `{"exit_code":0}` {
		t.Fatalf("legacy row: %+v, %v", e, err)
	}
	if err := s.Create(ctx, Execution{ID: "new", Tenant: "t", CorrelationID: "c"}); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := s.db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != SchemaVersion() {
		t.Fatalf("user_version = %d, %v; want %d", v, err, SchemaVersion())
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db.sqlite3")
	s := open(t, path)
	if _, err := s.db.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, SchemaVersion()+1)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(context.Background(), path); !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("err = %v, want ErrNewerSchema", err)
	}
}

func TestConcurrentWritersDoNotFail(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "db.sqlite3"))
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
}
