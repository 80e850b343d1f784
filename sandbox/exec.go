package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
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

	// review holds the command's writes for a person (set by SafeGit
	// when the policy asks about a git operation).
	review bool
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
// code; ctx cancellation kills it and returns its Result with Termination
// Cancelled together with ctx's error.
//
// Every string of the Result and of the error is scrubbed of the
// configured secrets, the command line included.
func (s *Sandbox) Execute(ctx context.Context, cmd Command) (*Result, error) {
	res, err := s.execute(ctx, cmd)
	s.scrubResult(res)
	return res, s.scrubErr(err)
}

func (s *Sandbox) execute(ctx context.Context, cmd Command) (*Result, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()

	if (len(cmd.Args) == 0) == (cmd.Shell == "") {
		return nil, fmt.Errorf("%w: exactly one of Args and Shell must be set", ErrInvalidCommand)
	}
	execID := cmd.ExecutionID
	if execID == "" {
		execID = randomID()
	}
	cmdStr := cmd.String()
	isolation := string(s.caps.Isolation)

	// The audit log gets the lifecycle at its turning points — a failure,
	// and the end with the whole path taken — rather than one event per
	// step: the start of the command is audited on its own, so nothing is
	// lost, and the hot path writes four fewer events.
	var lc *lifecycle.Execution
	lc, err := lifecycle.New(execID, lifecycle.WithHook(func(ctx context.Context, t lifecycle.Transition) {
		switch t.To {
		case lifecycle.Failed, lifecycle.Finalized, lifecycle.RecoveryRequired:
		default:
			return
		}
		states := make([]string, 0, 8)
		for _, h := range lc.History() {
			states = append(states, string(h.State))
		}
		d := "allow"
		if t.To != lifecycle.Finalized {
			d = "deny"
		}
		s.record(ctx, audit.Event{ExecutionID: t.ExecutionID, Action: "lifecycle-transition", Target: t.ExecutionID,
			Decision: d, Detail: "execution state " + string(t.To) + ": " + strings.Join(states, " -> ")})
	}))
	if err != nil {
		return nil, fmt.Errorf("%w: execution id: %w", ErrInvalidCommand, err)
	}
	step := func(to lifecycle.State) {
		if err := lc.Transition(ctx, to); err != nil {
			s.log.Error("lifecycle", "execution", execID, "err", err)
		}
	}
	step(lifecycle.Starting)
	// Whatever happens next, the execution ends FINALIZED; nothing is left
	// for a cleanup pass, because the backend owns no per-command state
	// once Exec returns.
	defer func() {
		if st := lc.State(); st != lifecycle.Finalized && st != lifecycle.RecoveryRequired {
			step(lifecycle.Cleaning)
			step(lifecycle.Finalized)
		}
	}()
	fail := func(err error) (*Result, error) {
		step(lifecycle.Failed)
		return nil, err
	}

	// A command's limits tighten the sandbox's, field by field; asking
	// for more than the policy allows is refused, not quietly capped, so
	// the caller learns that what it asked for is not what would run.
	limits := *s.o.limits
	if cmd.Limits != nil {
		if err := cmd.Limits.Validate(); err != nil {
			return fail(fmt.Errorf("%w: limits: %w", ErrInvalidCommand, err))
		}
		// On an isolating backend the pids and memory defaults are a
		// ceiling too: a command cannot lift itself above them, only the
		// policy can. What the command leaves unset stays unset, for the
		// backend to default.
		ceil := limits
		if s.caps.Isolation != backend.IsolationHostUnsafe {
			ceil = ceil.WithIsolationDefaults()
		}
		l, err := ceil.Tighten(*cmd.Limits)
		if err == nil {
			if cmd.Limits.Pids == 0 {
				l.Pids = limits.Pids
			}
			if cmd.Limits.MemoryBytes == 0 {
				l.MemoryBytes = limits.MemoryBytes
			}
		}
		if err != nil {
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
				Backend: s.backend.Name(), Reason: "limit_exceeded", Detail: err.Error()})
			return fail(fmt.Errorf("sandbox: %w", err))
		}
		if s.wholeLimits && (l.MemoryBytes != limits.MemoryBytes || l.Pids != limits.Pids || l.CPUs != limits.CPUs) {
			// Quietly running under the container's higher limits would
			// be a downgrade like any other.
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
				Backend: s.backend.Name(), Reason: "unsupported_policy",
				Detail: "memory, cpu and pids limits apply to the whole container; a command cannot lower them"})
			return fail(fmt.Errorf("%w: backend %q applies memory, cpu and pids limits to its whole container; a command cannot lower them (set them with WithLimits or the policy instead)",
				ErrUnsupportedPolicy, s.backend.Name()))
		}
		limits = l
	}
	limits = limits.WithDefaults()
	netPol, secPol, err := s.checkEnforcement(ctx, execID, cmdStr, limits)
	if err != nil {
		return fail(err)
	}
	hidden, err := s.checkHidden(ctx, execID, cmdStr)
	if err != nil {
		return fail(err)
	}
	review, err := s.decide(ctx, policy.Shell, cmdStr, execID)
	if err != nil {
		return fail(err)
	}
	review = review || cmd.review

	dir := cmd.Dir
	if dir != "" && dir != "." {
		abs, err := s.guard.Resolve(dir)
		if err != nil {
			return fail(fmt.Errorf("%w: working directory: %w", ErrInvalidCommand, err))
		}
		rel, err := filepath.Rel(s.workspace, abs)
		if err != nil || strings.HasPrefix(rel, "..") {
			return fail(fmt.Errorf("%w: working directory %q is outside the workspace", ErrInvalidCommand, dir))
		}
		dir = filepath.ToSlash(rel)
	}

	env := make(map[string]string, len(cmd.Env))
	maps.Copy(env, cmd.Env)
	for _, sec := range secPol.Filter(s.o.secrets) {
		if sec.Name != "" {
			env[sec.Name] = sec.Value
		}
	}
	// A secret bound to hosts is only ever a placeholder in here; the
	// egress proxy puts the value in (egress.go).
	for _, in := range s.inject {
		env[in.Name] = in.Placeholder
	}

	mounted, err := s.prepareCaches(ctx, execID, cmdStr, env)
	if err != nil {
		return fail(err)
	}

	// A capturing backend runs the command on the pending stack: the
	// workspace plus every pending transaction, in order.
	var pend *backend.Pending
	if s.caps.CapturesWrites {
		st, err := s.pending(ctx, execID)
		if err != nil {
			return fail(err)
		}
		pend = s.toPendingCached(st)
		if !pend.Empty() && !s.caps.StacksPending {
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
				IsolationLevel: isolation, Backend: s.backend.Name(), Reason: "unsupported_policy",
				Detail: "backend cannot show the command the pending stack"})
			return fail(fmt.Errorf("%w: backend %q cannot run a command on top of pending transactions; commit or discard them first (pulse cow list)",
				ErrUnsupportedPolicy, s.backend.Name()))
		}
	}

	// A capturing backend's writes need a transaction: its slot is taken
	// before the command runs, so that a command is refused, not run and
	// its writes dropped, when too many transactions await review.
	var tx *cowfs.Tx
	if s.caps.CapturesWrites {
		if tx, err = s.cow.Begin(s.scrubber.Redact(fmt.Sprintf("exec %s: %s", execID, cmdStr))); err != nil {
			return fail(fmt.Errorf("sandbox: cannot stage this command's writes (review or discard pending transactions: pulse cow list): %w", err))
		}
		defer func() {
			// Left open only when it holds staged writes.
			if tx != nil && tx.Empty() {
				_ = tx.Discard()
			}
		}()
	}

	// Everything the command prints passes a streaming scrubber before
	// the caller sees it; a nil writer collects into the Result. A
	// caller's writer is fed from a queue of its own, so that one that
	// blocks is given up on a grace period after ctx ends instead of
	// holding the command, the backend and Close forever.
	var outBuf, errBuf lockedBuffer
	var queues []*outWriter
	stdout, stderr := io.Writer(&outBuf), io.Writer(&errBuf)
	if cmd.Stdout != nil {
		q := newOutWriter(cmd.Stdout)
		queues, stdout = append(queues, q), q
	}
	if cmd.Stderr != nil {
		q := newOutWriter(cmd.Stderr)
		queues, stderr = append(queues, q), q
	}
	giveUp := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		time.AfterFunc(writerGrace, func() {
			for _, q := range queues {
				q.abandon()
			}
			close(giveUp)
		})
	})
	defer stopWatch()
	outW, errW := s.scrubber.NewWriter(stdout), s.scrubber.NewWriter(stderr)

	eg, err := s.startEgress(ctx, execID, netPol)
	if err != nil {
		return fail(err)
	}
	defer eg.close()

	req := &backend.Request{
		ExecutionID: execID,
		Workspace:   s.workspace,
		Args:        cmd.Args,
		Shell:       cmd.Shell,
		Dir:         dir,
		Env:         env,
		Stdin:       cmd.Stdin,
		Stdout:      outW,
		Stderr:      errW,
		Limits:      limits,
		Network:     netPol,
		Secrets:     secPol,
		Egress:      eg.backendEgress(),
		Hidden:      hidden,
		Pending:     pend,
		Caches:      mounted,
		// Large files come back as host paths, staged from disk by
		// stageOverlay in bounded memory; released below.
		StreamFiles: true,
	}

	if err := s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "allow",
		IsolationLevel: isolation, Backend: s.backend.Name(), Detail: "starting"}); err != nil {
		// No command runs unaudited.
		return fail(err)
	}

	var before map[string]fileStamp
	inPlace := !s.caps.CapturesWrites
	if inPlace {
		before, _ = scanTree(s.workspace)
	}

	step(lifecycle.Running)
	start := time.Now()
	br, err := s.backend.Exec(ctx, req)
	if br != nil {
		// Whatever happens next, the overlay's kept files go.
		defer br.Overlay.Release()
	}
	// Every connection is recorded before the result is.
	eg.close()
	if err == nil {
		s.trimCaches(ctx, execID, mounted)
	}
	cerr1, cerr2 := outW.Close(), errW.Close()
	for _, q := range queues {
		if qerr := q.close(giveUp); qerr != nil && cerr1 == nil {
			cerr1 = qerr
		}
	}
	if err != nil {
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
			IsolationLevel: isolation, Backend: s.backend.Name(), Detail: "backend failed: " + err.Error()})
		return fail(fmt.Errorf("sandbox: %s: %w", s.backend.Name(), err))
	}
	if br.ExitCode != 0 || br.Termination != backend.Exited {
		step(lifecycle.Failed)
	} else {
		step(lifecycle.Completing)
	}

	res := &Result{
		ExecutionID: execID, Command: cmdStr, Backend: s.backend.Name(), Isolation: s.caps.Isolation,
		ExitCode: br.ExitCode, Termination: br.Termination, TimedOut: br.TimedOut, Truncated: br.Truncated,
		Duration: br.Duration, PID: br.PID, Metrics: br.Metrics, InPlace: inPlace,
		NetworkRefused: eg.refusedHosts(),
	}
	if res.Duration == 0 {
		res.Duration = time.Since(start)
	}
	if cmd.Stdout == nil {
		res.Stdout = outBuf.String()
	}
	if cmd.Stderr == nil {
		res.Stderr = errBuf.String()
	}
	s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "allow",
		ExitCode: audit.Int(br.ExitCode), DurationMS: float64(res.Duration.Microseconds()) / 1000,
		ContainerID: s.backend.Name(), IsolationLevel: isolation, Backend: s.backend.Name(),
		Reason: string(br.Termination), Detail: fmt.Sprintf("executed via %s backend", s.backend.Name())})

	if inPlace {
		after, _ := scanTree(s.workspace)
		res.Changed, res.Deleted = diffScans(before, after)
		for _, p := range res.Changed {
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "write-in-place", Target: p, Decision: "allow",
				IsolationLevel: isolation, Detail: "written directly by the host backend"})
		}
		for _, p := range res.Deleted {
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "delete-in-place", Target: p, Decision: "allow",
				IsolationLevel: isolation, Detail: "deleted directly by the host backend"})
		}
	} else if ov := s.dropHiddenDeletions(ctx, execID, br.Overlay, hidden, res); !ov.Empty() {
		if err := s.stageOverlay(ctx, tx, execID, ov, review, res); err != nil {
			step(lifecycle.Failed)
			return res, err
		}
	}

	if err := firstErr(cerr1, cerr2); err != nil {
		return res, fmt.Errorf("sandbox: output: %w", err)
	}
	if ctx.Err() != nil && br.Termination == backend.Cancelled {
		return res, ctx.Err()
	}
	return res, nil
}

// effectivePolicies resolves what a command may reach. A policy that
// denies the network or secrets action forces deny-all; an allowed action
// with no configured policy gets deny-all too, except on the unsafe host
// backend, which can only give everything.
func (s *Sandbox) effectivePolicies() (policy.NetworkPolicy, secrets.SecretPolicy) {
	unsafeHost := s.caps.Isolation == backend.IsolationHostUnsafe
	net := policy.DenyAllNetwork()
	if s.o.policy.Allowed(policy.Network) {
		switch {
		case s.o.network != nil:
			net = *s.o.network
		case unsafeHost:
			net = policy.NetworkPolicy{Mode: policy.NetworkAllowAll}
		}
	}
	net = s.withAllowHosts(net, s.o.policy.Allowed(policy.Network))
	sec := secrets.DenyAllSecrets()
	if s.o.policy.Allowed(policy.Secrets) {
		switch {
		case s.o.secretPolicy != nil:
			sec = *s.o.secretPolicy
		case unsafeHost:
			sec = secrets.AllowAllSecrets()
		}
	}
	return net, sec
}

// checkEnforcement resolves the effective policies and refuses, before
// anything starts, a command whose policies the backend cannot enforce
// strongly. The one exception is the host backend chosen with
// WithUnsafeHostExecution: the caller has accepted that it enforces
// nothing, so a network mode it cannot enforce at all is sent as what
// really happens (allow-all), and each accepted downgrade is audited.
func (s *Sandbox) checkEnforcement(ctx context.Context, execID, cmdStr string, limits policy.ResourceLimits) (policy.NetworkPolicy, secrets.SecretPolicy, error) {
	net, sec := s.effectivePolicies()
	name := s.backend.Name()
	netLevel := s.caps.NetworkLevel(net.Mode)
	secLevel := s.caps.SecretLevel(sec.Mode)
	accepted := s.o.unsafeHost && s.caps.Isolation == backend.IsolationHostUnsafe

	decision := func(denyAll bool) string {
		if denyAll {
			return "deny"
		}
		return "allow"
	}
	s.record(ctx, audit.Event{ExecutionID: execID, Action: "network", Destination: "*", Protocol: "any",
		Decision: decision(net.Mode == policy.NetworkDenyAll), Backend: name,
		EnforcementLevel: string(netLevel), Detail: "network policy mode applied: " + string(net.Mode)})
	s.record(ctx, audit.Event{ExecutionID: execID, Action: "secrets", Target: "environment",
		Decision: decision(sec.Mode == secrets.DenyAll), Backend: name,
		EnforcementLevel: string(secLevel), Detail: "secret policy mode applied: " + string(sec.Mode)})

	check := func(kind, mode string, level secrets.EnforcementLevel) error {
		if level == secrets.Strong {
			return nil
		}
		if accepted {
			s.record(ctx, audit.Event{ExecutionID: execID, Action: kind, Target: cmdStr, Decision: "allow",
				IsolationLevel: string(s.caps.Isolation), Backend: name, EnforcementLevel: string(level),
				Reason: "UNSAFE_HOST",
				Detail: fmt.Sprintf("%s policy %s is %s on backend %s; accepted by unsafe host opt-in", kind, mode, level, name)})
			return nil
		}
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
			IsolationLevel: string(s.caps.Isolation), Backend: name, EnforcementLevel: string(level),
			Reason: "unsupported_policy",
			Detail: fmt.Sprintf("backend cannot strongly enforce %s policy: %s", kind, mode)})
		return fmt.Errorf("%w: backend %q enforces %s policy %q only at level %q; refused to prevent a silent downgrade",
			ErrUnsupportedPolicy, name, kind, mode, level)
	}
	if err := check("network", string(net.Mode), netLevel); err != nil {
		return net, sec, err
	}
	if err := check("secrets", string(sec.Mode), secLevel); err != nil {
		return net, sec, err
	}
	if err := s.checkLimits(ctx, execID, cmdStr, limits, accepted); err != nil {
		return net, sec, err
	}
	if accepted && netLevel == secrets.Unsupported {
		net = policy.NetworkPolicy{Mode: policy.NetworkAllowAll}
	}
	return net, sec, nil
}

// checkLimits refuses a command whose resource limits the backend cannot
// enforce at all: a memory cap that is silently not applied is a
// downgrade like any other. The limits every command has (the timeout and
// the output cap, filled in by default) are refused only when the backend
// says outright that it cannot enforce them; the others, only set when
// asked for, must be listed by the backend as enforced. Best-effort
// enforcement is accepted and audited, and so is anything the unsafe host
// opt-in accepted.
func (s *Sandbox) checkLimits(ctx context.Context, execID, cmdStr string, l policy.ResourceLimits, accepted bool) error {
	asked := []struct {
		name   string
		set    bool
		always bool
	}{
		{"timeout", l.Timeout > 0, true},
		{"output_bytes", l.OutputBytes > 0, true},
		{"memory_bytes", l.MemoryBytes > 0, false},
		{"cpus", l.CPUs > 0, false},
		{"pids", l.Pids > 0, false},
		{"file_size_bytes", l.FileSizeBytes > 0, false},
	}
	name := s.backend.Name()
	for _, a := range asked {
		if !a.set {
			continue
		}
		level, listed := s.caps.Limits[a.name]
		switch {
		case level == secrets.Strong:
			continue
		case level == secrets.BestEffort || (a.always && !listed):
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "limits", Target: a.name, Decision: "allow",
				Backend: name, EnforcementLevel: string(secrets.BestEffort),
				Detail: fmt.Sprintf("limit %s is enforced best-effort by backend %s", a.name, name)})
			continue
		case accepted:
			s.record(ctx, audit.Event{ExecutionID: execID, Action: "limits", Target: a.name, Decision: "allow",
				Backend: name, EnforcementLevel: string(secrets.Unsupported), Reason: "UNSAFE_HOST",
				Detail: fmt.Sprintf("limit %s is not enforced by backend %s; accepted by unsafe host opt-in", a.name, name)})
			continue
		}
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
			IsolationLevel: string(s.caps.Isolation), Backend: name, EnforcementLevel: string(secrets.Unsupported),
			Reason: "unsupported_policy", Detail: fmt.Sprintf("backend cannot enforce limit %s", a.name)})
		return fmt.Errorf("%w: backend %q cannot enforce the %s limit; refused to prevent a silent downgrade",
			ErrUnsupportedPolicy, name, a.name)
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// lockedBuffer collects output when the caller gave no writer; the
// backend may write stdout and stderr from different goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
