package store

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// Every record and event of a SQLite database arrives in Postgres as it
// was (a RUNNING one as UNKNOWN), and a second move changes nothing.
func TestMoveSQLiteToPostgres(t *testing.T) {
	ctx := context.Background()
	url := testenv.SharedPostgres(t).NewDatabase(t)
	created := time.Date(2026, 3, 4, 5, 6, 7, 891011000, time.UTC)
	src := open(t, filepath.Join(t.TempDir(), "db.sqlite3"), WithClock(func() time.Time { return created }))
	for _, e := range []Execution{
		{ID: "done", Tenant: "ta", CorrelationID: "c-1", Encoding: "base64"},
		{ID: "failed", Tenant: "tb"},
		{ID: "running", Tenant: "ta"},
	} {
		if err := src.Create(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// One event an older version wrote into the table, the rest in the
	// event log.
	if _, err := src.db.ExecContext(ctx, `INSERT INTO stream_events (execution_id, seq, stream, data) VALUES ('done', 1, 'stdout', ?)`, []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := src.AppendEvents(ctx, []Event{
		{ExecutionID: "done", Seq: 2, Stream: "stderr", Data: []byte{0, 0xff}},
		{ExecutionID: "running", Seq: 1, Stream: "stdout", Data: []byte("partial")},
	}); err != nil {
		t.Fatal(err)
	}
	if err := src.Finish(ctx, "done", StatusCompleted, json.RawMessage(`{"z":1,"a":[2]}`)); err != nil {
		t.Fatal(err)
	}
	if err := src.Finish(ctx, "failed", StatusFailed, nil); err != nil {
		t.Fatal(err)
	}

	dst, err := OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	st, err := MoveSQLiteToPostgres(ctx, dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if st != (MoveStats{Executions: 3, Events: 3, Quarantined: 1}) {
		t.Fatalf("stats %+v", st)
	}
	for _, ref := range []Ref{{"done", "ta"}, {"failed", "tb"}, {"running", "ta"}} {
		want, err := src.Get(ctx, ref.ExecutionID, ref.Tenant)
		if err != nil {
			t.Fatal(err)
		}
		if want.Status == StatusRunning {
			want.Status = StatusUnknown
		}
		got, err := dst.Get(ctx, ref.ExecutionID, ref.Tenant)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != want.Status || got.CorrelationID != want.CorrelationID || got.Encoding != want.Encoding ||
			string(got.Result) != string(want.Result) || got.Owner != want.Owner ||
			!got.CreatedAt.Equal(want.CreatedAt) || !got.UpdatedAt.Equal(want.UpdatedAt) {
			t.Fatalf("%s moved as %+v, want %+v", ref.ExecutionID, got, want)
		}
		wantEv, _ := src.Events(ctx, ref.ExecutionID, 0)
		gotEv, err := dst.Events(ctx, ref.ExecutionID, 0)
		if err != nil {
			t.Fatal(err)
		}
		sameEvents(t, gotEv, wantEv)
	}
	if got, _ := dst.Get(ctx, "done", "ta"); !got.CreatedAt.Equal(created) {
		t.Fatalf("created_at %v, want %v", got.CreatedAt, created)
	}
	again, err := MoveSQLiteToPostgres(ctx, dst, src)
	if err != nil || again != (MoveStats{Skipped: 3}) {
		t.Fatalf("second move: %+v, %v", again, err)
	}
	if ev, _ := dst.Events(ctx, "done", 0); len(ev) != 2 {
		t.Fatalf("events after a second move: %+v", ev)
	}
}
