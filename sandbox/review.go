package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/pathguard"
)

// Entry points a review action can come from, as the audit's via field
// names them.
const (
	ViaSDK        = "sdk"
	ViaCLI        = "cli"
	ViaReviewPage = "review-page"
	// ViaAutoCommit marks a commit WithAutoCommit made on its own.
	ViaAutoCommit = "auto-commit"
)

// Review is the one path every review action takes, wherever it comes
// from — Tx.Commit and Discard, `pulse cow`, the `pulse review` page:
// commit, discard, undo and per-path reject are applied through cowfs and
// each is audited with who decided (the OS user), through which entry
// point and session, on which transaction, which paths with the SHA-256
// of their content, and the outcome (allow, or deny with the reason). A
// Review opens a workspace's staged state and audit log without choosing
// a backend, so a review tool needs neither Docker nor namespaces.
//
// Methods are safe for concurrent use, also with other processes working
// on the same workspace.
type Review struct {
	cow       *cowfs.FS
	audit     *audit.Logger
	ownsCow   bool
	ownsAudit bool
	actor     string
	via       string
	session   string
	log       *slog.Logger
}

// ReviewOption configures OpenReview.
type ReviewOption func(*reviewOptions) error

type reviewOptions struct {
	via, session, actor string
	lane                string
	key                 *audit.Key
	keySet              bool
	getenv              func(string) string
	logger              *slog.Logger
}

// ReviewVia names the entry point recorded with each action (ViaCLI,
// ViaReviewPage, ...). The default is ViaSDK.
func ReviewVia(via string) ReviewOption {
	return func(o *reviewOptions) error { o.via = via; return nil }
}

// ReviewSession sets the session_id recorded with each action: the review
// page's session, for example.
func ReviewSession(id string) ReviewOption {
	return func(o *reviewOptions) error { o.session = id; return nil }
}

// ReviewActor sets who is recorded as deciding; the default is the OS
// user running the process.
func ReviewActor(name string) ReviewOption {
	return func(o *reviewOptions) error { o.actor = name; return nil }
}

// ReviewAuditKey sets the audit chain key (nil: unkeyed). Without this
// option the key is the one audit.LoadKey finds in the environment.
func ReviewAuditKey(k *audit.Key) ReviewOption {
	return func(o *reviewOptions) error { o.key, o.keySet = k, true; return nil }
}

// ReviewGetenv replaces os.Getenv where OpenReview looks for the audit
// key (audit.LoadKey).
func ReviewGetenv(getenv func(string) string) ReviewOption {
	return func(o *reviewOptions) error {
		if getenv != nil {
			o.getenv = getenv
		}
		return nil
	}
}

// ReviewLane reviews lane id of the workspace's transaction store (a
// forked sandbox's, Sandbox.Lane): CommitAll, DiscardAll and Squash work
// on its stack. The default is the default lane.
func ReviewLane(id string) ReviewOption {
	return func(o *reviewOptions) error { o.lane = id; return nil }
}

// ReviewLogger sets the operational logger.
func ReviewLogger(l *slog.Logger) ReviewOption {
	return func(o *reviewOptions) error { o.logger = l; return nil }
}

// OSUser names the user running this process, for the audit's actor.
func OSUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "uid:" + strconv.Itoa(os.Getuid())
}

// OpenReview opens the staged state and the audit log
// (<workspace>/.pulse/audit.jsonl) of workspace for review. Close it when
// done.
func OpenReview(ctx context.Context, workspace string, opts ...ReviewOption) (*Review, error) {
	o := reviewOptions{via: ViaSDK, getenv: os.Getenv}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.actor == "" {
		o.actor = OSUser()
	}
	abs, err := filepath.Abs(workspace)
	if err != nil {
		return nil, fmt.Errorf("sandbox: review: %w", err)
	}
	state := filepath.Join(abs, pathguard.ReservedDir)
	if fi, err := os.Lstat(state); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("sandbox: review: %s in the workspace is not a directory (a symlink?); refusing to write state through it",
			pathguard.ReservedDir)
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: review: %w", err)
	}
	key := o.key
	if !o.keySet {
		if key, err = auditKeyFor(abs, o.getenv); err != nil {
			return nil, err
		}
	}
	al, err := audit.Open(ctx, filepath.Join(state, "audit.jsonl"), audit.WithKey(key), audit.WithLogger(o.logger))
	if err != nil {
		return nil, fmt.Errorf("sandbox: review: %w", err)
	}
	cow, err := cowfs.Open(ctx, abs, cowfs.WithLogger(o.logger), cowfs.WithLane(o.lane), cowfs.WithoutNewWriteBits(0o022))
	if err != nil {
		al.Close()
		return nil, fmt.Errorf("sandbox: review: %w", err)
	}
	r := &Review{cow: cow, audit: al, ownsCow: true, ownsAudit: true, actor: o.actor, via: o.via,
		session: o.session, log: o.logger}
	if rerr := cow.RecoveryErr(); rerr != nil {
		r.record(ctx, []audit.Event{{Action: "cow-recovery", Decision: "deny", Detail: rerr.Error()}})
	}
	return r, nil
}

// auditKeyFor finds the configured audit key and refuses one kept inside
// the workspace, where a sandboxed command could read it.
func auditKeyFor(workspace string, getenv func(string) string) (*audit.Key, error) {
	key, err := audit.LoadKey(getenv)
	if err != nil {
		return nil, fmt.Errorf("sandbox: audit key: %w", err)
	}
	if key.Inside(workspace) {
		return nil, fmt.Errorf("sandbox: audit key %s is inside the workspace, where commands can read it; keep it outside", key.Source)
	}
	return key, nil
}

// review returns the Review the sandbox's own commit and discard go
// through: its audit log and staged state, the SDK as entry point.
func (s *Sandbox) review() *Review {
	return &Review{cow: s.cow, audit: s.audit, actor: OSUser(), via: ViaSDK, session: s.o.sessionID, log: s.log}
}

// ReviewAs is a Review over the sandbox's own staged state and audit
// writer recording via and session: for a page or tool that shares a
// process with the sandbox. Closing it leaves the sandbox's open.
func (s *Sandbox) ReviewAs(via, session string) *Review {
	r := s.review()
	r.via, r.session = via, session
	return r
}

// FS is the staged state, for listing and diffing (which change nothing
// and are not audited).
func (r *Review) FS() *cowfs.FS { return r.cow }

// AuditPath is the audit log the review writes.
func (r *Review) AuditPath() string {
	if r.audit == nil {
		return ""
	}
	return r.audit.Path()
}

// Close closes what OpenReview opened. It is idempotent.
func (r *Review) Close() error {
	var err error
	if r.ownsCow && r.cow != nil {
		err = r.cow.Close()
		r.cow = nil
	}
	if r.ownsAudit && r.audit != nil {
		if cerr := r.audit.Close(); err == nil {
			err = cerr
		}
		r.audit = nil
	}
	return err
}

func (r *Review) event(action, txID string) audit.Event {
	return audit.Event{Action: action, TxID: txID, Actor: r.actor, Via: r.via, SessionID: r.session}
}

// record writes events as one batch, even when ctx has ended; by then the
// action is done, so a failure is reported to the operational logger (as
// the sandbox's own audit failures are), not as the action's error.
func (r *Review) record(ctx context.Context, events []audit.Event) {
	if r.audit == nil || len(events) == 0 {
		return
	}
	if err := r.audit.RecordBatch(context.WithoutCancel(ctx), events); err != nil {
		r.log.Error("audit record failed", "action", events[0].Action, "events", len(events), "err", err)
	}
}

// pathEvents is one event per staged change of tx, with the content hash
// of each write.
func (r *Review) pathEvents(action, execID string, tx *cowfs.Tx, paths []string, detail string) []audit.Event {
	hashes := tx.ContentHashes()
	evs := make([]audit.Event, 0, len(paths))
	for _, p := range paths {
		e := r.event(action, tx.ID())
		e.ExecutionID, e.Target, e.Decision, e.ContentSHA256, e.Detail = execID, p, "allow", hashes[p], detail
		evs = append(evs, e)
	}
	return evs
}

// Commit applies transaction id to the workspace (see cowfs.Tx.Commit)
// and returns the paths changed.
func (r *Review) Commit(ctx context.Context, id string) ([]string, error) {
	tx, err := r.tx(ctx, "commit", id)
	if err != nil {
		return nil, err
	}
	if err := r.checkStack(ctx, "commit", id); err != nil {
		return nil, err
	}
	return r.commitTx(ctx, tx, "")
}

// CommitPaths commits only the paths accepted of transaction id: every
// other staged change is rejected (see Reject) and the rest committed.
// When the commit is refused (a conflict), the rejected changes are put
// back, so the transaction is as it was and only the refusal is audited.
// An empty accept list is refused; use Discard.
func (r *Review) CommitPaths(ctx context.Context, id string, accept []string) ([]string, error) {
	if len(accept) == 0 {
		return nil, fmt.Errorf("sandbox: review: %w: no path accepted; discard the transaction instead", cowfs.ErrNotFound)
	}
	tx, err := r.tx(ctx, "commit", id)
	if err != nil {
		return nil, err
	}
	// Part of a transaction is no more independent of the stack than
	// all of it.
	if err := r.checkStack(ctx, "commit", id); err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for _, p := range accept {
		keep[p] = true
	}
	var reject []string
	staged := map[string]bool{}
	for _, c := range tx.Changes() {
		staged[c.Path] = true
		if !keep[c.Path] && !c.Implicit {
			reject = append(reject, c.Path)
		}
	}
	for _, p := range accept {
		if !staged[p] {
			err := fmt.Errorf("sandbox: review: %w: %q is not staged in transaction %s", cowfs.ErrNotFound, p, id)
			r.refused(ctx, "commit", id, p, err)
			return nil, err
		}
	}
	if len(reject) == 0 {
		return r.commitTx(ctx, tx, "")
	}
	hashes := tx.ContentHashes()
	u, err := tx.Unstage(ctx, reject...)
	if err != nil {
		r.refused(ctx, "reject", id, id, err)
		return nil, err
	}
	paths, err := tx.Commit(ctx)
	if err != nil {
		if rerr := tx.Restage(ctx, u); rerr != nil {
			err = fmt.Errorf("%w (and the rejected files could not be put back: %v)", err, rerr)
		}
		r.commitRefused(ctx, tx, "", err)
		return nil, err
	}
	evs := r.rejectEvents(tx, u.Paths, hashes)
	evs = append(evs, r.pathEvents("commit", "", tx, paths, "committed transaction "+tx.ID())...)
	r.record(ctx, evs)
	return paths, nil
}

func (r *Review) tx(ctx context.Context, action, id string) (*cowfs.Tx, error) {
	tx, err := r.cow.Tx(ctx, id)
	if err != nil {
		r.refused(ctx, action, id, id, err)
		return nil, err
	}
	return tx, nil
}

// refused records an action that did not happen.
func (r *Review) refused(ctx context.Context, action, txID, target string, err error) {
	e := r.event(action, txID)
	e.Target, e.Decision, e.Detail = target, "deny", err.Error()
	var ce *cowfs.ConflictError
	if errors.As(err, &ce) {
		e.Target, e.Reason = ce.Path, "conflict: "+ce.Reason
	}
	r.record(ctx, []audit.Event{e})
}

func (r *Review) commitRefused(ctx context.Context, tx *cowfs.Tx, execID string, err error) {
	e := r.event("commit", tx.ID())
	e.ExecutionID, e.Target, e.Decision, e.Detail = execID, tx.ID(), "deny", err.Error()
	var ce *cowfs.ConflictError
	if errors.As(err, &ce) {
		e.Target, e.Reason = ce.Path, "conflict: "+ce.Reason
	}
	r.record(ctx, []audit.Event{e})
}

func (r *Review) commitTx(ctx context.Context, tx *cowfs.Tx, execID string) ([]string, error) {
	paths, err := tx.Commit(ctx)
	if err != nil {
		r.commitRefused(ctx, tx, execID, err)
		return nil, err
	}
	r.record(ctx, r.pathEvents("commit", execID, tx, paths, "committed transaction "+tx.ID()))
	return paths, nil
}

// Discard drops transaction id and its staged bytes.
func (r *Review) Discard(ctx context.Context, id string) error {
	tx, err := r.tx(ctx, "discard", id)
	if err != nil {
		return err
	}
	if err := r.checkStack(ctx, "discard", id); err != nil {
		return err
	}
	return r.discardTx(ctx, tx)
}

func (r *Review) discardTx(ctx context.Context, tx *cowfs.Tx) error {
	changes := tx.Changes()
	if err := tx.Discard(ctx); err != nil {
		r.refused(ctx, "discard", tx.ID(), tx.ID(), err)
		return err
	}
	paths := make([]string, 0, len(changes))
	for _, c := range changes {
		paths = append(paths, c.Path)
	}
	evs := r.pathEvents("discard", "", tx, paths, "discarded transaction "+tx.ID())
	if len(evs) == 0 {
		e := r.event("discard", tx.ID())
		e.Target, e.Decision, e.Detail = tx.ID(), "allow", "discarded transaction "+tx.ID()+" (no changes)"
		evs = append(evs, e)
	}
	r.record(ctx, evs)
	return nil
}

// Reject takes paths out of transaction id (see cowfs.Tx.Unstage) and
// returns every path taken out; a later Commit applies the rest.
func (r *Review) Reject(ctx context.Context, id string, paths []string) ([]string, error) {
	tx, err := r.tx(ctx, "reject", id)
	if err != nil {
		return nil, err
	}
	return r.rejectTx(ctx, tx, paths)
}

func (r *Review) rejectTx(ctx context.Context, tx *cowfs.Tx, paths []string) ([]string, error) {
	hashes := tx.ContentHashes()
	u, err := tx.Unstage(ctx, paths...)
	if err != nil {
		target := tx.ID()
		if len(paths) == 1 {
			target = paths[0]
		}
		r.refused(ctx, "reject", tx.ID(), target, err)
		return nil, err
	}
	r.record(ctx, r.rejectEvents(tx, u.Paths, hashes))
	return u.Paths, nil
}

func (r *Review) rejectEvents(tx *cowfs.Tx, gone []string, hashes map[string]string) []audit.Event {
	evs := make([]audit.Event, 0, len(gone))
	for _, p := range gone {
		e := r.event("reject", tx.ID())
		e.Target, e.Decision, e.ContentSHA256 = p, "allow", hashes[p]
		e.Detail = "rejected from transaction " + tx.ID()
		evs = append(evs, e)
	}
	return evs
}

// Undo reverts the last committed transaction (see cowfs.FS.Undo).
func (r *Review) Undo(ctx context.Context) (*cowfs.TxInfo, error) {
	info, err := r.cow.Undo(ctx)
	if err != nil {
		r.refused(ctx, "undo", "", "last commit", err)
		return nil, err
	}
	e := r.event("undo", info.ID)
	e.Target, e.Decision = info.ID, "allow"
	e.Detail = fmt.Sprintf("undid transaction %s (%s): %d change(s)", info.ID, info.Description, info.Changes)
	r.record(ctx, []audit.Event{e})
	return info, nil
}

// Pending lists the open transactions in the order they were staged:
// the pending stack, oldest first.
func (r *Review) Pending(ctx context.Context) ([]cowfs.TxInfo, error) {
	all, err := r.cow.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []cowfs.TxInfo
	for _, i := range all {
		if i.State == cowfs.StateOpen {
			out = append(out, i)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Created.Before(out[b].Created) })
	return out, nil
}
