package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// errReviewRequired keeps auto-commit off the writes of a command the
// policy wants a person to look at.
var errReviewRequired = errors.New("sandbox: the policy asks for review of this command's writes")

// beginTx starts a copy-on-write transaction of the sandbox's lane. The
// facade hands it out only wrapped in a Tx (transaction.go), whose every
// staging call and commit goes through the policy.
func (s *Sandbox) beginTx(ctx context.Context, description string) (*cowfs.Tx, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	tx, err := s.cow.Begin(ctx, s.scrubber.Redact(description))
	return tx, s.scrubErr(err)
}

// openTx reopens a pending transaction by id.
func (s *Sandbox) openTx(ctx context.Context, id string) (*cowfs.Tx, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	tx, err := s.cow.Tx(ctx, id)
	return tx, s.scrubErr(err)
}

// Transactions lists the transactions of the workspace.
func (s *Sandbox) Transactions(ctx context.Context) ([]cowfs.TxInfo, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	infos, err := s.cow.List(ctx)
	for i := range infos {
		infos[i].Description = s.scrubber.Redact(infos[i].Description)
		infos[i].Reason = s.scrubber.Redact(infos[i].Reason)
	}
	return infos, s.scrubErr(err)
}

// stageOp stages one write (a is policy.Write: data with mode) or
// deletion (policy.Delete) of path in tx, after the checks every staged
// change of the files API passes (fileOp); each outcome is audited.
func (s *Sandbox) stageOp(ctx context.Context, tx *cowfs.Tx, a policy.Action, path string, data []byte, mode os.FileMode) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.running.Done()
	op := cowfs.DeleteOp(path)
	if a == policy.Write {
		op = cowfs.WriteOp(path, data, mode)
	}
	if err := s.fileOp(ctx, &op); err != nil {
		return err
	}
	var err error
	if a == policy.Write {
		err = tx.Write(ctx, op.Path, data, mode)
	} else {
		err = tx.Delete(ctx, op.Path)
	}
	if err != nil {
		return err
	}
	s.record(ctx, audit.Event{Action: string(a) + "-staged", Target: op.Path, Decision: "allow", Detail: "transaction " + tx.ID()})
	return nil
}

// checkSideEffects refuses (audited) an operation that would remove or
// replace a path the policy protects.
func (s *Sandbox) checkSideEffects(ctx context.Context, op cowfs.Op) error {
	hit := s.sideEffectDenied(op)
	if hit == "" {
		return nil
	}
	detail := fmt.Sprintf("would also remove or replace %s, which the policy protects", hit)
	s.record(ctx, audit.Event{Action: string(op.Kind), Target: op.Path, Decision: "deny", Detail: detail})
	return fmt.Errorf("%w: %s %q %s", ErrPolicyDenied, op.Kind, op.Path, detail)
}

// commitSDK is Tx.Commit: the host-run approval, then commit.
func (s *Sandbox) commitSDK(ctx context.Context, tx *cowfs.Tx) ([]string, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	if err := s.approveHostRun(ctx, tx); err != nil {
		return nil, s.scrubErr(err)
	}
	paths, err := s.commit(ctx, tx, "")
	return s.scrubAll(paths), s.scrubErr(err)
}

func (s *Sandbox) commit(ctx context.Context, tx *cowfs.Tx, execID string) ([]string, error) {
	// Again at commit: the policy and the pending stack (transaction.go).
	if err := s.recheck(ctx, tx, execID); err != nil {
		return nil, err
	}
	r := s.review()
	if execID != "" {
		r.via = ViaAutoCommit // WithAutoCommit, not a person's decision
	}
	if err := r.checkStack(ctx, "commit", tx.ID()); err != nil {
		return nil, err
	}
	return r.commitTx(ctx, tx, execID)
}

// discardSDK is Tx.Discard.
func (s *Sandbox) discardSDK(ctx context.Context, tx *cowfs.Tx) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.running.Done()
	if err := s.review().checkStack(ctx, "discard", tx.ID()); err != nil {
		return s.scrubErr(err)
	}
	return s.scrubErr(s.review().discardTx(ctx, tx))
}

// sourceContainsSecret scans a file the backend hands by path.
func (s *Sandbox) sourceContainsSecret(f *backend.File) (bool, error) {
	r, err := f.Open()
	if err != nil {
		return false, err
	}
	defer r.Close()
	return s.scrubber.ContainsReader(r)
}

// stageOverlay turns what a command wrote into a pending transaction.
// Each path is checked like a Stage call — reserved (.pulse/), denied by
// the policy, refused by the Approver, carrying a secret in its content,
// its name or its link target, or removing or replacing a path the policy
// protects — and a refused path is left out and listed in res.Refused.
// Deletions are staged before files, so that a path the command removed
// and made again (a file turned into a directory) ends as it made it.
//
// With WithAutoCommit the transaction is committed at once unless review
// is set: the command itself, or one of its paths, was an Ask of a rule
// and no Approver answered it. Auto-commit is the caller's standing
// approval of the Ask the default policy puts on every write, not of
// something a rule singled out for a person.
//
// The transaction is x's: begun here when there is something to stage,
// unless prepare took it before the command ran (a bounded store);
// whatever stageOverlay leaves unstaged in it is discarded by Execute.
func (s *Sandbox) stageOverlay(ctx context.Context, x *execution, ov *backend.Overlay, res *Result) error {
	// Every path is checked first and the allowed ones are staged in one
	// batch (a fixed number of fsyncs, not three per path); the outcome
	// of each path is then reported in order, as if staged alone.
	plan := s.planOverlay(ctx, ov)
	var (
		errs       []error
		concurrent map[string]string
	)
	if len(plan.ops) > 0 {
		errs, concurrent = s.stageOps(ctx, x, plan.ops)
	}
	tx := x.tx
	s.reportStaged(ctx, x.id, tx, plan.outs, errs, concurrent, res)
	if tx == nil {
		return nil
	}
	if len(res.Staged) == 0 {
		return tx.Discard(context.WithoutCancel(ctx)) // an empty transaction goes even when ctx was cancelled
	}
	res.Transaction = tx.ID()
	// What git on the host will run is judged on what the commit would
	// really do, implicit directories aside: a directory made only to
	// hold a path runs nothing itself, and its contents are checked.
	for _, c := range tx.Changes() {
		if !c.Implicit && s.runsOnHost(c.Path) {
			res.RunsOnHost = append(res.RunsOnHost, s.scrubber.Redact(c.Path))
		}
	}
	if s.o.autoCommit {
		s.autoCommit(ctx, x.id, tx, x.review || plan.review, res)
	}
	return nil
}

// stageOutcome is what became of one path of an overlay.
type stageOutcome struct {
	path   string
	action string // audit action when staged
	reason string // refusal before staging
	op     int    // index in the plan's ops, or -1
}

// overlayPlan is an overlay checked path by path: the outcome of each, in
// order, and the ops of those allowed, to be staged as one batch. review
// says a rule asked for a person about one of them and no Approver
// answered.
type overlayPlan struct {
	outs   []stageOutcome
	ops    []cowfs.Op
	review bool
}

// planOverlay checks every path of ov as a Stage call would (see
// stageOverlay). Deletions come first, so that a path the command removed
// and made again ends as it made it.
func (s *Sandbox) planOverlay(ctx context.Context, ov *backend.Overlay) *overlayPlan {
	pl := &overlayPlan{}
	check := func(a policy.Action, op cowfs.Op) string {
		if pathguard.IsReserved(op.Path) {
			return "reserved path"
		}
		if s.scrubber.Contains(op.Path) {
			return "path contains a configured secret"
		}
		switch s.o.policy.Evaluate(a, op.Path) {
		case policy.Allow:
		case policy.Ask:
			if s.o.approver != nil {
				ok, err := s.o.approver(ctx, a, op.Path)
				if err != nil {
					return "approval failed: " + err.Error()
				}
				if !ok {
					return "policy asks and the approver refused"
				}
			} else if s.askedByRule(a, op.Path) {
				pl.review = true
			}
		default:
			return fmt.Sprintf("policy denies %s", a)
		}
		if hit := s.sideEffectDenied(op); hit != "" {
			return fmt.Sprintf("would also remove or replace %s, which the policy protects", hit)
		}
		return ""
	}
	add := func(path, action, reason string, op cowfs.Op) {
		o := stageOutcome{path: path, action: action, reason: reason, op: -1}
		if reason == "" {
			o.op = len(pl.ops)
			pl.ops = append(pl.ops, op)
		}
		pl.outs = append(pl.outs, o)
	}
	for _, p := range ov.Deleted {
		// A path only a lower pending transaction held becomes a
		// whiteout; one the workspace holds, a deletion.
		op := cowfs.WhiteoutOp(p)
		add(p, "delete-staged", check(policy.Delete, op), op)
	}
	for _, f := range ov.Files {
		var op cowfs.Op
		switch {
		case f.Mode&fs.ModeDir != 0:
			op = cowfs.MkdirOp(f.Path, f.Mode&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky))
		case f.Mode&fs.ModeSymlink != 0:
			if s.scrubber.ContainsBytes(f.Data) {
				add(f.Path, "", "link target contains a configured secret", cowfs.Op{})
				continue
			}
			op = cowfs.SymlinkOp(string(f.Data), f.Path)
		case f.Special():
			add(f.Path, "", specialReason(f.Mode), cowfs.Op{})
			continue
		case f.Source != "":
			// Held on disk by the backend: scanned and staged from
			// there, never whole in memory.
			hit, err := s.sourceContainsSecret(&f)
			if err != nil {
				add(f.Path, "", "reading the written file: "+err.Error(), cowfs.Op{})
				continue
			}
			if hit {
				add(f.Path, "", "content contains a configured secret", cowfs.Op{})
				continue
			}
			op = cowfs.StreamOp(f.Path, f.Open, f.Mode.Perm())
		default:
			if s.scrubber.ContainsBytes(f.Data) {
				add(f.Path, "", "content contains a configured secret", cowfs.Op{})
				continue
			}
			op = cowfs.WriteOp(f.Path, f.Data, f.Mode.Perm())
		}
		add(f.Path, "write-staged", check(policy.Write, op), op)
	}
	return pl
}

// stageOps stages ops as one batch into x's transaction, begun here
// unless prepare took it already, and returns each op's error (all of
// them the batch's when nothing was staged) and the paths changed
// meanwhile (see concurrentChanges). They are staged even when ctx has
// ended: a cancelled command's writes are kept for review. When the
// transaction would change a path the policy protects, it is discarded
// and x.tx is nil.
func (s *Sandbox) stageOps(ctx context.Context, x *execution, ops []cowfs.Op) ([]error, map[string]string) {
	ctx = context.WithoutCancel(ctx)
	concurrent := s.concurrentChanges(ctx, x.view, x.start, ops)
	var errs []error
	batchErr := x.beginTx(ctx)
	if batchErr == nil {
		errs, batchErr = x.tx.Stage(ctx, ops)
	}
	if batchErr != nil {
		// Nothing of the batch was staged: each path fails with it.
		errs = make([]error, len(ops))
		for i := range errs {
			errs[i] = batchErr
		}
	}
	if x.tx == nil {
		return errs, concurrent
	}
	// What the transaction would really do is checked once more: a
	// path the checks above missed is not a reason to trust the rest.
	if hit := s.changesDenied(x.tx); hit != "" {
		if err := x.tx.Discard(ctx); err != nil {
			s.log.Error("discarding a refused transaction", "tx", x.tx.ID(), "err", err)
		}
		x.tx = nil
		for i := range errs {
			errs[i] = fmt.Errorf("the command's writes would change %s, which the policy protects; none were staged", hit)
		}
	}
	return errs, concurrent
}

// reportStaged fills res.Staged, res.Refused and res.ConcurrentChanges
// from the outcomes, in order, and audits one event per path (and one per
// concurrent change) as one batch: one lock and one write for the lot,
// and no other writer's line between them. Paths reported to the caller
// are scrubbed like everything else.
func (s *Sandbox) reportStaged(ctx context.Context, execID string, tx *cowfs.Tx, outs []stageOutcome, errs []error, concurrent map[string]string, res *Result) {
	events := make([]audit.Event, 0, len(outs))
	for _, o := range outs {
		reason := o.reason
		if o.op >= 0 && errs[o.op] != nil {
			reason = errs[o.op].Error()
		}
		shown := s.scrubber.Redact(o.path)
		if reason != "" {
			res.Refused = append(res.Refused, RefusedPath{Path: shown, Reason: reason})
			events = append(events, audit.Event{ExecutionID: execID, Action: "write", Target: o.path, Decision: "deny", Detail: reason})
			continue
		}
		res.Staged = append(res.Staged, shown)
		ev := audit.Event{ExecutionID: execID, Action: o.action, Target: o.path, Decision: "allow",
			Detail: "transaction " + tx.ID()}
		if s.runsOnHost(o.path) {
			ev.Reason = "runs_on_host"
		}
		events = append(events, ev)
		if by, ok := concurrent[o.path]; ok {
			res.ConcurrentChanges = append(res.ConcurrentChanges, shown)
			what := "changed in the workspace while the command ran (a commit or an edit it may not have seen)"
			if by != "" {
				what = "changed by transaction " + by + " while the command ran, in a stack it did not see"
			}
			events = append(events, audit.Event{ExecutionID: execID, Action: "stack", Target: o.path, Decision: "allow",
				Reason: "concurrent_change", Detail: what + "; transaction " + tx.ID() + " holds this command's version"})
		}
	}
	s.recordBatch(ctx, "stage-overlay", events)
}

// autoCommit commits tx for WithAutoCommit, unless it must wait for a
// person: it changes what git on the host runs, a rule asked for review
// (review), or a path changed meanwhile. res.CommitErr says why not.
func (s *Sandbox) autoCommit(ctx context.Context, execID string, tx *cowfs.Tx, review bool, res *Result) {
	if len(res.RunsOnHost) > 0 {
		// Auto-commit is a standing approval of ordinary writes; code the
		// person's own git would run is never approved by standing.
		res.CommitErr = fmt.Errorf("%w: %s", ErrRunsOnHost, strings.Join(res.RunsOnHost, ", "))
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "commit", Target: tx.ID(), Decision: "deny",
			Reason: "runs_on_host", Detail: "held for a person: git on the host would run " + strings.Join(res.RunsOnHost, ", ")})
		return
	}
	if review {
		res.CommitErr = errReviewRequired
		return
	}
	if len(res.ConcurrentChanges) > 0 {
		// Committing would put this command's version over a change it
		// was made without: a person decides.
		res.CommitErr = fmt.Errorf("%w (%s); the transaction is left pending for review",
			ErrConcurrentChange, strings.Join(res.ConcurrentChanges, ", "))
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "commit", Target: tx.ID(), Decision: "deny",
			Reason: "concurrent_change", Detail: res.CommitErr.Error()})
		return
	}
	res.Committed, res.CommitErr = s.commit(ctx, tx, execID)
	if res.CommitErr == nil {
		res.Transaction = ""
	}
}

// runsOnHost reports whether staging p would change what git on the host
// runs (see policy.RunsOnHost), under its own name or under the name it
// has when a symlink the workspace already holds is followed: a commit
// must not reach .git/hooks through a link called anything else.
func (s *Sandbox) runsOnHost(p string) bool {
	if policy.RunsOnHost(p) {
		return true
	}
	dir, rest := path.Dir(p), path.Base(p)
	for dir != "." && dir != "/" {
		if real, err := filepath.EvalSymlinks(filepath.Join(s.workspace, filepath.FromSlash(dir))); err == nil {
			rel, err := filepath.Rel(s.workspace, real)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				return false // outside the workspace: pathguard and cowfs refuse it
			}
			return policy.RunsOnHost(path.Join(filepath.ToSlash(rel), rest))
		}
		dir, rest = path.Dir(dir), path.Join(path.Base(dir), rest)
	}
	return false
}

// approveHostRun refuses, audited, to commit tx through the SDK when it
// changes what git runs on the host and no Approver approves each such
// path.
func (s *Sandbox) approveHostRun(ctx context.Context, tx *cowfs.Tx) error {
	return s.approvePaths(ctx, tx.ID(), s.hostRunPaths(tx.Changes(), nil), "pulse cow commit "+tx.ID())
}

// hostRunPaths appends to seen the paths of changes (those a command
// asked for, not the parents made for them) that change what git runs
// on the host, each once.
func (s *Sandbox) hostRunPaths(changes []cowfs.Change, seen []string) []string {
	for _, c := range changes {
		if !c.Implicit && s.runsOnHost(c.Path) && !slices.Contains(seen, c.Path) {
			seen = append(seen, c.Path)
		}
	}
	return seen
}

// approvePaths refuses, audited, a commit of target (a transaction id, or
// the pending stack) that carries paths, the changes of what git runs on
// the host, unless the Approver approves each. by is how a person
// commits it instead.
func (s *Sandbox) approvePaths(ctx context.Context, target string, paths []string, by string) error {
	if len(paths) == 0 {
		return nil
	}
	deny := func(why string) error {
		s.record(ctx, audit.Event{Action: "commit", Target: target, Decision: "deny", Reason: "runs_on_host",
			Detail: why + ": " + strings.Join(paths, ", ")})
		return fmt.Errorf("%w: %s: %s; a person commits it with: %s", ErrRunsOnHost, why, strings.Join(paths, ", "), by)
	}
	if s.o.approver == nil {
		return deny("no approver to ask")
	}
	for _, p := range paths {
		ok, err := s.o.approver(ctx, policy.Write, p)
		if err != nil {
			return deny("approval failed: " + err.Error())
		}
		if !ok {
			return deny("the approver refused " + p)
		}
	}
	return nil
}

// specialReplacements adds to ov the removal of each entry the command
// was shown (the pending stack's, or the workspace's where the stack
// decides nothing) at a path where it left a named pipe, socket or device
// node: it removed what was there to make that, and the removal is kept
// like any other, while the special file itself is not (specialReason).
// The remote backend, whose archive carries no such entry, reports the
// same removal, so every backend ends a command the same way. ov itself
// is not changed.
func (s *Sandbox) specialReplacements(view *cowfs.Stack, ov *backend.Overlay) *backend.Overlay {
	if ov == nil {
		return ov
	}
	var add []string
	for _, f := range ov.Files {
		if f.Special() && f.Mode&fs.ModeIrregular == 0 && !slices.Contains(ov.Deleted, f.Path) && s.shownAt(view, f.Path) {
			add = append(add, f.Path)
		}
	}
	if len(add) == 0 {
		return ov
	}
	return &backend.Overlay{Files: ov.Files, Deleted: append(slices.Clip(ov.Deleted), add...)}
}

// shownAt reports whether a command shown view (nil: no pending stack)
// saw an entry at p.
func (s *Sandbox) shownAt(view *cowfs.Stack, p string) bool {
	if view != nil {
		if e, decided, err := view.Lookup(p); err != nil || decided {
			return err == nil && e != nil
		}
	}
	_, err := os.Lstat(filepath.Join(s.workspace, filepath.FromSlash(p)))
	return err == nil
}

// specialReason says why an entry that is not a regular file, directory
// or symlink is not staged: only those are workspace content (what it
// replaced is removed: specialReplacements).
func specialReason(m fs.FileMode) string {
	kind := "not a regular file, directory or symlink (" + m.Type().String() + ")"
	switch {
	case m&fs.ModeNamedPipe != 0:
		kind = "a named pipe"
	case m&fs.ModeSocket != 0:
		kind = "a socket"
	case m&fs.ModeDevice != 0:
		kind = "a device node"
	case m&fs.ModeIrregular != 0:
		// What the backend could not carry back (the Docker backend: a
		// name holding a newline): reported so that it does not vanish.
		return "the backend could not carry it back (a name holding a newline)"
	}
	return kind + ": not workspace content, so not kept"
}
