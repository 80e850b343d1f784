package remote

import (
	"context"
	"testing"
)

// Executor names what the server runs commands with, so that a client
// can explain a relay's refusals.
func TestExecutorIsWhatTheServerReports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a pulse-worker process; skipped with -short")
	}
	b := newBackend(t, startRelayServer(t))
	if err := b.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := b.Executor(); got != "relay" {
		t.Fatalf("Executor = %q, want relay", got)
	}
}
