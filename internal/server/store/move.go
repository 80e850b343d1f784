package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// MoveStats says what MoveSQLiteToPostgres did.
type MoveStats struct {
	// Moved records, and the events they brought.
	Executions, Events int
	// Skipped records: dst already held their id (an earlier move).
	Skipped int
	// Quarantined records were RUNNING in src and arrive UNKNOWN.
	Quarantined int
}

// MoveSQLiteToPostgres copies every record of src, with its events, into
// dst, for a server that grows from one machine to several replicas. Run
// it with every server on src stopped. Each record moves in one
// transaction with its events, and a record whose id dst already holds is
// skipped, so a move that was cut short runs again to completion. A
// record still RUNNING in src (its server was killed) arrives UNKNOWN, as
// that server would have marked it at its next start: no server will
// ever finish it. Timestamps, owners, results and event bytes move as
// they are.
func MoveSQLiteToPostgres(ctx context.Context, dst *Postgres, src *Store) (MoveStats, error) {
	var st MoveStats
	type record struct {
		e                Execution
		corr, res        sql.NullString
		created, updated string
	}
	rows, err := src.db.QueryContext(ctx, `SELECT execution_id, tenant_id, status, correlation_id, encoding,
		result_json, owner, created_at, updated_at FROM executions ORDER BY created_at, execution_id`)
	if err != nil {
		return st, fmt.Errorf("store: move: read %w", err)
	}
	var recs []record
	for rows.Next() {
		var r record
		if err := rows.Scan(&r.e.ID, &r.e.Tenant, &r.e.Status, &r.corr, &r.e.Encoding, &r.res, &r.e.Owner, &r.created, &r.updated); err != nil {
			rows.Close()
			return st, fmt.Errorf("store: move: read: %w", err)
		}
		recs = append(recs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("store: move: read: %w", err)
	}
	for _, r := range recs {
		stamp := func(v string) time.Time {
			if t := parseStamp(v); !t.IsZero() {
				return t.UTC().Truncate(time.Microsecond)
			}
			return dst.stamp()
		}
		status := r.e.Status
		if status == StatusRunning {
			status = StatusUnknown
		}
		var corr, res *string
		if r.corr.Valid && r.corr.String != "" {
			corr = &r.corr.String
		}
		if r.res.Valid && r.res.String != "" {
			res = &r.res.String
		}
		events, err := src.Events(ctx, r.e.ID, 0)
		if err != nil {
			return st, fmt.Errorf("store: move %s: %w", r.e.ID, err)
		}
		tx, err := dst.pool.Begin(ctx)
		if err != nil {
			return st, fmt.Errorf("store: move %s: %w", r.e.ID, err)
		}
		tag, err := tx.Exec(ctx, `INSERT INTO executions
			(execution_id, tenant_id, status, correlation_id, encoding, result_json, owner, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (execution_id) DO NOTHING`,
			r.e.ID, r.e.Tenant, status, corr, r.e.Encoding, res, r.e.Owner, stamp(r.created), stamp(r.updated))
		if err == nil && tag.RowsAffected() == 1 {
			err = appendPgEvents(ctx, tx, events)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			tx.Rollback(ctx)
			return st, fmt.Errorf("store: move %s: %w", r.e.ID, err)
		}
		if tag.RowsAffected() == 0 {
			st.Skipped++
			continue
		}
		st.Executions++
		st.Events += len(events)
		if status != r.e.Status {
			st.Quarantined++
		}
	}
	return st, nil
}
