package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// errReviewRequired keeps auto-commit off the writes of a command the
// policy wants a person to look at.
var errReviewRequired = errors.New("sandbox: the policy asks for review of this command's writes")

// Begin starts a copy-on-write transaction for writes made through Stage
// and StageDelete.
func (s *Sandbox) Begin(description string) (*cowfs.Tx, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	return s.cow.Begin(description)
}

// Transaction reopens a pending transaction by id (for example the one in
// Result.Transaction).
func (s *Sandbox) Transaction(id string) (*cowfs.Tx, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	return s.cow.Tx(id)
}

// Transactions lists the transactions of the workspace.
func (s *Sandbox) Transactions() ([]cowfs.TxInfo, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	return s.cow.List()
}

// Stage writes data to path in tx after the policy allows the write and
// the content is checked for configured secrets (ErrSecretInContent).
func (s *Sandbox) Stage(ctx context.Context, tx *cowfs.Tx, path string, data []byte, mode os.FileMode) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.running.Done()
	if _, err := s.decide(ctx, policy.Write, path, ""); err != nil {
		return err
	}
	if s.scrubber.ContainsBytes(data) {
		s.record(ctx, audit.Event{Action: "write", Target: path, Decision: "deny",
			Detail: "staged content contains a configured secret"})
		return fmt.Errorf("%w: %s", ErrSecretInContent, path)
	}
	if err := tx.Write(path, data, mode); err != nil {
		return err
	}
	s.record(ctx, audit.Event{Action: "write-staged", Target: path, Decision: "allow", Detail: "transaction " + tx.ID()})
	return nil
}

// StageDelete stages the deletion of path in tx after the policy allows it.
func (s *Sandbox) StageDelete(ctx context.Context, tx *cowfs.Tx, path string) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.running.Done()
	if _, err := s.decide(ctx, policy.Delete, path, ""); err != nil {
		return err
	}
	if err := tx.Delete(path); err != nil {
		return err
	}
	s.record(ctx, audit.Event{Action: "delete-staged", Target: path, Decision: "allow", Detail: "transaction " + tx.ID()})
	return nil
}

// Preview returns tx's changes as a git-style unified diff.
func (s *Sandbox) Preview(tx *cowfs.Tx) (string, error) { return tx.Diff() }

// Commit applies tx to the workspace through the crash-safe commit
// protocol. A file changed by someone else since it was staged fails the
// commit with an error wrapping ErrConflict; nothing is overwritten and
// the transaction stays pending.
func (s *Sandbox) Commit(ctx context.Context, tx *cowfs.Tx) ([]string, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	return s.commit(ctx, tx, "")
}

func (s *Sandbox) commit(ctx context.Context, tx *cowfs.Tx, execID string) ([]string, error) {
	paths, err := tx.Commit(ctx)
	if err != nil {
		ev := audit.Event{ExecutionID: execID, Action: "commit", Target: tx.ID(), Decision: "deny", Detail: err.Error()}
		var ce *cowfs.ConflictError
		if errors.As(err, &ce) {
			ev.Target, ev.Reason = ce.Path, "conflict: "+ce.Reason
		}
		s.record(ctx, ev)
		return nil, err
	}
	for _, p := range paths {
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "commit", Target: p, Decision: "allow",
			Detail: "committed transaction " + tx.ID()})
	}
	return paths, nil
}

// Discard drops tx and its staged bytes.
func (s *Sandbox) Discard(ctx context.Context, tx *cowfs.Tx) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.running.Done()
	if err := tx.Discard(); err != nil {
		return err
	}
	s.record(ctx, audit.Event{Action: "discard", Target: tx.ID(), Decision: "allow", Detail: "discarded transaction"})
	return nil
}

// stageOverlay turns what a command wrote into a pending transaction.
// Each path is checked like a Stage call: a path the policy denies, under
// .pulse/, or containing a secret is left out and listed in res.Refused.
//
// With WithAutoCommit the transaction is committed at once unless review
// is set (the command itself was an Ask) — auto-commit is the caller's
// standing approval of the Ask the default policy puts on writes, not of
// a command a person was meant to look at.
func (s *Sandbox) stageOverlay(ctx context.Context, execID, cmdStr string, ov *backend.Overlay, review bool, res *Result) error {
	tx, err := s.cow.Begin(fmt.Sprintf("exec %s: %s", execID, cmdStr))
	if err != nil {
		return fmt.Errorf("sandbox: stage overlay: %w", err)
	}
	refuse := func(path, reason string) {
		res.Refused = append(res.Refused, RefusedPath{Path: path, Reason: reason})
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "write", Target: path, Decision: "deny", Detail: reason})
	}
	allowed := func(a policy.Action, path string) bool {
		if pathguard.IsReserved(path) {
			refuse(path, "reserved path")
			return false
		}
		if s.o.policy.Evaluate(a, path) == policy.Deny {
			refuse(path, fmt.Sprintf("policy denies %s", a))
			return false
		}
		return true
	}
	for _, f := range ov.Files {
		if !allowed(policy.Write, f.Path) {
			continue
		}
		var err error
		switch {
		case f.Mode&fs.ModeDir != 0:
			err = tx.Mkdir(f.Path, f.Mode.Perm())
		case f.Mode&fs.ModeSymlink != 0:
			err = tx.Symlink(string(f.Data), f.Path)
		case !f.Mode.IsRegular():
			refuse(f.Path, "not a regular file, directory or symlink: "+f.Mode.Type().String())
			continue
		default:
			if s.scrubber.ContainsBytes(f.Data) {
				refuse(f.Path, "content contains a configured secret")
				continue
			}
			err = tx.Write(f.Path, f.Data, f.Mode.Perm())
		}
		if err != nil {
			refuse(f.Path, err.Error())
			continue
		}
		res.Staged = append(res.Staged, f.Path)
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "write-staged", Target: f.Path, Decision: "allow",
			Detail: "transaction " + tx.ID()})
	}
	for _, p := range ov.Deleted {
		if !allowed(policy.Delete, p) {
			continue
		}
		if err := tx.Delete(p); err != nil {
			refuse(p, err.Error())
			continue
		}
		res.Staged = append(res.Staged, p)
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "delete-staged", Target: p, Decision: "allow",
			Detail: "transaction " + tx.ID()})
	}
	if len(res.Staged) == 0 {
		return tx.Discard()
	}
	res.Transaction = tx.ID()
	if !s.o.autoCommit {
		return nil
	}
	if review {
		res.CommitErr = errReviewRequired
		return nil
	}
	res.Committed, res.CommitErr = s.commit(ctx, tx, execID)
	if res.CommitErr == nil {
		res.Transaction = ""
	}
	return nil
}
