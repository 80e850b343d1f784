package store

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestMain stops the Postgres cluster the tests shared (one start per
// test binary: the cases make databases of their own in it).
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopSharedPostgres()
	os.Exit(code)
}

// implementations lists what the conformance suite runs on: SQLite, and
// Postgres in a throwaway cluster the package's tests share (skipped,
// naming why, where the server programs are missing; failed instead
// with PULSE_REQUIRE_POSTGRES=1, as in CI).
func implementations() []impl {
	return []impl{sqliteImpl(), postgresImpl()}
}

func postgresImpl() impl {
	return impl{
		name: "postgres",
		start: func(t *testing.T) func(t *testing.T) string {
			cluster := testenv.SharedPostgres(t)
			return func(t *testing.T) string { return cluster.NewDatabase(t) }
		},
		bumpSchema: func(t *testing.T, location string) {
			pgExec(t, location, `UPDATE pulse_schema SET version = version + 1`)
		},
	}
}

// pgExec runs one statement on the database at url with a connection of
// its own, for tests that reach behind the store.
func pgExec(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
}
