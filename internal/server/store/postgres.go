package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrBadURL: a database location looks like a URL this store cannot
// open. The error never repeats the URL, which may hold a password.
var ErrBadURL = errors.New("database URL not usable")

// Postgres is the store on a PostgreSQL database, shared by several
// pulse-server replicas: records and stream events are rows, so any
// replica can answer for, and replay, an execution another one ran. It
// is safe for concurrent use.
type Postgres struct {
	pool    *pgxpool.Pool
	now     func() time.Time
	replica string
	watch   watchers
}

var _ Interface = (*Postgres)(nil)

// IsPostgresURL reports whether location names a Postgres database
// (postgres:// or postgresql://) rather than a SQLite file.
func IsPostgresURL(location string) bool {
	return strings.HasPrefix(location, "postgres://") || strings.HasPrefix(location, "postgresql://")
}

// Redact returns location fit for a log line: a Postgres URL without its
// password (in the user part or the query) and other query parameters,
// a path as it is.
func Redact(location string) string {
	if !IsPostgresURL(location) {
		return location
	}
	u, err := url.Parse(location)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	out := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	if u.User != nil {
		out.User = url.User(u.User.Username())
	}
	return out.String()
}

// OpenPostgres connects to the database at the postgres:// URL and
// migrates it to the current schema. Replicas may run it at once: the
// migrations take a lock in the database.
func OpenPostgres(ctx context.Context, location string, opts ...Option) (*Postgres, error) {
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	if !IsPostgresURL(location) {
		return nil, fmt.Errorf("store: not a postgres:// URL: %w", ErrBadURL)
	}
	cfg, err := pgxpool.ParseConfig(location)
	if err != nil {
		// Not wrapped: pgx's message quotes the URL, and its redaction
		// is best effort.
		return nil, fmt.Errorf("store: the Postgres URL does not parse (it is not shown here: it may hold a password): %w", ErrBadURL)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "pulse-server"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: postgres: %w", err)
	}
	s := &Postgres{pool: pool, now: o.now, replica: o.replica}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: connect to %s: %w", Redact(location), err)
	}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close stops the listener of Watch and closes the connection pool.
func (s *Postgres) Close() error {
	s.watch.close()
	s.pool.Close()
	return nil
}

// stamp is the store's clock at the database's resolution.
func (s *Postgres) stamp() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

// Create inserts a RUNNING record owned by the store's replica, or fails
// with ErrExists when any tenant holds the id.
func (s *Postgres) Create(ctx context.Context, e Execution) error {
	now := s.stamp()
	var corr *string
	if e.CorrelationID != "" {
		corr = &e.CorrelationID
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO executions
		(execution_id, tenant_id, status, correlation_id, encoding, owner, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $7)`,
		e.ID, e.Tenant, StatusRunning, corr, e.Encoding, s.replica, now)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
			return fmt.Errorf("store: %s: %w", e.ID, ErrExists)
		}
		return fmt.Errorf("store: create %s: %w", e.ID, err)
	}
	return nil
}

// Finish records the terminal status and result of a RUNNING execution;
// a record no longer RUNNING is not overwritten (ErrNotFound).
func (s *Postgres) Finish(ctx context.Context, id, status string, result json.RawMessage) error {
	var res *string
	if len(result) > 0 {
		r := string(result)
		res = &r
	}
	tag, err := s.pool.Exec(ctx, `UPDATE executions SET status = $1, result_json = $2, updated_at = $3
		WHERE execution_id = $4 AND status = $5`, status, res, s.stamp(), id, StatusRunning)
	if err != nil {
		return fmt.Errorf("store: finish %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: finish %s: not running: %w", id, ErrNotFound)
	}
	s.notify(ctx, id, -1)
	return nil
}

// notify tells the replicas watching id (Watch) that its rows changed.
// A failure is not the write's: the rows are stored, and a watcher's
// periodic re-read finds them.
func (s *Postgres) notify(ctx context.Context, id string, seq int64) {
	_, _ = s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, notifyChannel, notifyPayload(id, seq))
}

// Get returns the execution id of tenant, or ErrNotFound.
func (s *Postgres) Get(ctx context.Context, id, tenant string) (Execution, error) {
	var (
		e         = Execution{ID: id, Tenant: tenant}
		corr, res *string
	)
	err := s.pool.QueryRow(ctx, `SELECT status, result_json, created_at, updated_at, correlation_id, encoding, owner
		FROM executions WHERE execution_id = $1 AND tenant_id = $2`, id, tenant).
		Scan(&e.Status, &res, &e.CreatedAt, &e.UpdatedAt, &corr, &e.Encoding, &e.Owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return Execution{}, fmt.Errorf("store: %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Execution{}, fmt.Errorf("store: get %s: %w", id, err)
	}
	if corr != nil {
		e.CorrelationID = *corr
	}
	if res != nil && *res != "" {
		e.Result = json.RawMessage(*res)
	}
	e.CreatedAt, e.UpdatedAt = e.CreatedAt.UTC(), e.UpdatedAt.UTC()
	return e, nil
}

// Exists reports whether any tenant holds id.
func (s *Postgres) Exists(ctx context.Context, id string) (bool, error) {
	var ok bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM executions WHERE execution_id = $1)`, id).Scan(&ok); err != nil {
		return false, fmt.Errorf("store: exists %s: %w", id, err)
	}
	return ok, nil
}

// MarkRunningUnknown quarantines the RUNNING records of this replica as
// UNKNOWN and returns how many there were; other replicas' are left
// alone.
func (s *Postgres) MarkRunningUnknown(ctx context.Context) (int64, error) {
	reason := reasonJSON("replica %s restarted while this ran; its outcome is unknown, and it was not run again", s.replica)
	tag, err := s.pool.Exec(ctx, `UPDATE executions SET status = $1, updated_at = $2, result_json = $5
		WHERE status = $3 AND owner = $4`, StatusUnknown, s.stamp(), StatusRunning, s.replica, reason)
	if err != nil {
		return 0, fmt.Errorf("store: mark unknown: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CleanupOld deletes terminal records last updated before cutoff with
// their events, in one statement, and returns what it deleted.
func (s *Postgres) CleanupOld(ctx context.Context, cutoff time.Time) ([]Ref, error) {
	rows, err := s.pool.Query(ctx, `WITH gone AS (
			DELETE FROM executions WHERE status IN ($1, $2, $3) AND updated_at < $4
			RETURNING execution_id, tenant_id
		), events AS (
			DELETE FROM stream_events WHERE execution_id IN (SELECT execution_id FROM gone)
		)
		SELECT execution_id, tenant_id FROM gone ORDER BY execution_id`,
		StatusCompleted, StatusFailed, StatusUnknown, cutoff.UTC())
	if err != nil {
		return nil, fmt.Errorf("store: cleanup: %w", err)
	}
	refs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Ref, error) {
		var ref Ref
		err := r.Scan(&ref.ExecutionID, &ref.Tenant)
		return ref, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: cleanup: %w", err)
	}
	return refs, nil
}

// AppendEvents inserts events in one statement. An event already stored
// (same execution and seq) keeps its first bytes, as the SQLite store's
// log does, so a retried batch is harmless.
func (s *Postgres) AppendEvents(ctx context.Context, events []Event) error {
	if err := appendPgEvents(ctx, s.pool, events); err != nil {
		return err
	}
	// After the insert committed, so a watcher that reads on the signal
	// finds the rows. One signal per execution, with its last seq.
	last := map[string]int64{}
	for _, e := range events {
		last[e.ExecutionID] = max(last[e.ExecutionID], e.Seq)
	}
	for id, seq := range last {
		s.notify(ctx, id, seq)
	}
	return nil
}

// pgExecer is a pool or a transaction.
type pgExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func appendPgEvents(ctx context.Context, q pgExecer, events []Event) error {
	if len(events) == 0 {
		return ctx.Err()
	}
	ids := make([]string, len(events))
	seqs := make([]int64, len(events))
	streams := make([]string, len(events))
	data := make([][]byte, len(events))
	for i, e := range events {
		if e.Stream != "stdout" && e.Stream != "stderr" {
			return fmt.Errorf("store: stream %q: %w", e.Stream, errEventLog)
		}
		if e.Seq <= 0 {
			return fmt.Errorf("store: seq %d: %w", e.Seq, errEventLog)
		}
		ids[i], seqs[i], streams[i], data[i] = e.ExecutionID, e.Seq, e.Stream, e.Data
		if data[i] == nil {
			data[i] = []byte{} // nil would be SQL NULL
		}
	}
	// unnest keeps the batch's order, and ON CONFLICT DO NOTHING skips
	// a row whose key an earlier one (stored, or in this batch) holds.
	_, err := q.Exec(ctx, `INSERT INTO stream_events (execution_id, seq, stream, data)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[])
		ON CONFLICT (execution_id, seq) DO NOTHING`, ids, seqs, streams, data)
	if err != nil {
		return fmt.Errorf("store: append events: %w", err)
	}
	return nil
}

// Events returns the events of id with seq > afterSeq in seq order.
func (s *Postgres) Events(ctx context.Context, id string, afterSeq int64) ([]Event, error) {
	rows, err := s.pool.Query(ctx, `SELECT seq, stream, data FROM stream_events
		WHERE execution_id = $1 AND seq > $2 ORDER BY seq`, id, afterSeq)
	if err != nil {
		return nil, fmt.Errorf("store: events %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		e := Event{ExecutionID: id}
		err := r.Scan(&e.Seq, &e.Stream, &e.Data)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: events %s: %w", id, err)
	}
	return out, nil
}

// CountByStatus returns how many records each status has.
func (s *Postgres) CountByStatus(ctx context.Context) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT status, COUNT(*) FROM executions GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("store: count: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("store: count: %w", err)
		}
		out[st] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: count: %w", err)
	}
	return out, nil
}

// Ping checks that the database answers, for /readyz.
func (s *Postgres) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }
