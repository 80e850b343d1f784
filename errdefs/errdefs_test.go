package errdefs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pulse-agent/pulse/errdefs"
)

func TestNewIsOfItsClassOnly(t *testing.T) {
	mine := errdefs.New("pkg: closed", errdefs.ErrClosed)
	err := fmt.Errorf("doing x: %w", mine)
	if err.Error() != "doing x: pkg: closed" {
		t.Errorf("message %q", err)
	}
	if !errors.Is(err, mine) || !errors.Is(err, errdefs.ErrClosed) {
		t.Errorf("%v is not of its sentinel and class", err)
	}
	// A class is not of a package's sentinel, nor of another class.
	for _, e := range []error{errdefs.ErrClosed, err} {
		if errors.Is(e, errdefs.ErrNotFound) || e == errdefs.ErrClosed && errors.Is(e, mine) {
			t.Errorf("%v matched what it is not", e)
		}
	}
}
