package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// SetAttachQuiet sets how long an unrefused stream waits before "attached"
// is logged without a relay frame, and returns the restore function.
func SetAttachQuiet(d time.Duration) (restore func()) {
	old := attachQuiet
	attachQuiet = d
	return func() { attachQuiet = old }
}

// RefuseBoxes makes the worker's start-up probe for boxes fail with err,
// as on a machine without user namespaces, and returns the restore
// function.
func RefuseBoxes(err error) (restore func()) {
	old := probeBoxes
	probeBoxes = func(context.Context, *slog.Logger, string) (backend.Backend, string, error) { return nil, "", err }
	return func() { probeBoxes = old }
}
