package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/syncio"
	"github.com/pulse-agent/pulse/lifecycle"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// writerGrace is how long a caller's output writer may still block after
// the command's context has ended before it is given up on.
const writerGrace = 2 * time.Second

// Command is one command to run in the sandbox.
type Command struct {
	// Exactly one of Args (an argv, run without a shell) and Shell (a
	// script for bash -c) is set.
	Args  []string
	Shell string
	// Dir is the working directory, relative to the workspace.
	Dir string
	// Env is added to the command's minimal environment. Allowed secrets
	// are added by the sandbox.
	Env map[string]string
	// Stdin feeds standard input; nil is empty.
	Stdin io.Reader
	// Stdout and Stderr receive output as it arrives, scrubbed of
	// secrets. When nil, output is collected into Result.Stdout and
	// Result.Stderr instead.
	Stdout io.Writer
	Stderr io.Writer
	// Limits, when non-nil, tightens the sandbox's limits for this
	// command: each field set is used when it is no larger than the
	// policy's (or WithLimits'), and a zero field keeps theirs. Asking for
	// more than they allow fails with ErrLimitExceeded (a
	// *policy.LimitError naming the field); nothing runs.
	Limits *policy.ResourceLimits
	// ExecutionID names the execution in the audit log (default: random).
	ExecutionID string
	// TTY, for Start only, runs the command on a new pseudo-terminal of
	// this size made inside the sandbox (never the caller's); its output
	// is the terminal's, all of it on Stdout and the process's log, and
	// Process.Resize changes its size. Execute refuses it.
	TTY *TTY

	// review holds the command's writes for a person (set by SafeGit
	// when the policy asks about a git operation).
	review bool
	// keepOnlyOnSuccess stages the command's writes only when it exits
	// 0 (set by SafeGit: a failed git operation leaves nothing to review).
	keepOnlyOnSuccess bool
	// run, when set, is the script the backend runs in place of Shell
	// or Args (a Shell session's wrapper, shell.go); the policy, the
	// audit log and the transaction see the command as given.
	run string
}

func (c Command) String() string {
	if c.Shell != "" {
		return c.Shell
	}
	return strings.Join(c.Args, " ")
}

// Result is how a command ended and where its writes went.
type Result struct {
	ExecutionID string
	Command     string
	Backend     string
	Isolation   backend.Isolation

	ExitCode    int
	Termination backend.TerminationReason
	TimedOut    bool
	Truncated   bool
	Duration    time.Duration
	PID         int
	Metrics     backend.Metrics

	// Stdout and Stderr hold the scrubbed output when Command.Stdout or
	// Command.Stderr was nil.
	Stdout string
	Stderr string

	// Transaction is the id of the copy-on-write transaction holding the
	// command's writes, pending review ("" when it wrote nothing, or when
	// the backend writes in place).
	Transaction string
	// NetworkRefused lists the host:port destinations the egress proxy
	// refused (each once; allowlist mode only). Each refusal is in the
	// audit log with its rule, and the command got an explaining 403.
	NetworkRefused []string
	// NetworkRefusals says, for each destination of NetworkRefused and
	// in its order, why the proxy refused it, as the audit log has it:
	// a destination the allowlist does not hold, or one it does whose
	// connection was cut for what the command sent through it.
	NetworkRefusals []NetworkRefusal
	// Staged lists the paths staged in Transaction.
	Staged []string
	// Refused lists the paths the command wrote that were not staged, each
	// with why (the policy denies the write, or it contains a secret).
	Refused []RefusedPath
	// Committed lists the paths written to the workspace by auto-commit.
	Committed []string
	// RunsOnHost lists the changes of Transaction that git on the host
	// reads as instructions — hooks, config, the .git entry itself (see
	// policy.RunsOnHost). Auto-commit never applies them: a person must.
	RunsOnHost []string
	// ConcurrentChanges lists the staged paths that changed while the
	// command ran without it seeing the change: another transaction
	// changed what the pending stack shows there (the command started
	// from the stack before it), or the workspace file itself changed (a
	// commit, an edit) or was removed (then judged by its directory, which
	// also changes when an entry beside it is made or removed, so a new
	// file can be listed for a change beside it). The command's version
	// was made apart from that change (two appends to one file, say): it
	// is staged, commit --all keeps the upper transaction's version, and
	// auto-commit leaves the transaction pending (CommitErr wraps
	// ErrConcurrentChange). Each is in the audit log (action stack,
	// reason concurrent_change).
	ConcurrentChanges []string
	// CommitErr is why auto-commit did not happen (a conflict, wrapping
	// ErrConflict; ErrRunsOnHost; or a path the policy wants reviewed);
	// the transaction then stays pending.
	CommitErr error
	// InPlace is true when the backend wrote to the workspace directly
	// (the host backend); Changed and Deleted then list what a scan before
	// and after the command saw change.
	InPlace bool
	Changed []string
	Deleted []string
}

// RefusedPath is a written path that was not staged.
type RefusedPath struct {
	Path   string
	Reason string
}

// Execute runs cmd in the sandbox. The order is fixed: lifecycle STARTING;
// resolve the effective network and secret policies and refuse (audited)
// with ErrUnsupportedPolicy unless the backend enforces them strongly;
// expand the read policy into the paths the command must not read
// (Request.Hidden) and refuse the same way when the backend cannot hide
// them; evaluate the shell action (a denial starts no process); RUNNING; run
// with output through streaming scrubbers; audit the result; stage what
// the command wrote into a copy-on-write transaction (committed at once
// only with WithAutoCommit); FINALIZED.
//
// A command that ran returns a Result and a nil error whatever its exit
// code. When ctx ends, Execute kills the command and returns its partial
// Result together with ctx's error (errors.Is context.Canceled or
// context.DeadlineExceeded): Termination Cancelled, the output printed
// until then, the execution id, and the writes made until then staged
// like any command's. A command that ctx ended before it started gets
// such a Result too, with ExitCode -1 and no output. A command that ran but whose writes
// the backend could not capture returns its Result (nothing staged) and an
// error wrapping backend.ErrOverlayLost; it is audited as having run.
//
// Every string of the Result and of the error is scrubbed of the
// configured secrets, the command line included.
func (s *Sandbox) Execute(ctx context.Context, cmd Command) (*Result, error) {
	res, err := s.execute(ctx, cmd)
	s.scrubResult(res)
	return res, s.scrubErr(err)
}

func (s *Sandbox) execute(ctx context.Context, cmd Command) (*Result, error) {
	if cmd.TTY != nil {
		return nil, fmt.Errorf("%w: a terminal is for Start, not Execute", ErrInvalidCommand)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	x, err := s.newExecution(ctx, cmd)
	if err != nil {
		return nil, err
	}
	defer x.close(ctx)
	if err := x.check(ctx); err != nil {
		return x.cancelled(ctx)(x.fail(ctx, err))
	}
	if err := x.prepare(ctx); err != nil {
		return x.cancelled(ctx)(x.fail(ctx, err))
	}
	if err := ctx.Err(); err != nil {
		// Ended while the command was being set up: a backend would
		// start it only to kill it, with whatever it did meanwhile.
		return x.cancelled(ctx)(x.fail(ctx, err))
	}
	x.launching(ctx)
	br, err := s.backend.Exec(ctx, x.req)
	return x.cancelled(ctx)(x.finish(ctx, br, err))
}

// cancelled returns a filter that gives a command ended by ctx a Result
// even when it ended before it ran or before the backend could report
// one: a caller that cancels learns the execution id (the audit log's),
// the output printed so far and that it was cancelled, as one whose
// command timed out does. Any other failure passes unchanged.
func (x *execution) cancelled(ctx context.Context) func(*Result, error) (*Result, error) {
	return func(res *Result, err error) (*Result, error) {
		if res != nil || err == nil || ctx.Err() == nil {
			return res, err
		}
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return res, err
		}
		s := x.s
		res = &Result{ExecutionID: x.id, Command: x.cmdStr, Backend: s.backend.Name(), Isolation: s.caps.Isolation,
			ExitCode: -1, Termination: backend.Cancelled, InPlace: x.inPlace, NetworkRefused: x.eg.refusedHosts(), NetworkRefusals: x.eg.refusals()}
		if !x.start.IsZero() {
			res.Duration = time.Since(x.start)
		}
		if x.out != nil {
			x.out.collect(res)
		}
		return res, err
	}
}

// execution is one command on its way through Execute's phases:
//
//	newExecution  validate the command, give it an id and a lifecycle (STARTING)
//	check         limits, policies, hidden paths, the shell decision, the
//	              working directory: refusals, audited, before anything is set up
//	prepare       environment, caches, the pending stack, the transaction slot,
//	              output, egress proxy, the backend request; "starting" audited
//	launching     RUNNING; the backend is called right after
//	finish        once the command has ended: output flushed, the result
//	              audited, its writes scanned (in place) or staged
//	close         whatever phase it stopped in: release what prepare set up,
//	              end the lifecycle FINALIZED
//
// The split is where a command that runs in the background parts from one
// that is waited for: both go through newExecution, check, prepare and
// launching before the backend starts the process, and through finish and
// close after it has ended, wherever that is waited for.
type execution struct {
	s      *Sandbox
	cmd    Command
	id     string
	cmdStr string
	lc     *lifecycle.Execution

	// Set by check.
	limits policy.ResourceLimits
	net    policy.NetworkPolicy
	sec    secrets.Policy
	hidden []string
	review bool
	dir    string

	// Set by prepare.
	mounted []backend.Cache
	view    *cowfs.Stack // the pending stack the command was shown
	tx      *cowfs.Tx
	out     *outputs
	tap     io.Writer // a started process's output log, fed stdout and stderr as they arrive (Start)
	eg      *egressRun
	req     *backend.Request
	inPlace bool
	before  map[string]fileStamp

	// Set by launching and finish.
	start   time.Time
	overlay *backend.Overlay
}

// newExecution starts the lifecycle of cmd. The audit log gets the
// lifecycle at its turning points — a failure, and the end with the whole
// path taken — rather than one event per step: the start of the command
// is audited on its own, so nothing is lost, and the hot path writes four
// fewer events.
func (s *Sandbox) newExecution(ctx context.Context, cmd Command) (*execution, error) {
	if (len(cmd.Args) == 0) == (cmd.Shell == "") {
		return nil, fmt.Errorf("%w: exactly one of Args and Shell must be set", ErrInvalidCommand)
	}
	x := &execution{s: s, cmd: cmd, id: cmd.ExecutionID, cmdStr: cmd.String()}
	if x.id == "" {
		x.id = randomID()
	}
	lc, err := lifecycle.New(x.id, lifecycle.WithHook(x.auditTransition))
	if err != nil {
		return nil, fmt.Errorf("%w: execution id: %w", ErrInvalidCommand, err)
	}
	x.lc = lc
	x.step(ctx, lifecycle.Starting)
	return x, nil
}

func (x *execution) auditTransition(ctx context.Context, t lifecycle.Transition) {
	switch t.To {
	case lifecycle.Failed, lifecycle.Finalized, lifecycle.RecoveryRequired:
	default:
		return
	}
	states := make([]string, 0, 8)
	for _, h := range x.lc.History() {
		states = append(states, string(h.State))
	}
	d := "allow"
	if t.To != lifecycle.Finalized {
		d = "deny"
	}
	x.s.record(ctx, audit.Event{ExecutionID: t.ExecutionID, Action: "lifecycle-transition", Target: t.ExecutionID,
		Decision: d, Detail: "execution state " + string(t.To) + ": " + strings.Join(states, " -> ")})
}

func (x *execution) step(ctx context.Context, to lifecycle.State) {
	if err := x.lc.Transition(ctx, to); err != nil {
		x.s.log.Error("lifecycle", "execution", x.id, "err", err)
	}
}

// fail ends an execution that did not run (or whose backend failed).
func (x *execution) fail(ctx context.Context, err error) (*Result, error) {
	x.step(ctx, lifecycle.Failed)
	return nil, err
}

// check decides whether the command may run, and under what: its limits,
// its network and secret policies, the paths it must not read, the shell
// decision and its working directory. Every refusal is audited; nothing is
// set up yet.
func (x *execution) check(ctx context.Context) error {
	s := x.s
	limits, err := s.commandLimits(ctx, x.id, x.cmdStr, x.cmd.Limits)
	if err != nil {
		return err
	}
	x.limits = limits.WithDefaults()
	if x.net, x.sec, err = s.checkEnforcement(ctx, x.id, x.cmdStr, x.limits); err != nil {
		return err
	}
	if x.hidden, err = s.checkHidden(ctx, x.id, x.cmdStr); err != nil {
		return err
	}
	review, err := s.decide(ctx, policy.Shell, x.cmdStr, x.id)
	if err != nil {
		return err
	}
	x.review = review || x.cmd.review
	x.dir, err = s.workDir(x.cmd.Dir)
	return err
}

// workDir resolves a command's working directory to a slash path relative
// to the workspace, refusing one that leaves it.
func (s *Sandbox) workDir(dir string) (string, error) {
	if dir == "" || dir == "." {
		return dir, nil
	}
	abs, err := s.guard.Resolve(dir)
	if err != nil {
		return "", fmt.Errorf("%w: working directory: %w", ErrInvalidCommand, err)
	}
	rel, err := filepath.Rel(s.workspace, abs)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("%w: working directory %q is outside the workspace", ErrInvalidCommand, dir)
	}
	return filepath.ToSlash(rel), nil
}

// prepare sets up everything the backend needs for the command and
// builds its request; close undoes it. The "starting" event is the last
// thing it writes: no command runs unaudited.
func (x *execution) prepare(ctx context.Context) error {
	s := x.s
	env := x.env()
	var err error
	if x.mounted, err = s.prepareCaches(ctx, x.id, x.cmdStr, env); err != nil {
		return err
	}
	pend, err := x.pendingStack(ctx)
	if err != nil {
		return err
	}
	if s.cow != nil && s.cow.BoundsOpenTransactions() {
		// Only a bounded store can refuse a transaction for the number
		// open: take the slot before the command runs, so that a command
		// is refused rather than run and its writes dropped. Otherwise
		// the transaction is begun once there is something to stage: a
		// command that wrote nothing makes none (no fsyncs).
		if err := x.beginTx(ctx); err != nil {
			return err
		}
	}
	x.out = newOutputs(ctx, s.scrubber, x.cmd.Stdout, x.cmd.Stderr, x.tap)
	if x.eg, err = s.startEgress(ctx, x.id, x.net); err != nil {
		return err
	}
	args, shell := x.cmd.Args, x.cmd.Shell
	if x.cmd.run != "" {
		args, shell = nil, x.cmd.run
	}
	x.req = &backend.Request{
		ExecutionID: x.id,
		Workspace:   s.workspace,
		Args:        args,
		Shell:       shell,
		Dir:         x.dir,
		Env:         env,
		Stdin:       x.cmd.Stdin,
		Stdout:      x.out.stdout,
		Stderr:      x.out.stderr,
		Limits:      x.limits,
		Network:     x.net,
		Secrets:     x.sec,
		Egress:      x.eg.backendEgress(),
		Hidden:      x.hidden,
		Pending:     pend,
		Lane:        s.lane(),
		Caches:      x.mounted,
		// Large files come back as host paths, staged from disk by
		// stageOverlay in bounded memory; released by close.
		StreamFiles: true,
	}
	if err := s.record(ctx, audit.Event{ExecutionID: x.id, Action: "shell", Target: x.cmdStr, Decision: "allow",
		IsolationLevel: string(s.caps.Isolation), Backend: s.backend.Name(), Detail: "starting"}); err != nil {
		return err
	}
	x.inPlace = !s.caps.CapturesWrites
	if x.inPlace {
		x.before, _ = scanTree(s.workspace)
	}
	return nil
}

// env is the command's environment: its own variables, the secrets its
// policy lets through, and a placeholder for each secret bound to hosts —
// only ever a placeholder in here; the egress proxy puts the value in
// (egress.go).
func (x *execution) env() map[string]string {
	env := make(map[string]string, len(x.cmd.Env)+1)
	if x.s.caps.CapturesWrites {
		// git status refreshes .git/index whenever a file's stat data
		// differ from what the index records, as they do in every Docker
		// working copy: each read-only git status would otherwise leave a
		// pending change of .git/index to review. Writes git must make
		// (add, commit) take the index lock regardless. The command's own
		// Env can set it back.
		env["GIT_OPTIONAL_LOCKS"] = "0"
	}
	maps.Copy(env, x.cmd.Env)
	for _, sec := range x.sec.Filter(x.s.o.secrets) {
		if sec.Name != "" {
			env[sec.Name] = sec.Value
		}
	}
	for _, in := range x.s.inject {
		env[in.Name] = in.Placeholder
	}
	return env
}

// pendingStack is what a capturing backend runs the command on: the
// workspace plus every pending transaction, in order. A backend that
// cannot stack them is refused while any are pending.
func (x *execution) pendingStack(ctx context.Context) (*backend.Pending, error) {
	s := x.s
	if !s.caps.CapturesWrites {
		return nil, nil
	}
	st, err := s.pending(ctx, x.id)
	if err != nil {
		return nil, err
	}
	x.view = st
	pend := s.toPendingCached(st)
	if !pend.Empty() && !s.caps.StacksPending {
		s.record(ctx, audit.Event{ExecutionID: x.id, Action: "shell", Target: x.cmdStr, Decision: "deny",
			IsolationLevel: string(s.caps.Isolation), Backend: s.backend.Name(), Reason: "unsupported_policy",
			Detail: "backend cannot show the command the pending stack"})
		return nil, fmt.Errorf("%w: backend %q cannot run a command on top of pending transactions: %w",
			ErrUnsupportedPolicy, s.backend.Name(), ErrPendingInTheWay)
	}
	return pend, nil
}

// beginTx takes the transaction a capturing backend's writes are staged
// in: before the command runs when the store bounds open transactions
// (see prepare), else when stageOverlay has writes to stage. close
// discards it unless it holds staged writes.
func (x *execution) beginTx(ctx context.Context) error {
	if !x.s.caps.CapturesWrites || x.tx != nil {
		return nil
	}
	tx, err := x.s.cow.Begin(ctx, x.s.scrubber.Redact(fmt.Sprintf("exec %s: %s", x.id, x.cmdStr)))
	if err != nil {
		if le := (*cowfs.LimitError)(nil); errors.As(err, &le) && le.Name == cowfs.LimitOpenTx {
			return fmt.Errorf("sandbox: cannot stage this command's writes: %w: %w", ErrPendingInTheWay, err)
		}
		return fmt.Errorf("sandbox: cannot stage this command's writes: %w", err)
	}
	x.tx = tx
	return nil
}

// launching marks the moment the backend is handed the request.
func (x *execution) launching(ctx context.Context) {
	x.step(ctx, lifecycle.Running)
	x.start = time.Now()
}

// finish records a command that has ended, given what the backend
// returned: output flushed and closed, the backend's failure or the
// result audited, then its writes scanned (in place) or staged.
func (x *execution) finish(ctx context.Context, br *backend.Result, err error) (*Result, error) {
	s := x.s
	if br != nil {
		// Whatever happens next, close releases the overlay's kept files.
		x.overlay = br.Overlay
	}
	// The command ran but its writes were lost (backend.ErrOverlayLost,
	// with a Result): audited as run, returned with its Result and the
	// error, and nothing is staged.
	lost := err != nil && br != nil && errors.Is(err, backend.ErrOverlayLost)
	outErr := x.settle(ctx, err == nil || lost)
	s.recordBackendEgress(ctx, x.id, br, x.eg) // egress.go
	if err != nil && !lost {
		s.record(ctx, audit.Event{ExecutionID: x.id, Action: "shell", Target: x.cmdStr, Decision: "deny",
			IsolationLevel: string(s.caps.Isolation), Backend: s.backend.Name(), Detail: "backend failed: " + err.Error()})
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			// The backend failed as ctx ended: the end is the cause a
			// caller tests for.
			err = fmt.Errorf("%w: %w", cerr, err)
		}
		return x.fail(ctx, fmt.Errorf("sandbox: %s: %w", s.backend.Name(), err))
	}
	if lost || br.ExitCode != 0 || br.Termination != backend.Exited {
		x.step(ctx, lifecycle.Failed)
	} else {
		x.step(ctx, lifecycle.Completing)
	}
	res := x.result(br)
	detail := fmt.Sprintf("executed via %s backend", s.backend.Name())
	if lost {
		detail += "; its writes were lost: " + err.Error()
	}
	s.record(ctx, audit.Event{ExecutionID: x.id, Action: "shell", Target: x.cmdStr, Decision: "allow",
		ExitCode: audit.Int(br.ExitCode), DurationMS: float64(res.Duration.Microseconds()) / 1000,
		ContainerID: s.backend.Name(), IsolationLevel: string(s.caps.Isolation), Backend: s.backend.Name(),
		Reason: string(br.Termination), Detail: detail})
	if lost {
		return res, fmt.Errorf("sandbox: %s: %w", s.backend.Name(), err)
	}
	if err := x.recordWrites(ctx, br.Overlay, res); err != nil {
		x.step(ctx, lifecycle.Failed)
		return res, err
	}
	if outErr != nil {
		return res, fmt.Errorf("sandbox: output: %w", outErr)
	}
	if ctx.Err() != nil && br.Termination == backend.Cancelled {
		return res, ctx.Err()
	}
	return res, nil
}

// settle ends what ran beside the command: the egress proxy (so every
// connection is recorded before the result is), the caches' size caps
// (when the backend did not fail) and the output streams, whose first
// error it returns.
func (x *execution) settle(ctx context.Context, ran bool) error {
	x.eg.close()
	if ran {
		x.s.trimCaches(ctx, x.id, x.mounted)
	}
	return x.out.close()
}

// result is the Result of a command that ran, before its writes are
// recorded.
func (x *execution) result(br *backend.Result) *Result {
	s := x.s
	res := &Result{
		ExecutionID: x.id, Command: x.cmdStr, Backend: s.backend.Name(), Isolation: s.caps.Isolation,
		ExitCode: br.ExitCode, Termination: br.Termination, TimedOut: br.TimedOut, Truncated: br.Truncated,
		Duration: br.Duration, PID: br.PID, Metrics: br.Metrics, InPlace: x.inPlace,
		NetworkRefused: x.eg.refusedHosts(), NetworkRefusals: x.eg.refusals(),
	}
	if res.Duration == 0 {
		res.Duration = time.Since(x.start)
	}
	x.out.collect(res)
	return res
}

// recordWrites puts what the command wrote where it belongs: an in-place
// backend's changes, found by scanning the workspace again, are audited
// one by one; a capturing backend's overlay, less the deletions of hidden
// paths, is staged into the transaction.
func (x *execution) recordWrites(ctx context.Context, ov *backend.Overlay, res *Result) error {
	s := x.s
	if x.inPlace {
		after, _ := scanTree(s.workspace)
		res.Changed, res.Deleted = diffScans(x.before, after)
		isolation := string(s.caps.Isolation)
		for _, p := range res.Changed {
			s.record(ctx, audit.Event{ExecutionID: x.id, Action: "write-in-place", Target: p, Decision: "allow",
				IsolationLevel: isolation, Detail: "written directly by the host backend"})
		}
		for _, p := range res.Deleted {
			s.record(ctx, audit.Event{ExecutionID: x.id, Action: "delete-in-place", Target: p, Decision: "allow",
				IsolationLevel: isolation, Detail: "deleted directly by the host backend"})
		}
		return nil
	}
	if x.cmd.keepOnlyOnSuccess && (res.ExitCode != 0 || res.Termination != backend.Exited) && !ov.Empty() {
		x.dropWrites(ctx, ov, res)
		return nil
	}
	ov = s.specialReplacements(x.view, ov)
	if ov = s.dropHiddenDeletions(ctx, x.id, ov, x.hidden, res); ov.Empty() {
		return nil
	}
	return s.stageOverlay(ctx, x, ov, res)
}

// dropWrites leaves every write of a command that failed unstaged, each
// listed in res.Refused and audited.
func (x *execution) dropWrites(ctx context.Context, ov *backend.Overlay, res *Result) {
	reason := fmt.Sprintf("the command failed (exit %d, %s): its writes are not staged", res.ExitCode, res.Termination)
	paths := append([]string(nil), ov.Deleted...)
	for _, f := range ov.Files {
		paths = append(paths, f.Path)
	}
	events := make([]audit.Event, 0, len(paths))
	for _, p := range paths {
		res.Refused = append(res.Refused, RefusedPath{Path: x.s.scrubber.Redact(p), Reason: reason})
		events = append(events, audit.Event{ExecutionID: x.id, Action: "write", Target: p, Decision: "deny", Detail: reason})
	}
	x.s.recordBatch(ctx, "drop-failed", events)
}

// close releases what prepare set up, in reverse, whichever phase the
// execution stopped in, and ends it FINALIZED, or RECOVERY_REQUIRED when
// something could not be removed (see endCleaning in cleanup.go).
func (x *execution) close(ctx context.Context) {
	var left []error
	if err := x.overlay.Release(); err != nil {
		left = append(left, err)
	}
	if err := x.eg.close(); err != nil {
		left = append(left, err)
	}
	x.out.release()
	// The transaction is left open only when it holds staged writes;
	// removed even when the command was cancelled.
	if x.tx != nil && x.tx.Empty() {
		if err := x.tx.Discard(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, cowfs.ErrClosed) && !errors.Is(err, cowfs.ErrNotFound) {
			left = append(left, fmt.Errorf("empty pending transaction %s: %w", x.tx.ID(), err))
		}
	}
	x.endCleaning(ctx, left)
}

// outputs carries a command's stdout and stderr to the caller. Everything
// the command prints passes a streaming scrubber before the caller sees
// it; a nil writer collects into the Result. A caller's writer is fed from
// a queue of its own, so that one that blocks is given up on a grace
// period after ctx ends instead of holding the command, the backend and
// Close forever. A tap (a started process's output log) gets both
// streams as the scrubbers pass them on, in the goroutines of the
// backend's copiers, before any queue: so it holds them in the order they
// arrived, which the two queues' goroutines would not keep.
type outputs struct {
	stdout, stderr io.WriteCloser // the scrubbers the backend writes to

	outBuf, errBuf         syncio.Buffer // when the caller gave no writer; the backend may write both at once
	collectOut, collectErr bool
	queues                 []*outWriter
	giveUp                 chan struct{}
	stopWatch              func() bool
	closed                 bool
}

func newOutputs(ctx context.Context, scrubber *secrets.Scrubber, stdout, stderr, tap io.Writer) *outputs {
	o := &outputs{collectOut: stdout == nil && tap == nil, collectErr: stderr == nil && tap == nil, giveUp: make(chan struct{})}
	out, errw := io.Writer(&o.outBuf), io.Writer(&o.errBuf)
	if tap != nil {
		out, errw = io.Discard, io.Discard // collected in the tap instead
	}
	if stdout != nil {
		q := newOutWriter(stdout)
		o.queues, out = append(o.queues, q), q
	}
	if stderr != nil {
		q := newOutWriter(stderr)
		o.queues, errw = append(o.queues, q), q
	}
	if tap != nil {
		out, errw = io.MultiWriter(tap, out), io.MultiWriter(tap, errw)
	}
	o.stopWatch = context.AfterFunc(ctx, func() {
		time.AfterFunc(writerGrace, func() {
			for _, q := range o.queues {
				q.abandon()
			}
			close(o.giveUp)
		})
	})
	o.stdout, o.stderr = scrubber.NewWriter(out), scrubber.NewWriter(errw)
	return o
}

// close flushes the scrubbers and waits for the caller's writers (up to
// the grace period after ctx ends); it returns the first error.
func (o *outputs) close() error {
	o.closed = true
	errOut, errErr := o.stdout.Close(), o.stderr.Close()
	for _, q := range o.queues {
		if qerr := q.close(o.giveUp); qerr != nil && errOut == nil {
			errOut = qerr
		}
	}
	return firstErr(errOut, errErr)
}

// release ends the watch on ctx, first closing the streams when the
// command never ran, so that no queue's goroutine is left waiting for
// writes. Safe on nil.
func (o *outputs) release() {
	if o == nil {
		return
	}
	if !o.closed {
		_ = o.close()
	}
	o.stopWatch()
}

// collect puts the output that had no writer of the caller's into res.
func (o *outputs) collect(res *Result) {
	if o.collectOut {
		res.Stdout = o.outBuf.String()
	}
	if o.collectErr {
		res.Stderr = o.errBuf.String()
	}
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
