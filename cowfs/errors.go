package cowfs

import (
	"errors"
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"
)

// Error classes. Every error cowfs returns for one of these conditions
// wraps the matching sentinel; test with errors.Is and, for details,
// errors.As with *ConflictError or *LimitError.
var (
	// ErrConflict: a staged path changed in the workspace since it was
	// first staged (or, for Undo, since it was committed). Nothing was
	// written and the transaction is kept for inspection.
	ErrConflict = errdefs.New("cowfs: conflict", errdefs.ErrConflict)
	// ErrLimit: a size or count limit would be exceeded. Nothing was staged.
	ErrLimit = errdefs.New("cowfs: limit exceeded", errdefs.ErrLimit)
	// ErrRecovery: an interrupted commit cannot be rolled forward (its WAL
	// is corrupt, names a path outside the workspace, or its targets were
	// changed by someone else). The transaction is quarantined: kept on
	// disk, listed, never applied and never deleted by cowfs.
	ErrRecovery = errors.New("cowfs: recovery refused")
	// ErrClosed: the transaction was committed or discarded (here or in
	// another process), or the FS was closed.
	ErrClosed = errdefs.New("cowfs: closed", errdefs.ErrClosed)
	// ErrNotFound: no transaction has that id, or nothing is left to undo,
	// or Delete names a path that does not exist.
	ErrNotFound = errdefs.New("cowfs: not found", errdefs.ErrNotFound)
	// ErrInvalidPath: the path is malformed, escapes the workspace, lies
	// under the reserved .pulse directory, or needs a directory where the
	// workspace (or the transaction) has a file.
	ErrInvalidPath = errdefs.New("cowfs: invalid path", errdefs.ErrInvalidArgument)
	// ErrDamaged: a state file does not hold what its records say: staged
	// bytes or a saved previous version whose size or SHA-256 is wrong or
	// that is missing, or a stage log that lost records. The error names
	// the workspace path concerned; nothing of the damaged file reached
	// the workspace.
	ErrDamaged = errdefs.New("cowfs: damaged state", errdefs.ErrDataLoss)
	// ErrStackChanged: CommitStack found other pending transactions than
	// the ones the caller checked; nothing was squashed or written.
	ErrStackChanged = errors.New("cowfs: the pending stack changed since it was checked")
)

// Conflict reasons, as ConflictError.Reason spells them.
const (
	ReasonCreated  = "created"  // the path did not exist when staged and exists now
	ReasonDeleted  = "deleted"  // the path existed when staged and is gone now
	ReasonReplaced = "replaced" // another file, directory or symlink is at the path now
	ReasonModified = "modified" // same file, other content, size, mtime or mode
)

// ConflictError says which path diverged and how. It wraps ErrConflict.
type ConflictError struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("cowfs: conflict: %q was %s in the workspace since it was staged", e.Path, e.Reason)
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }

func conflict(path, reason string) error { return &ConflictError{Path: path, Reason: reason} }

// LimitError names the limit that would be exceeded. It wraps ErrLimit.
type LimitError struct {
	Name  string `json:"name"`
	Value int64  `json:"value"`
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("cowfs: limit exceeded: %s is %d", e.Name, e.Value)
}

// Unwrap makes errors.Is(err, ErrLimit) true.
func (e *LimitError) Unwrap() error { return ErrLimit }

// Limit names, as LimitError.Name spells them.
const (
	LimitFileBytes   = "max_file_bytes"
	LimitStagedBytes = "max_staged_bytes"
	LimitOpenTx      = "max_open_transactions"
	LimitChanges     = "max_changes"
)
