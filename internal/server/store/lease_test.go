package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// A replica whose lease expires has its RUNNING records marked UNKNOWN by
// another replica, with a reason naming it; records of a replica whose
// lease is live, and terminal records, are left alone; the swept replica
// learns at its next renewal that it lost the lease. No clock is faked:
// the leases run on the database's clock, so a short lease is let lapse.
func TestLeaseSweep(t *testing.T) {
	url := testenv.SharedPostgres(t).NewDatabase(t)
	ctx := context.Background()
	open := func(replica string) *Postgres {
		s, err := OpenPostgres(ctx, url, WithReplica(replica))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	dead, live, sweeper := open("dead"), open("live"), open("sweeper")
	for _, s := range []*Postgres{dead, live, sweeper} {
		if lost, err := s.RenewLease(ctx, time.Hour); err != nil || !lost {
			// A first renewal has no lease before it: lost.
			t.Fatalf("first renewal: lost %v, %v", lost, err)
		}
	}
	for _, c := range []struct {
		s  *Postgres
		id string
	}{{dead, "d1"}, {dead, "d2"}, {live, "l1"}, {sweeper, "s1"}} {
		if err := c.s.Create(ctx, Execution{ID: c.id, Tenant: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := dead.Finish(ctx, "d2", StatusCompleted, []byte(`{"exit_code":0}`)); err != nil {
		t.Fatal(err)
	}
	if refs, err := sweeper.SweepExpired(ctx); err != nil || len(refs) != 0 {
		t.Fatalf("sweep with every lease live: %v, %v", refs, err)
	}
	if lost, err := dead.RenewLease(ctx, time.Millisecond); err != nil || lost {
		t.Fatalf("renewal of a live lease: lost %v, %v", lost, err)
	}
	var refs []Ref
	testenv.Eventually(t, 10*time.Second, func() error {
		var err error
		refs, err = sweeper.SweepExpired(ctx)
		if err == nil && len(refs) == 0 {
			err = errors.New("nothing swept yet")
		}
		return err
	})
	if len(refs) != 1 || refs[0] != (Ref{ExecutionID: "d1", Tenant: "t"}) {
		t.Fatalf("swept %v; want d1 alone", refs)
	}
	got, err := live.Get(ctx, "d1", "t")
	if err != nil || got.Status != StatusUnknown || !strings.Contains(ReasonOf(got), "replica dead stopped renewing its lease") {
		t.Fatalf("d1 after the sweep: %+v (reason %q), %v", got, ReasonOf(got), err)
	}
	for id, want := range map[string]string{"d2": StatusCompleted, "l1": StatusRunning, "s1": StatusRunning} {
		if got, err := live.Get(ctx, id, "t"); err != nil || got.Status != want {
			t.Fatalf("%s after the sweep: %+v, %v; want %s", id, got, err, want)
		}
	}
	// The dead replica's late result does not overwrite the UNKNOWN.
	if err := dead.Finish(ctx, "d1", StatusCompleted, []byte(`{}`)); err == nil {
		t.Fatal("a swept record took a late result")
	}
	if lost, err := dead.RenewLease(ctx, time.Hour); err != nil || !lost {
		t.Fatalf("renewal after the sweep: lost %v, %v; want lost", lost, err)
	}
	if refs, err := sweeper.SweepExpired(ctx); err != nil || len(refs) != 0 {
		t.Fatalf("second sweep: %v, %v", refs, err)
	}
}

// A replica that restarts under its name marks its own interrupted
// records UNKNOWN with a reason saying so.
func TestRestartReason(t *testing.T) {
	url := testenv.SharedPostgres(t).NewDatabase(t)
	ctx := context.Background()
	s, err := OpenPostgres(ctx, url, WithReplica("r"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Create(ctx, Execution{ID: "e", Tenant: "t"}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.MarkRunningUnknown(ctx); n != 1 || err != nil {
		t.Fatalf("MarkRunningUnknown = %d, %v", n, err)
	}
	got, _ := s.Get(ctx, "e", "t")
	if !strings.Contains(ReasonOf(got), "replica r restarted") {
		t.Fatalf("reason %q", ReasonOf(got))
	}
}
