package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/caches"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/errdefs"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// An error class is one value across the layers (errdefs): a caller
// tests with the facade's name and matches what any layer returned. The
// first rows are real operations after Close.
func TestErrorClassesMatchAcrossLayers(t *testing.T) {
	ctx := context.Background()
	lg, err := audit.Open(ctx, filepath.Join(t.TempDir(), "a.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lg.Close()
	w := secrets.NewScrubber(nil).NewWriter(discard{})
	w.Close()
	_, werr := w.Write([]byte("x"))
	sb := newHost(t, t.TempDir())
	sb.Close()
	_, serr := sb.Execute(ctx, Command{Args: []string{"true"}})
	for _, tc := range []struct {
		name  string
		err   error
		class error
	}{
		{"audit record after close", lg.Record(ctx, audit.Event{Action: "x"}), ErrClosed},
		{"secrets writer after close", werr, ErrClosed},
		{"sandbox after close", serr, ErrClosed},
		{"cowfs closed", cowfs.ErrClosed, ErrClosed},
		{"backend closed", backend.ErrClosed, ErrClosed},
		{"egress closed", egress.ErrClosed, ErrClosed},
		{"backend unavailable", backend.ErrUnavailable, ErrUnavailable},
		{"backend unsupported", backend.ErrUnsupported, ErrUnsupported},
		{"cowfs not found", cowfs.ErrNotFound, errdefs.ErrNotFound},
		{"cache not found", caches.ErrNotFound, errdefs.ErrNotFound},
		{"cowfs conflict", cowfs.ErrConflict, errdefs.ErrConflict},
		{"cowfs limit", cowfs.ErrLimit, errdefs.ErrLimit},
		{"policy limit", ErrLimitExceeded, errdefs.ErrLimit},
		{"backend invalid request", backend.ErrInvalidRequest, errdefs.ErrInvalidArgument},
		{"invalid command", ErrInvalidCommand, errdefs.ErrInvalidArgument},
		{"policy invalid", policy.ErrInvalid, errdefs.ErrInvalidArgument},
	} {
		if !errors.Is(tc.err, tc.class) {
			t.Errorf("%s: %v is not of class %v", tc.name, tc.err, tc.class)
		}
	}
	for _, err := range []error{cowfs.ErrClosed, backend.ErrClosed} {
		if errors.Is(err, ErrUnavailable) || errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%v matched a class of another", err)
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
