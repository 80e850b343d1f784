package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pgMigrations[i] upgrades a Postgres schema from version i to i+1.
// Append only, as for SQLite. The tables have the SQLite store's names
// and columns (version 4 there), typed for Postgres: timestamps are
// timestamptz, stream data bytea. Results stay text, byte for byte as
// the server wrote them (jsonb would reorder keys).
var pgMigrations = []string{
	// 1: records, their events, and the indexes of retention and of
	// MarkRunningUnknown.
	`CREATE TABLE executions (
		execution_id text PRIMARY KEY,
		tenant_id text NOT NULL,
		status text NOT NULL,
		correlation_id text,
		encoding text NOT NULL DEFAULT '',
		result_json text,
		owner text NOT NULL DEFAULT '',
		created_at timestamptz NOT NULL,
		updated_at timestamptz NOT NULL
	);
	CREATE INDEX executions_status_updated ON executions (status, updated_at);
	CREATE INDEX executions_running_owner ON executions (owner) WHERE status = 'RUNNING';
	CREATE TABLE stream_events (
		execution_id text NOT NULL,
		seq bigint NOT NULL CHECK (seq > 0),
		stream text NOT NULL CHECK (stream IN ('stdout', 'stderr')),
		data bytea NOT NULL,
		PRIMARY KEY (execution_id, seq)
	);`,
	// 2: one lease per live replica (Leaser): a replica whose lease
	// expired died, and another marks its running records.
	`CREATE TABLE replica_leases (
		replica text PRIMARY KEY,
		expires_at timestamptz NOT NULL,
		renewed_at timestamptz NOT NULL
	);`,
}

// pgMigrationLock is the advisory lock key that orders replicas
// migrating at once ("pulsemig" in ASCII).
const pgMigrationLock int64 = 0x70756c73656d6967

func (s *Postgres) migrate(ctx context.Context) error {
	for {
		done, err := s.migrateStep(ctx)
		if err != nil || done {
			return err
		}
	}
}

// migrateStep applies the next migration in a transaction of its own,
// holding the lock so that a replica starting at the same time waits and
// then finds the new version. It reports whether the schema is current.
func (s *Postgres) migrateStep(ctx context.Context) (bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("store: migrate: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, pgMigrationLock); err != nil {
		return false, fmt.Errorf("store: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS pulse_schema (version integer NOT NULL)`); err != nil {
		return false, fmt.Errorf("store: migrate: %w", err)
	}
	var v int
	err = tx.QueryRow(ctx, `SELECT version FROM pulse_schema`).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := tx.Exec(ctx, `INSERT INTO pulse_schema (version) VALUES (0)`); err != nil {
			return false, fmt.Errorf("store: migrate: %w", err)
		}
	} else if err != nil {
		return false, fmt.Errorf("store: migrate: %w", err)
	}
	if v > len(pgMigrations) {
		return false, fmt.Errorf("store: version %d, this server knows %d: %w", v, len(pgMigrations), ErrNewerSchema)
	}
	if v == len(pgMigrations) {
		return true, tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, pgMigrations[v]); err != nil {
		return false, fmt.Errorf("store: migrate to version %d: %w", v+1, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE pulse_schema SET version = $1`, v+1); err != nil {
		return false, fmt.Errorf("store: migrate to version %d: %w", v+1, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("store: migrate to version %d: %w", v+1, err)
	}
	return false, nil
}
