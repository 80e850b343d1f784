package policy

import (
	"errors"
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"
	"strconv"
	"time"
)

// ErrLimitExceeded is wrapped by a LimitError: a command (or a caller's
// option) asked for more of a resource than the policy allows.
var ErrLimitExceeded = errdefs.New("limit exceeds the policy's", errdefs.ErrLimit)

// LimitError says which limit was asked above the policy's, by how much.
// It wraps ErrLimitExceeded.
type LimitError struct {
	// Field is the limit asked above the policy's.
	Field LimitKey
	// Asked and Allowed are the two values as a person would write them
	// in a policy file.
	Asked, Allowed string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: %s %s asked, but the policy allows at most %s (limits may only be tightened; raise limits.%s in the policy)",
		ErrLimitExceeded, e.Field, e.Asked, e.Allowed, e.Field)
}

// Unwrap makes errors.Is(err, ErrLimitExceeded) hold.
func (e *LimitError) Unwrap() error { return ErrLimitExceeded }

// Tighten returns the limits of one command: the ceiling l with each
// field of req that is set taking its place when it is no larger. A zero
// field of req keeps l's; a zero field of l (no limit) takes req's. Asking
// for more than l allows is not quietly capped: it is an error, a
// *LimitError for each such field (joined), so that the caller learns its
// request was not what ran.
//
// l is the policy's limits as they are enforced, so callers pass it with
// defaults filled in (WithDefaults): a policy that leaves the timeout
// unset allows DefaultTimeout, not more.
func (l ResourceLimits) Tighten(req ResourceLimits) (ResourceLimits, error) {
	if err := req.Validate(); err != nil {
		return l, err
	}
	var errs []error
	minInt := func(field LimitKey, ceil, asked int64, show func(int64) string) int64 {
		switch {
		case asked == 0:
			return ceil
		case ceil == 0 || asked <= ceil:
			return asked
		}
		errs = append(errs, &LimitError{Field: field, Asked: show(asked), Allowed: show(ceil)})
		return ceil
	}
	num := func(v int64) string { return strconv.FormatInt(v, 10) }
	dur := func(v int64) string { return time.Duration(v).String() }

	out := l
	out.Timeout = time.Duration(minInt(LimitTimeout, int64(l.Timeout), int64(req.Timeout), dur))
	out.MemoryBytes = minInt(LimitMemoryBytes, l.MemoryBytes, req.MemoryBytes, num)
	out.Pids = minInt(LimitPids, l.Pids, req.Pids, num)
	out.OutputBytes = minInt(LimitOutputBytes, l.OutputBytes, req.OutputBytes, num)
	out.FileSizeBytes = minInt(LimitFileSizeBytes, l.FileSizeBytes, req.FileSizeBytes, num)
	out.DiskBytes = minInt(LimitDiskBytes, l.DiskBytes, req.DiskBytes, num)
	switch {
	case req.CPUs == 0:
	case l.CPUs == 0 || req.CPUs <= l.CPUs:
		out.CPUs = req.CPUs
	default:
		errs = append(errs, &LimitError{Field: LimitCPUs,
			Asked:   strconv.FormatFloat(req.CPUs, 'g', -1, 64),
			Allowed: strconv.FormatFloat(l.CPUs, 'g', -1, 64)})
	}
	if len(errs) > 0 {
		return l, errors.Join(errs...)
	}
	return out, nil
}
