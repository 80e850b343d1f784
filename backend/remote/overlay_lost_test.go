package remote

import (
	"errors"
	"testing"

	"github.com/pulse-agent/pulse/protocol"
)

// A server that ran the command but lost its writes must not be read as a
// command that wrote nothing. (The real server's side of this is tested in
// internal/server; here the mapping of its result.)
func TestLostOverlayIsAnError(t *testing.T) {
	x := &run{id: "e1", res: &protocol.Result{ExitCode: 0, TerminationReason: "exited", Error: protocol.ResultOverlayLost}}
	res, err := x.result()
	if !errors.Is(err, ErrOverlay) || res != nil {
		t.Fatalf("result() = %+v, %v; want ErrOverlay and no Result", res, err)
	}
	x.res.Error = ""
	if _, err := x.result(); errors.Is(err, ErrOverlay) {
		t.Fatalf("a plain result was read as a lost overlay: %v", err)
	}
}
