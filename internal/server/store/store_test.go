package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
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
		`INSERT INTO executions VALUES ('legacy-running', 't', 'RUNNING', NULL,
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
	if err != nil || e.Status != StatusCompleted || string(e.Result) != `{"exit_code":0}` || e.Owner != "" {
		t.Fatalf("legacy row: %+v, %v", e, err)
	}
	// Its records were a single server's: the unnamed replica owns them.
	if n, err := s.MarkRunningUnknown(ctx); err != nil || n != 1 {
		t.Fatalf("MarkRunningUnknown = %d, %v; want 1", n, err)
	}
	if err := s.Create(ctx, Execution{ID: "new", Tenant: "t", CorrelationID: "c"}); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := s.db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != SchemaVersion() {
		t.Fatalf("user_version = %d, %v; want %d", v, err, SchemaVersion())
	}
}
