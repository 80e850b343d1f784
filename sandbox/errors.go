package sandbox

import (
	"errors"
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"

	"github.com/pulse-agent/pulse/policy"
)

// Error classes of the facade, tested with errors.Is. Where the class is
// shared (package errdefs), the facade's name is the class itself, so
// that errors.Is works whichever layer returned the error: ErrClosed
// matches a closed sandbox, backend, transaction or audit log alike.
var (
	// ErrUnavailable: no backend can run commands here (or the one asked
	// for cannot). The message names what was tried and why each failed.
	ErrUnavailable = errdefs.ErrUnavailable
	// ErrUnsupportedPolicy: the backend cannot strongly enforce the
	// effective network or secret policy, so the command was refused
	// before anything started.
	ErrUnsupportedPolicy = errors.New("sandbox: policy cannot be enforced by backend")
	// ErrPolicyDenied: the policy denies the action (shell, read, write,
	// delete, git). Nothing was done.
	ErrPolicyDenied = errors.New("sandbox: denied by policy")
	// ErrSecretInContent: staged content embeds a configured secret.
	ErrSecretInContent = errors.New("sandbox: content contains a secret")
	// ErrClosed: the Sandbox was used after Close.
	ErrClosed = errdefs.ErrClosed
	// ErrLimitExceeded is policy.ErrLimitExceeded: a command's limits (or
	// WithLimits) ask for more than the policy allows. The error is a
	// *policy.LimitError per field, found with errors.As.
	ErrLimitExceeded = policy.ErrLimitExceeded
	// ErrRunsOnHost: auto-commit held a transaction because it changes
	// what git on the host runs (hooks, config; see policy.RunsOnHost).
	// It stays pending until a person commits it. It is the class of
	// Result.CommitErr, never a failure of Execute.
	ErrRunsOnHost = errors.New("sandbox: the writes change what git runs on the host (hooks, config); a person must review and commit them")
	// ErrConcurrentChange: auto-commit held a transaction because a path
	// it stages changed while the command ran (Result.ConcurrentChanges),
	// so the command's version was made without that change. It stays
	// pending until a person commits or discards it. It is the class of
	// Result.CommitErr, never a failure of Execute.
	ErrConcurrentChange = errors.New("sandbox: a path the command wrote changed while it ran")
	// ErrPendingInTheWay: the command was refused before it started
	// because of the pending transactions: a backend that cannot stack
	// them runs nothing while any are pending, and a store bounding open
	// transactions has no room for the command's own. Committing or
	// discarding pending transactions lets it run. Each front end names
	// its own way to do that (a CLI command, an MCP tool), so the
	// sandbox's message names none.
	ErrPendingInTheWay = errors.New("sandbox: pending transactions stand in the way; commit or discard them first")
	// ErrUnsupported is backend.ErrUnsupported: the backend cannot do
	// what was asked (a background process, a signal, reaching a port
	// inside the sandbox). Nothing was started.
	ErrUnsupported = errdefs.ErrUnsupported
	// ErrInvalidCommand: the Command is malformed (no program, both Args
	// and Shell, a working directory outside the workspace).
	ErrInvalidCommand = errdefs.New("sandbox: invalid command", errdefs.ErrInvalidArgument)
	// ErrIsolationDowngrade: the policy asks for isolation: strong and
	// the backend (named, passed in, or the only one available) shares
	// the host kernel. The sandbox refuses it rather than run commands
	// under less isolation than the policy asked for. It is of class
	// ErrUnsupportedPolicy.
	ErrIsolationDowngrade = fmt.Errorf("%w: isolation: strong needs a backend whose commands' system calls do not reach the host kernel (gvisor)", ErrUnsupportedPolicy)
)

// errClosed is what a closed Sandbox returns: of class ErrClosed, saying
// which layer was closed.
var errClosed = errdefs.New("sandbox: closed", ErrClosed)
