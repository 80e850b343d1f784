package worker_test

import (
	"github.com/pulse-agent/pulse/backend/namespace"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A box's init is this binary re-run: it must not run the tests.
	namespace.Init()
	// goleak fails the run when a goroutine outlives the tests: a leak
	// the race detector does not see, since nothing races.
	goleak.VerifyTestMain(m)
}
