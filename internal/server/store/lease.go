package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Leaser is a store shared by replicas, each of which holds a lease in
// it while it lives: the Postgres store. A replica that dies (SIGKILL,
// node loss) cannot mark what it was running; another replica, finding
// its lease expired, does. The SQLite store is one server's own, whose
// interrupted records it marks itself at start (MarkRunningUnknown), and
// is not one.
type Leaser interface {
	// RenewLease extends this replica's lease to ttl from the database's
	// clock (one clock for every replica: theirs may drift). lost reports
	// that the lease had expired or been swept since the last renewal, so
	// another replica may have marked this one's running records UNKNOWN.
	RenewLease(ctx context.Context, ttl time.Duration) (lost bool, err error)
	// SweepExpired marks UNKNOWN, with the reason in their result, the
	// RUNNING records of every other replica whose lease has expired, and
	// drops those leases. It returns the records it marked. Replicas
	// sweeping at once each mark a record at most once between them.
	SweepExpired(ctx context.Context) ([]Ref, error)
}

var _ Leaser = (*Postgres)(nil)

// UnknownReason is the result an UNKNOWN record carries to say why it is
// UNKNOWN (records the Python server or a SQLite server marked carry
// none).
type UnknownReason struct {
	Reason string `json:"reason"`
}

// ReasonOf returns the reason an UNKNOWN record's result gives, or "".
func ReasonOf(e Execution) string {
	if e.Status != StatusUnknown || len(e.Result) == 0 {
		return ""
	}
	var r UnknownReason
	if json.Unmarshal(e.Result, &r) != nil {
		return ""
	}
	return r.Reason
}

func reasonJSON(format string, args ...any) string {
	b, _ := json.Marshal(UnknownReason{Reason: fmt.Sprintf(format, args...)})
	return string(b)
}

// RenewLease upserts this replica's lease to expire ttl from now on the
// database's clock.
func (s *Postgres) RenewLease(ctx context.Context, ttl time.Duration) (bool, error) {
	if ttl <= 0 {
		return false, fmt.Errorf("store: lease %v is not positive", ttl)
	}
	// old is read in the statement's snapshot, before the upsert: NULL
	// when there was no lease (the first renewal, or swept).
	var fresh *bool
	err := s.pool.QueryRow(ctx, `WITH old AS (SELECT expires_at FROM replica_leases WHERE replica = $1)
		INSERT INTO replica_leases (replica, expires_at, renewed_at)
		VALUES ($1, clock_timestamp() + make_interval(secs => $2), clock_timestamp())
		ON CONFLICT (replica) DO UPDATE SET expires_at = EXCLUDED.expires_at, renewed_at = EXCLUDED.renewed_at
		RETURNING (SELECT expires_at >= clock_timestamp() FROM old)`,
		s.replica, ttl.Seconds()).Scan(&fresh)
	if err != nil {
		return false, fmt.Errorf("store: renew lease of %q: %w", s.replica, err)
	}
	return fresh == nil || !*fresh, nil
}

// SweepExpired marks the RUNNING records of replicas whose lease expired
// UNKNOWN. The lease rows are locked SKIP LOCKED, so two replicas
// sweeping at once split the dead between them, and a dead replica that
// comes back renews only after the sweep committed (and learns it lost
// its lease).
func (s *Postgres) SweepExpired(ctx context.Context) ([]Ref, error) {
	var refs []Ref
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT replica, renewed_at FROM replica_leases
			WHERE expires_at < clock_timestamp() AND replica <> $1
			FOR UPDATE SKIP LOCKED`, s.replica)
		if err != nil {
			return err
		}
		type dead struct {
			replica string
			renewed time.Time
		}
		gone, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dead, error) {
			var d dead
			err := r.Scan(&d.replica, &d.renewed)
			return d, err
		})
		if err != nil {
			return err
		}
		for _, d := range gone {
			reason := reasonJSON("replica %s stopped renewing its lease (last renewed %s) while this ran; its outcome is unknown, and it was not run again",
				d.replica, d.renewed.UTC().Format(time.RFC3339))
			rows, err := tx.Query(ctx, `UPDATE executions SET status = $1, result_json = $2, updated_at = $3
				WHERE status = $4 AND owner = $5 RETURNING execution_id, tenant_id`,
				StatusUnknown, reason, s.stamp(), StatusRunning, d.replica)
			if err != nil {
				return err
			}
			marked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Ref, error) {
				var ref Ref
				err := r.Scan(&ref.ExecutionID, &ref.Tenant)
				return ref, err
			})
			if err != nil {
				return err
			}
			refs = append(refs, marked...)
			if _, err := tx.Exec(ctx, `DELETE FROM replica_leases WHERE replica = $1`, d.replica); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: sweep expired leases: %w", err)
	}
	for _, r := range refs {
		s.notify(ctx, r.ExecutionID, -1)
	}
	return refs, nil
}
