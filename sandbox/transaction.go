package sandbox

import (
	"context"
	"fmt"
	"os"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/policy"
)

// Tx is a transaction of the sandbox: every path staged through it is
// checked like a command's write (workspace containment, the write and
// delete policy, the Approver, secrets in names and content, paths the
// policy protects that a change would remove), and every change is
// checked against the policy again at Commit, so a path the policy
// denies never lands, however it got into the transaction. It sits on
// the pending stack (of the sandbox's lane) like a command's
// transaction. Methods take ctx first and are safe for concurrent use.
type Tx struct {
	s  *Sandbox
	tx *cowfs.Tx
}

// BeginTx starts a transaction on top of the pending stack.
func (s *Sandbox) BeginTx(ctx context.Context, description string) (*Tx, error) {
	tx, err := s.beginTx(ctx, description)
	if err != nil {
		return nil, err
	}
	return &Tx{s: s, tx: tx}, nil
}

// OpenTx reopens a pending transaction by id (for example
// Result.Transaction).
func (s *Sandbox) OpenTx(ctx context.Context, id string) (*Tx, error) {
	tx, err := s.openTx(ctx, id)
	if err != nil {
		return nil, err
	}
	return &Tx{s: s, tx: tx}, nil
}

// ID is the transaction id.
func (t *Tx) ID() string { return t.tx.ID() }

// Description is the transaction's description, scrubbed of the
// configured secrets.
func (t *Tx) Description() string { return t.s.scrubber.Redact(t.tx.Description()) }

// Changes lists the staged changes.
func (t *Tx) Changes() []cowfs.Change { return t.tx.Changes() }

// Write stages path to hold data with mode's permission bits, after the
// policy allows the write and the content is checked for configured
// secrets (ErrPolicyDenied, ErrSecretInContent).
func (t *Tx) Write(ctx context.Context, path string, data []byte, mode os.FileMode) error {
	return t.s.scrubErr(t.s.stageOp(ctx, t.tx, policy.Write, path, data, mode))
}

// Delete stages the removal of path after the policy allows it
// (ErrPolicyDenied).
func (t *Tx) Delete(ctx context.Context, path string) error {
	return t.s.scrubErr(t.s.stageOp(ctx, t.tx, policy.Delete, path, nil, 0))
}

// Diff shows the transaction as a git-style unified diff against the
// pending stack below it, scrubbed of the configured secrets.
func (t *Tx) Diff(ctx context.Context) (string, error) {
	return t.s.PreviewStack(ctx, t.tx.ID())
}

// Commit applies the transaction to the workspace through the crash-safe
// commit protocol, after checking every change against the write and
// delete policy again (ErrPolicyDenied, nothing written) and that no
// other pending transaction depends on it (ErrStackDependency). A file
// changed by someone else since it was staged fails the commit with an
// error wrapping ErrConflict; nothing is overwritten and the transaction
// stays pending.
//
// A transaction that changes what git runs on the host (hooks, config;
// see policy.RunsOnHost) is committed only when the Approver (a person's
// hook) approves each such path; without one Commit refuses it with
// ErrRunsOnHost. Code — an agent's harness, an MCP tool call — is not a
// person: such a transaction is for `pulse cow commit` or `pulse review`
// (Review), after someone has read it.
func (t *Tx) Commit(ctx context.Context) ([]string, error) {
	return t.s.commitSDK(ctx, t.tx)
}

// Discard drops the transaction and its staged bytes
// (ErrStackDependency when a transaction above it was made on top of it).
func (t *Tx) Discard(ctx context.Context) error {
	return t.s.discardSDK(ctx, t.tx)
}

// recheck refuses, audited, a commit of tx when the policy denies one of
// its changes: staging checks each path, but a transaction may have been
// staged by another process or through cowfs directly.
func (s *Sandbox) recheck(ctx context.Context, tx *cowfs.Tx, execID string) error {
	if err := tx.Refresh(ctx); err != nil {
		return err
	}
	hit := s.changesDenied(tx)
	if hit == "" {
		return nil
	}
	s.record(ctx, audit.Event{ExecutionID: execID, Action: "commit", Target: hit, Decision: "deny", TxID: tx.ID(),
		Detail: "the policy denies a change of this transaction; nothing was committed"})
	return fmt.Errorf("%w: transaction %s changes %s", ErrPolicyDenied, tx.ID(), s.scrubber.Redact(hit))
}
