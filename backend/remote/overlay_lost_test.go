package remote

import (
	"errors"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

// A server that ran the command but lost its writes must not be read as a
// command that wrote nothing: the Result comes with backend.ErrOverlayLost.
// (The real server's side of this is tested in internal/server and in the
// conformance run's OverlayLost case; here the mapping of its result.)
func TestLostOverlayIsAnError(t *testing.T) {
	x := &run{id: "e1", res: &protocol.Result{ExitCode: 3, TerminationReason: "exited", Error: protocol.ResultOverlayLost,
		ErrorCode: protocol.CodeOverlayLost}}
	res, err := x.result()
	if !errors.Is(err, ErrOverlay) || !errors.Is(err, backend.ErrOverlayLost) || res == nil || res.ExitCode != 3 || res.Overlay != nil {
		t.Fatalf("result() = %+v, %v; want the Result, ErrOverlay and backend.ErrOverlayLost", res, err)
	}
	x.res.Error, x.res.ErrorCode = "", ""
	if _, err := x.result(); err != nil {
		t.Fatalf("a plain result was read as a lost overlay: %v", err)
	}
}
