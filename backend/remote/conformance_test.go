package remote

import (
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
)

// stdinReason is why three cases cannot run: the protocol has no stdin
// action, so stdin is read whole and uploaded before the command starts.
const stdinReason = "pulse-server's protocol carries stdin only whole, before the command starts: " +
	"a stdin that ends only after the command has printed (or never ends) cannot be sent"

func TestConformance(t *testing.T) {
	// Mostly waiting on timeouts and processes: run beside the rest.
	t.Parallel()
	ts := startServer(t)
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newBackend(t, ts.url)
	},
		backendtest.WithTimeScale(2),
		backendtest.Skip("StreamingOutput", stdinReason+" (streaming itself is proven by TestStreamsWhileRunning)"),
		backendtest.Skip("StdinNotRead", stdinReason+" (an endless stdin is refused: TestStdinTooLarge)"),
		backendtest.Skip("ReconcileSparesLive", stdinReason+" (TestReconcileSparesLive proves it without stdin)"),
	)
}
