package store

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations[i] upgrades the schema from version i to i+1. Append only:
// a released migration never changes, because databases in the field have
// already run it.
var migrations = []func(ctx context.Context, tx *sql.Tx) error{
	// 1: the executions table of the Python server.
	func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS executions (
			execution_id TEXT PRIMARY KEY,
			tenant_id TEXT NOT NULL,
			status TEXT NOT NULL,
			correlation_id TEXT,
			result_json TEXT,
			created_at TEXT NOT NULL,
			updated_at TEXT NOT NULL
		)`)
		return err
	},
	// 2: correlation_id, which version-1 databases of the Python server
	// lack.
	func(ctx context.Context, tx *sql.Tx) error {
		has, err := hasColumn(ctx, tx, "executions", "correlation_id")
		if err != nil || has {
			return err
		}
		_, err = tx.ExecContext(ctx, `ALTER TABLE executions ADD COLUMN correlation_id TEXT`)
		return err
	},
	// 3: persisted stream history (replaces the per-workspace log file, so
	// history survives workspace cleanup and restarts), the client's
	// requested stream encoding, and an index for retention scans.
	func(ctx context.Context, tx *sql.Tx) error {
		for _, q := range []string{
			`ALTER TABLE executions ADD COLUMN encoding TEXT NOT NULL DEFAULT ''`,
			`CREATE TABLE stream_events (
				execution_id TEXT NOT NULL,
				seq INTEGER NOT NULL,
				stream TEXT NOT NULL,
				data BLOB NOT NULL,
				PRIMARY KEY (execution_id, seq)
			) WITHOUT ROWID`,
			`CREATE INDEX executions_status_updated ON executions (status, updated_at)`,
		} {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	},
	// 4: the replica that created each execution, so that a server
	// starting beside others quarantines only its own RUNNING records.
	// Earlier records were a single server's: "".
	func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `ALTER TABLE executions ADD COLUMN owner TEXT NOT NULL DEFAULT ''`)
		return err
	},
}

// SchemaVersion is the version Open migrates to.
func SchemaVersion() int { return len(migrations) }

func hasColumn(ctx context.Context, tx *sql.Tx, table, column string) (bool, error) {
	rows, err := tx.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return false, err
		}
		if name == column {
			return true, nil
		}
	}
	return false, rows.Err()
}

func (s *Store) migrate(ctx context.Context) error {
	// One dedicated connection: PRAGMA user_version is per database, but
	// the transaction must stay on the connection that read it.
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	defer conn.Close()
	for {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("store: migrate: %w", err)
		}
		var v int
		if err := tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: migrate: %w", err)
		}
		if v > len(migrations) {
			tx.Rollback()
			return fmt.Errorf("store: version %d, this server knows %d: %w", v, len(migrations), ErrNewerSchema)
		}
		if v == len(migrations) {
			return tx.Rollback()
		}
		if err := migrations[v](ctx, tx); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: migrate to version %d: %w", v+1, err)
		}
		// PRAGMA takes no bound parameters; v is an int we produced.
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v+1)); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: migrate to version %d: %w", v+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("store: migrate to version %d: %w", v+1, err)
		}
	}
}
