package protocol

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pulse-agent/pulse/backend"
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
	if CodeOf(backend.ErrClosed) != CodeUnavailable || ErrorOf("") != backend.ErrUnavailable || ErrorOf(CodeWorkerLost) != backend.ErrUnavailable {
		t.Errorf("closed, missing code or lost worker not unavailable")
	}
}
