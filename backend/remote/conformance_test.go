package remote

import (
	"net"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/server"
)

func TestConformance(t *testing.T) {
	// Mostly waiting on timeouts and processes: run beside the rest.
	t.Parallel()
	ts := startServer(t)
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newBackend(t, ts.url)
	},
		backendtest.WithTimeScale(2),
		backendtest.WithOverlayLoss(lossyServerHow, func(t *testing.T) backend.Backend {
			return newBackend(t, startLossyServer(t).url)
		}),
	)
}

// lossyServerHow says how startLossyServer loses a command's writes.
const lossyServerHow = "the server's local executor runs the host backend (which writes in place) and reads back " +
	"at most half the size of the file the command writes, so the server reports OVERLAY_LOST"

// startLossyServer starts a server whose executor cannot keep what a
// command of the OverlayLost case writes.
func startLossyServer(t *testing.T) *testServer {
	t.Helper()
	hb, err := host.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hb.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{dir: t.TempDir(), exec: server.NewLocal(hb, backendtest.LostFileBytes/2, nil)}
	ts.start(t, ln)
	t.Cleanup(ts.stop)
	return ts
}
