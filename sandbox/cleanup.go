package sandbox

import (
	"context"
	"errors"
	"strings"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/lifecycle"
)

// endCleaning ends an execution's lifecycle once close has released what
// it set up. left holds one error per thing close could not remove (each
// naming it: a directory, a pending transaction). With none, the
// execution goes CLEANING -> FINALIZED. Otherwise, as the seed's
// lifecycle has it, CLEANING -> RECOVERY_REQUIRED, after an audit event
// (action sandbox-cleanup, decision deny, reason cleanup_failed) naming
// what is left: a leftover of a command is never silent, and nothing
// retries it, so a person has to look.
func (x *execution) endCleaning(ctx context.Context, left []error) {
	if st := x.lc.State(); st == lifecycle.Finalized || st == lifecycle.RecoveryRequired {
		return
	}
	x.step(ctx, lifecycle.Cleaning)
	if len(left) == 0 {
		x.step(ctx, lifecycle.Finalized)
		return
	}
	what := make([]string, len(left))
	for i, err := range left {
		what[i] = err.Error()
	}
	err := errors.Join(left...)
	x.s.log.Error("cleanup failed; resources are left behind", "execution", x.id, "err", err)
	x.s.record(context.WithoutCancel(ctx), audit.Event{ExecutionID: x.id, Action: "sandbox-cleanup",
		Target: strings.Join(what, "; "), Decision: "deny", Backend: x.s.backend.Name(), Reason: "cleanup_failed",
		Detail: "cleanup failed, left behind (remove by hand): " + strings.Join(what, "; ")})
	x.step(ctx, lifecycle.RecoveryRequired)
}

// auditBackendLeftovers records, before the audit log closes, what the
// backend's Close could not remove (a run directory holding a command's
// writes, a container, a keeper): a sandbox-cleanup event (deny, reason
// cleanup_failed) naming it, as an execution's own leftovers get. The
// executions have ended by then; this is the sandbox's.
func (s *Sandbox) auditBackendLeftovers(err error) {
	if err == nil || s.audit == nil {
		return
	}
	s.log.Error("backend cleanup failed; resources are left behind", "backend", s.backend.Name(), "err", err)
	s.record(context.Background(), audit.Event{Action: "sandbox-cleanup", Target: err.Error(), Decision: "deny",
		Backend: s.backend.Name(), Reason: "cleanup_failed",
		Detail: "closing the backend failed, left behind (remove by hand): " + err.Error()})
}
