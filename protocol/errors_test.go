package protocol

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/errdefs"
)

// TestErrorCodesRoundTrip: every backend class a server can report maps
// to a code and back to the same class; anything else is unavailable.
func TestErrorCodesRoundTrip(t *testing.T) {
	for _, class := range []error{backend.ErrInvalidRequest, backend.ErrUnsupported, backend.ErrUnavailable, backend.ErrOverlayLost} {
		err := fmt.Errorf("executor: something: %w", class)
		if got := ErrorOf(CodeOf(err)); got != class {
			t.Errorf("%v: code %q comes back as %v", class, CodeOf(err), got)
		}
	}
	if c := CodeOf(errors.New("disk on fire")); c != CodeInternal || ErrorOf(c) != backend.ErrUnavailable {
		t.Errorf("unclassed error: code %q, back %v", c, ErrorOf(c))
	}
	// An error of another layer crosses as its class (errdefs).
	for _, tc := range []struct {
		err  error
		code string
	}{
		{errdefs.New("cowfs: invalid path", errdefs.ErrInvalidArgument), CodeInvalid},
		{fmt.Errorf("x: %w", errdefs.New("audit logger closed", errdefs.ErrClosed)), CodeUnavailable},
	} {
		if got := CodeOf(tc.err); got != tc.code {
			t.Errorf("%v crosses as %q, want %q", tc.err, got, tc.code)
		}
	}
	if CodeOf(backend.ErrClosed) != CodeUnavailable || ErrorOf("") != backend.ErrUnavailable || ErrorOf(CodeWorkerLost) != backend.ErrUnavailable {
		t.Errorf("closed, missing code or lost worker not unavailable")
	}
}
