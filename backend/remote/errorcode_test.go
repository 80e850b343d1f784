package remote

import (
	"context"
	"errors"
	"testing"

	"github.com/pulse-agent/pulse/backend"
)

// TestErrorClassCrossesTheWire: a command the server's backend refuses
// after the submission was accepted (here a program that does not exist,
// which the host backend refuses as ErrInvalidRequest when it tries to
// start it) comes back to the client as the same error class, carried by
// the result's error_code.
func TestErrorClassCrossesTheWire(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url)
	if err := b.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Args: []string{"/nonexistent/program"}, Network: allowAll})
	if !errors.Is(err, backend.ErrInvalidRequest) || errors.Is(err, backend.ErrUnavailable) || res != nil {
		t.Fatalf("result %v, error %v; want ErrInvalidRequest alone", res, err)
	}
}
