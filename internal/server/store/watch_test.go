package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// waitWake fails t unless wake receives within a bound far above any
// round trip (not a measurement: a missing signal would never come).
func waitWake(t *testing.T, wake <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(20 * time.Second):
		t.Fatalf("no wake after %s", what)
	}
}

// drain empties a pending wake, so the next wait sees a new one.
func drain(wake <-chan struct{}) {
	select {
	case <-wake:
	default:
	}
}

// A watch on one replica's store wakes when another replica appends
// events of the execution or finishes it, and after its listening
// connection is lost (the signals sent meanwhile are gone, so every
// watch reads again); a watch of another execution stays quiet.
func TestPostgresWatchWakesOnAnotherReplicasWrites(t *testing.T) {
	url := testenv.SharedPostgres(t).NewDatabase(t)
	ctx := context.Background()
	a, err := OpenPostgres(ctx, url, WithReplica("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenPostgres(ctx, url, WithReplica("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.Create(ctx, Execution{ID: "w:1", Tenant: "t"}); err != nil {
		t.Fatal(err)
	}
	wake, stop := b.Watch("w:1")
	defer stop()
	other, stopOther := b.Watch("w:2")
	defer stopOther()
	waitWake(t, wake, "the listener started") // it wakes every watch once listening
	// The listener's wake of every watch may reach other after wake's
	// (other may be watched only after the listener woke wake): wait
	// until this database's LISTEN session is there, then drain both.
	testenv.Eventually(t, 20*time.Second, func() error {
		n := pgCount(t, url, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN `+notifyChannel+`' AND state = 'idle'`)
		if n != 1 {
			return fmt.Errorf("%d listening sessions", n)
		}
		return nil
	})
	drain(wake)
	drain(other)

	if err := a.AppendEvents(ctx, []Event{{ExecutionID: "w:1", Seq: 1, Stream: "stdout", Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wake, "an append on the other replica")
	if err := a.Finish(ctx, "w:1", StatusCompleted, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wake, "a finish on the other replica")
	select {
	case <-other:
		t.Fatal("the watch of another execution woke")
	default:
	}

	// Cut the listening connection from the server side.
	pgExec(t, url, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN `+notifyChannel+`'`)
	waitWake(t, wake, "the listening connection was lost")
	waitWake(t, other, "the listening connection was lost")
}

func TestNotifyPayload(t *testing.T) {
	for _, id := range []string{"e1", "a:b:c", "x"} {
		got, seq, ok := cutPayload(notifyPayload(id, 42))
		if !ok || got != id || seq != 42 {
			t.Fatalf("%q: %q %d %v", id, got, seq, ok)
		}
	}
	for _, p := range []string{"", ":1", "e1", "e1:x"} {
		if _, _, ok := cutPayload(p); ok {
			t.Fatalf("%q parsed", p)
		}
	}
}

// pgCount runs a count query on url.
func pgCount(t *testing.T, url, sql string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
