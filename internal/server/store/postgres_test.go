package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// Replicas starting at once on a new database all migrate it without an
// error: the migration lock orders them and the later ones find the
// schema current.
func TestPostgresReplicasMigrateAtOnce(t *testing.T) {
	url := testenv.SharedPostgres(t).NewDatabase(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := OpenPostgres(ctx, url, WithReplica(string(rune('a'+i))))
			if err == nil {
				err = s.Create(ctx, Execution{ID: "e" + string(rune('a'+i)), Tenant: "t"})
				s.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var v int
	if err := s.pool.QueryRow(ctx, `SELECT version FROM pulse_schema`).Scan(&v); err != nil || v != len(pgMigrations) {
		t.Fatalf("schema version %d, %v; want %d", v, err, len(pgMigrations))
	}
	var rows int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pulse_schema`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("pulse_schema has %d rows, %v; want 1", rows, err)
	}
}

// A location is Postgres only by its scheme; another URL is refused
// rather than taken for a SQLite file name, and no error or log form of
// a location repeats its password.
func TestLocationsAndRedaction(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Chdir(dir)
	for _, loc := range []string{"mysql://u:s3cret@db/x", "http://example.invalid/db"} {
		_, err := OpenDatabase(ctx, loc)
		if !errors.Is(err, ErrBadURL) || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("OpenDatabase(%s) = %v, want ErrBadURL without the password", loc, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a refused URL left files: %v", ents)
	}
	for _, loc := range []string{
		"postgres://u:s3cret@db:notaport/x",                         // does not parse
		"postgres://u:s3cret@/x?host=" + dir + "&connect_timeout=5", // nothing listens there
		"postgresql://u@/x?host=" + dir + "&password=s3cret&connect_timeout=5",
	} {
		_, err := OpenDatabase(ctx, loc)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("OpenDatabase(%q) = %v, want an error without the password", loc, err)
		}
	}
	for loc, want := range map[string]string{
		"postgres://u:s3cret@db:5432/pulse?sslmode=require&password=s3cret": "postgres://u@db:5432/pulse",
		"postgresql://db/pulse":     "postgresql://db/pulse",
		"/var/lib/pulse/db.sqlite3": "/var/lib/pulse/db.sqlite3",
	} {
		if got := Redact(loc); got != want {
			t.Fatalf("Redact(%q) = %q, want %q", loc, got, want)
		}
	}
	// A SQLite path that merely contains a colon is still a path.
	s, err := OpenDatabase(ctx, filepath.Join(dir, "a:b.sqlite3"))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
