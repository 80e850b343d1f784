package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Interface is what pulse-server keeps durably, whichever database holds
// it: Store (SQLite, the embedded default: one server, nothing to run)
// or Postgres (several servers sharing one database). Both keep the
// promises of the package documentation, and one table-driven
// conformance suite (conformance_test.go) runs the same cases on each.
type Interface interface {
	// Create inserts a RUNNING record owned by the store's replica; it
	// fails with ErrExists when any tenant holds the id.
	Create(ctx context.Context, e Execution) error
	// Finish records the terminal status and result of a RUNNING
	// execution, and ErrNotFound when it is not RUNNING (a late cancel
	// never overwrites a result).
	Finish(ctx context.Context, id, status string, result json.RawMessage) error
	// Get returns the execution id of tenant, or ErrNotFound.
	Get(ctx context.Context, id, tenant string) (Execution, error)
	// Exists reports whether any tenant holds id.
	Exists(ctx context.Context, id string) (bool, error)
	// MarkRunningUnknown turns the RUNNING records this replica owns
	// into UNKNOWN and returns how many there were.
	MarkRunningUnknown(ctx context.Context) (int64, error)
	// CleanupOld deletes terminal records last updated before cutoff,
	// with their events, and returns them.
	CleanupOld(ctx context.Context, cutoff time.Time) ([]Ref, error)
	// AppendEvents stores events; re-appending an event already stored
	// (same execution and seq) is harmless.
	AppendEvents(ctx context.Context, events []Event) error
	// Events returns the events of id with seq > afterSeq, in seq order,
	// each seq once.
	Events(ctx context.Context, id string, afterSeq int64) ([]Event, error)
	// CountByStatus returns how many records each status has.
	CountByStatus(ctx context.Context) (map[string]int, error)
	// Ping checks that the database answers, for /readyz.
	Ping(ctx context.Context) error
	// Close releases the database.
	Close() error
}

var _ Interface = (*Store)(nil)

// OpenDatabase opens the store that location names: a postgres:// or
// postgresql:// URL is a Postgres database (OpenPostgres), any other URL
// is refused (ErrBadURL), and a path is a SQLite database (Open).
func OpenDatabase(ctx context.Context, location string, opts ...Option) (Interface, error) {
	if IsPostgresURL(location) {
		return OpenPostgres(ctx, location, opts...)
	}
	if scheme, _, ok := strings.Cut(location, "://"); ok && !strings.ContainsAny(scheme, `/\`) {
		return nil, fmt.Errorf("store: %q URLs are not supported; use postgres:// or a SQLite path: %w", scheme, ErrBadURL)
	}
	return Open(ctx, location, opts...)
}
