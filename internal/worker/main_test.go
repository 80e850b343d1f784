package worker_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// goleak fails the run when a goroutine outlives the tests: a leak
	// the race detector does not see, since nothing races.
	goleak.VerifyTestMain(m)
}
