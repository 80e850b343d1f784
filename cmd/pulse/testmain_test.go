package main

import (
	"context"
	"os"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
)

// asPulseEnv makes the test binary behave as the pulse command, so tests
// can spawn it as a child (an MCP client starts `pulse mcp` that way)
// without building another binary.
const asPulseEnv = "PULSE_TEST_AS_PULSE"

func TestMain(m *testing.M) {
	// `pulse exec --backend namespace` re-runs this test binary as the
	// sandbox init.
	namespace.Init()
	if os.Getenv(asPulseEnv) == "1" {
		os.Unsetenv(asPulseEnv)
		ctx, sig := notifySignals(context.Background())
		code := run(ctx, &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, prog: "pulse"}, os.Args[1:])
		if n := sig.Load(); n != 0 {
			code = 128 + int(n)
		}
		os.Exit(code)
	}
	code := m.Run()
	removeToolchainImage()
	os.Exit(code)
}
