package protocol

import (
	"errors"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/errdefs"
)

// Codes of a result's error_code (additive) that name an error class of
// package backend. CodeInvalid and CodeUnsupported, shared with error
// frames, name backend.ErrInvalidRequest and backend.ErrUnsupported.
const (
	// CodeUnavailable: backend.ErrUnavailable (or ErrClosed): the
	// executor could not run the command now.
	CodeUnavailable = "UNAVAILABLE"
	// CodeWorkerLost: the pulse-worker running the command went away; a
	// client reads it as backend.ErrUnavailable.
	CodeWorkerLost = "WORKER_LOST"
	// CodeOverlayLost: backend.ErrOverlayLost. It comes with the result
	// of a command that ran, whose error is ResultOverlayLost.
	CodeOverlayLost = "OVERLAY_LOST"
)

// CodeOf returns the error code of err's class, as the server sends it:
// the first of the backend error classes err wraps, else CodeInternal.
// It is one of the two edges where error classes become codes; ErrorOf
// is the other. The classes are errdefs' (backend's names for them are
// the same values), so an error of any layer — a closed transaction, an
// invalid path — crosses as its class.
func CodeOf(err error) string {
	switch {
	case errors.Is(err, backend.ErrOverlayLost):
		return CodeOverlayLost
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return CodeInvalid
	case errors.Is(err, errdefs.ErrUnsupported):
		return CodeUnsupported
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, errdefs.ErrClosed):
		return CodeUnavailable
	}
	return CodeInternal
}

// ErrorOf returns the backend error class a client reports for a result's
// error code. A code it does not know, or none (an older server), is
// backend.ErrUnavailable: the server could not run the command, and it
// did not say why in a form this client knows.
func ErrorOf(code string) error {
	switch code {
	case CodeOverlayLost:
		return backend.ErrOverlayLost
	case CodeInvalid:
		return errdefs.ErrInvalidArgument
	case CodeUnsupported:
		return errdefs.ErrUnsupported
	}
	return errdefs.ErrUnavailable
}
