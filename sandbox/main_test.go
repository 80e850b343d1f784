package sandbox

import (
	"testing"

	"go.uber.org/goleak"

	// Selection picks among the backends a program links: the tests
	// link them all, as the pulse binary does.
	_ "github.com/pulse-agent/pulse/backend/all"
	"github.com/pulse-agent/pulse/backend/namespace"
)

func TestMain(m *testing.M) {
	// The namespace backend re-runs this test binary as the sandbox init.
	namespace.Init()
	// goleak fails the run when a goroutine outlives the tests: a leak
	// the race detector does not see, since nothing races.
	goleak.VerifyTestMain(m)
}
