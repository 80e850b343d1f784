package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"modernc.org/sqlite" // registers the pure-Go "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Execution statuses as the wire protocol and the database spell them.
const (
	StatusRunning   = "RUNNING"
	StatusCompleted = "COMPLETED"
	StatusFailed    = "FAILED"
	StatusUnknown   = "UNKNOWN"
)

// Error classes of the store; test with errors.Is.
var (
	// ErrNotFound: no execution with that id for that tenant.
	ErrNotFound = errors.New("execution not found")
	// ErrExists: the execution id is already taken (by any tenant).
	ErrExists = errors.New("execution id already in use")
	// ErrNewerSchema: the database was written by a newer version.
	ErrNewerSchema = errors.New("database schema is newer than this server")
)

// timeLayout is Python's datetime.isoformat() for an aware UTC time, the
// format the previous implementation wrote.
const timeLayout = "2006-01-02T15:04:05.000000+00:00"

// Execution is one execution's durable record.
type Execution struct {
	ID            string
	Tenant        string
	Status        string
	CorrelationID string
	// Encoding is how stream data is sent to clients: "" (UTF-8 text) or
	// "base64".
	Encoding string
	// Owner is the replica that created the execution (the store's
	// WithReplica; "" for a single server). Create ignores it.
	Owner string
	// Result is the JSON result payload, nil until the execution ends.
	Result    json.RawMessage
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Event is one chunk of output of an execution.
type Event struct {
	ExecutionID string
	Seq         int64
	Stream      string
	Data        []byte
}

// Ref names an execution and its tenant.
type Ref struct {
	ExecutionID string
	Tenant      string
}

// Store is the execution database on SQLite, the embedded default (its
// name predates Interface and Postgres). It is safe for concurrent use,
// also by several Stores on one file on one machine.
type Store struct {
	db  *sql.DB
	now func() time.Time
	// replica owns the records this store creates (WithReplica).
	replica string
	// eventsDir holds one event log per execution (eventlog.go).
	eventsDir string
	// The statements every execution runs, prepared once: compiling one
	// costs about as much as running it (each connection of the pool
	// compiles a statement once, on its first use there).
	create, finish, get, exists *sql.Stmt
}

// Statements of Store's per-execution calls.
const (
	createSQL = `INSERT INTO executions (execution_id, tenant_id, status, correlation_id, encoding, created_at, updated_at, owner)
		 VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	finishSQL = `UPDATE executions SET status = ?, result_json = ?, updated_at = ?
		 WHERE execution_id = ? AND status = ?`
	getSQL = `SELECT status, result_json, created_at, updated_at, correlation_id, encoding, owner
		 FROM executions WHERE execution_id = ? AND tenant_id = ?`
	existsSQL = `SELECT 1 FROM executions WHERE execution_id = ?`
)

// prepare prepares the per-execution statements.
func (s *Store) prepare(ctx context.Context) error {
	for _, st := range []struct {
		dst **sql.Stmt
		sql string
	}{{&s.create, createSQL}, {&s.finish, finishSQL}, {&s.get, getSQL}, {&s.exists, existsSQL}} {
		stmt, err := s.db.PrepareContext(ctx, st.sql)
		if err != nil {
			return fmt.Errorf("store: prepare: %w", err)
		}
		*st.dst = stmt
	}
	return nil
}

// Option configures Open.
type Option func(*options) error

type options struct {
	now     func() time.Time
	replica string
}

// WithReplica names the server process the store works for: records it
// creates carry the name, and MarkRunningUnknown touches only records
// carrying it, so a server starting beside others on a shared database
// never quarantines their running executions. The default "" is a
// single server's (every record of a SQLite database written by an
// earlier version has it).
func WithReplica(id string) Option {
	return func(o *options) error {
		if len(id) > 255 {
			return errors.New("store: replica id longer than 255 bytes")
		}
		o.replica = id
		return nil
	}
}

// WithClock replaces time.Now, for retention tests.
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		if now == nil {
			return errors.New("store: nil clock")
		}
		o.now = now
		return nil
	}
}

func applyOptions(opts []Option) (options, error) {
	o := options{now: time.Now}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// Open opens (creating if needed) the SQLite database at path and
// migrates it to the current schema.
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("store: create directory: %w", err)
	}
	// busy_timeout turns writer contention into waiting instead of
	// SQLITE_BUSY; immediate transactions take the write lock up front so
	// two writers never deadlock upgrading a read lock.
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	dsn := "file:" + (&url.URL{Path: abs}).EscapedPath() + "?" + q.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", filepath.Base(abs), err)
	}
	db.SetMaxOpenConns(8)
	eventsDir := abs + "-events"
	if err := os.MkdirAll(eventsDir, 0o700); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: create event directory: %w", err)
	}
	s := &Store{db: db, now: o.now, replica: o.replica, eventsDir: eventsDir}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		db.Close()
		return nil, fmt.Errorf("store: journal mode is %q, want wal", mode)
	}
	if err := s.prepare(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database. It returns nil when already closed.
func (s *Store) Close() error {
	for _, st := range []*sql.Stmt{s.create, s.finish, s.get, s.exists} {
		if st != nil {
			st.Close()
		}
	}
	return s.db.Close()
}

func (s *Store) stamp() string { return s.now().UTC().Format(timeLayout) }

func parseStamp(v string) time.Time {
	for _, layout := range []string{timeLayout, time.RFC3339Nano} {
		if t, err := time.Parse(layout, v); err == nil {
			return t
		}
	}
	return time.Time{}
}

// Create inserts a RUNNING record. It fails with ErrExists when the id is
// taken by any tenant: ids are global so that workspaces and event logs can
// never be confused between tenants.
func (s *Store) Create(ctx context.Context, e Execution) error {
	now := s.stamp()
	var corr any
	if e.CorrelationID != "" {
		corr = e.CorrelationID
	}
	_, err := s.create.ExecContext(ctx,
		e.ID, e.Tenant, StatusRunning, corr, e.Encoding, now, now, s.replica)
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("store: %s: %w", e.ID, ErrExists)
		}
		return fmt.Errorf("store: create %s: %w", e.ID, err)
	}
	return nil
}

// isUniqueViolation reports whether err is SQLite refusing a second row
// with the same key, told by the driver's extended result code.
func isUniqueViolation(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	return se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}

// Finish records the terminal status and result of a RUNNING execution.
// It does not overwrite a record that is no longer RUNNING.
func (s *Store) Finish(ctx context.Context, id, status string, result json.RawMessage) error {
	var res any
	if len(result) > 0 {
		res = string(result)
	}
	r, err := s.finish.ExecContext(ctx,
		status, res, s.stamp(), id, StatusRunning)
	if err != nil {
		return fmt.Errorf("store: finish %s: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return fmt.Errorf("store: finish %s: not running: %w", id, ErrNotFound)
	}
	return nil
}

// Get returns the execution id of tenant, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id, tenant string) (Execution, error) {
	var (
		e                Execution
		corr, res, enc   sql.NullString
		created, updated string
	)
	err := s.get.QueryRowContext(ctx, id, tenant).
		Scan(&e.Status, &res, &created, &updated, &corr, &enc, &e.Owner)
	if errors.Is(err, sql.ErrNoRows) {
		return Execution{}, fmt.Errorf("store: %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Execution{}, fmt.Errorf("store: get %s: %w", id, err)
	}
	e.ID, e.Tenant = id, tenant
	e.CorrelationID, e.Encoding = corr.String, enc.String
	if res.Valid && res.String != "" {
		e.Result = json.RawMessage(res.String)
	}
	e.CreatedAt, e.UpdatedAt = parseStamp(created), parseStamp(updated)
	return e, nil
}

// Exists reports whether any tenant holds id.
func (s *Store) Exists(ctx context.Context, id string) (bool, error) {
	var one int
	err := s.exists.QueryRowContext(ctx, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: exists %s: %w", id, err)
	}
	return true, nil
}

// MarkRunningUnknown quarantines every RUNNING record this replica owns
// (WithReplica) as UNKNOWN and returns how many there were. Call it once
// at startup, before serving.
func (s *Store) MarkRunningUnknown(ctx context.Context) (int64, error) {
	r, err := s.db.ExecContext(ctx,
		`UPDATE executions SET status = ?, updated_at = ? WHERE status = ? AND owner = ?`,
		StatusUnknown, s.stamp(), StatusRunning, s.replica)
	if err != nil {
		return 0, fmt.Errorf("store: mark unknown: %w", err)
	}
	return r.RowsAffected()
}

// CleanupOld deletes terminal records (COMPLETED, FAILED, UNKNOWN) last
// updated before cutoff, with their events, and returns what it deleted so
// the caller can remove their workspaces.
func (s *Store) CleanupOld(ctx context.Context, cutoff time.Time) ([]Ref, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: cleanup: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx,
		`SELECT execution_id, tenant_id FROM executions
		 WHERE status IN (?, ?, ?) AND updated_at < ?`,
		StatusCompleted, StatusFailed, StatusUnknown, cutoff.UTC().Format(timeLayout))
	if err != nil {
		return nil, fmt.Errorf("store: cleanup: %w", err)
	}
	var refs []Ref
	for rows.Next() {
		var r Ref
		if err := rows.Scan(&r.ExecutionID, &r.Tenant); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store: cleanup: %w", err)
		}
		refs = append(refs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: cleanup: %w", err)
	}
	for _, r := range refs {
		if _, err := tx.ExecContext(ctx, `DELETE FROM stream_events WHERE execution_id = ?`, r.ExecutionID); err != nil {
			return nil, fmt.Errorf("store: cleanup: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM executions WHERE execution_id = ?`, r.ExecutionID); err != nil {
			return nil, fmt.Errorf("store: cleanup: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store: cleanup: %w", err)
	}
	for _, r := range refs {
		if err := s.removeLog(r.ExecutionID); err != nil {
			return refs, err
		}
	}
	return refs, nil
}

// AppendEvents writes events to their executions' event logs, each
// execution's batch in one write. Re-appending an event already stored
// (same execution and seq) is harmless: Events returns it once.
func (s *Store) AppendEvents(ctx context.Context, events []Event) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("store: append events: %w", err)
	}
	for i := 0; i < len(events); {
		j := i + 1
		for j < len(events) && events[j].ExecutionID == events[i].ExecutionID {
			j++
		}
		if err := s.appendLog(events[i].ExecutionID, events[i:j]); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// Events returns the events of id with seq > afterSeq, in seq order, each
// once: those an older version wrote into the database, then the event
// log.
func (s *Store) Events(ctx context.Context, id string, afterSeq int64) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT seq, stream, data FROM stream_events WHERE execution_id = ? AND seq > ? ORDER BY seq`,
		id, afterSeq)
	if err != nil {
		return nil, fmt.Errorf("store: events %s: %w", id, err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		e := Event{ExecutionID: id}
		if err := rows.Scan(&e.Seq, &e.Stream, &e.Data); err != nil {
			return nil, fmt.Errorf("store: events %s: %w", id, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: events %s: %w", id, err)
	}
	logged, err := s.readLog(id, afterSeq)
	if err != nil {
		return nil, err
	}
	if len(logged) == 0 {
		return out, nil
	}
	all := append(out, logged...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].Seq < all[j].Seq })
	uniq := all[:0]
	for _, e := range all {
		if len(uniq) == 0 || e.Seq != uniq[len(uniq)-1].Seq {
			uniq = append(uniq, e)
		}
	}
	return uniq, nil
}

// CountByStatus returns how many records each status has, for metrics and
// for checking the store against what clients saw.
func (s *Store) CountByStatus(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT status, COUNT(*) FROM executions GROUP BY status`)
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
	return out, rows.Err()
}

// Ping checks that the database answers, for /readyz.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }
