//go:build linux

package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestMain lets the namespace backend, the reference of the benchmarks,
// re-run this binary as its sandbox init.
func TestMain(m *testing.M) {
	namespace.Init()
	os.Exit(m.Run())
}

// newBackend makes a probed backend with its own state dir, or ends the
// test naming why runsc cannot start here (a failure under
// PULSE_REQUIRE_GVISOR).
func newBackend(t testing.TB, opts ...Option) *Backend {
	t.Helper()
	b, err := New(append([]Option{WithStateDir(filepath.Join(t.TempDir(), "state")), WithLogger(testenv.Logger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Probe(ctx); err != nil {
		testenv.Missing(t, testenv.GVisor, err.Error())
	}
	// The tests run on the warm sandbox unless they ask for cold: one
	// that fell back to cold sandboxes tested the fallback instead.
	t.Cleanup(func() {
		if ok, err := b.Warm(); !ok && !b.o.cold && b.o.runtime == "" {
			t.Errorf("commands ran cold: %v", err)
		}
	})
	return b
}
