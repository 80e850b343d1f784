package worker

import (
	"context"
	"io"
	"log/slog"

	"github.com/pulse-agent/pulse/internal/worker/runner"
)

// probeBoxes is runner.ProbeBoxes; a test stands in a refusal for a
// machine without namespaces or runsc.
var probeBoxes = runner.ProbeBoxes

// boxing is what the worker says of its boxes at Hello.
type boxing struct {
	isolation string // runner.IsolationNamespace or IsolationGVisor, or "" with note
	note      string
	capacity  int
}

// boxRunner finds out, once at start, whether executions can each get a
// box of their own here, and returns the runner that gives them one. Where
// no box can be made it returns bash alone, says why, and takes one
// execution at a time whatever capacity asked: two executions side by
// side as one user in one pod could read each other's files and
// processes. close ends the boxes' backend.
func boxRunner(ctx context.Context, bash *runner.Bash, capacity int, isolation string, log *slog.Logger) (runner.Runner, boxing, func()) {
	b, kind, err := probeBoxes(ctx, log, isolation)
	if err != nil {
		if capacity > 1 {
			log.Warn("no execution can have a box of its own here: running one at a time", "asked_capacity", capacity, "capacity", 1, "err", err)
		} else {
			log.Warn("no execution can have a box of its own here", "err", err)
		}
		return bash, boxing{note: err.Error(), capacity: 1}, func() {}
	}
	log.Info("each execution runs in a box of its own", "isolation", kind, "egress", true)
	return runner.NewBoxes(bash, b, log), boxing{isolation: kind, capacity: capacity}, func() {
		if c, ok := b.(io.Closer); ok {
			if err := c.Close(); err != nil {
				log.Warn("closing the boxes", "err", err)
			}
		}
	}
}
