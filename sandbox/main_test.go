package sandbox

import (
	"os"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
)

func TestMain(m *testing.M) {
	// The namespace backend re-runs this test binary as the sandbox init.
	namespace.Init()
	os.Exit(m.Run())
}
