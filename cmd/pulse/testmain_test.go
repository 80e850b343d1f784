package main

import (
	"os"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
)

func TestMain(m *testing.M) {
	// `pulse exec --backend namespace` re-runs this test binary as the
	// sandbox init.
	namespace.Init()
	os.Exit(m.Run())
}
