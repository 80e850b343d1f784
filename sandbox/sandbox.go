package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/internal/randhex"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// ErrConflict is cowfs.ErrConflict: a commit found a file changed by
// someone else since it was staged.
var ErrConflict = cowfs.ErrConflict

// Sandbox runs commands for one workspace. It is safe for concurrent use:
// many Execute calls may run at once.
type Sandbox struct {
	o         options
	workspace string
	guard     *pathguard.Guard
	scrubber  *secrets.Scrubber
	audit     *audit.Logger
	ownsAudit bool
	backend   backend.Backend
	ownsBE    bool
	caps      backend.Capabilities
	// ruledActions and rulesOnly: see policyDigest.
	ruledActions map[policy.Action]bool
	rulesOnly    *policy.Policy
	// readScope: where the read policy can deny (see readDigest);
	// readAhead, the paths it denies by full name (aheadTargets).
	readScope readScope
	readAhead []string
	// wholeLimits: the backend applies the sandbox's memory, cpu and
	// pids limits to all commands at once (a Docker container), so a
	// command cannot have lower ones of its own.
	wholeLimits bool
	// passedOver says why each backend before the chosen one was not
	// used ("name: reason").
	passedOver []string
	// inject are the secrets bound to hosts, and ca the sandbox's own CA
	// for their TLS (egress.go).
	inject    []egress.Injection
	caches    []policy.Cache // caches.go
	ca        *egress.CA
	cow       *cowfs.FS
	log       *slog.Logger
	pendCache pendingCache // stack.go
	procs     processTable // process.go
	exposed   exposeTable  // expose.go
	shared    *shared      // fork.go: the backend and audit log, with forks

	mu      sync.Mutex
	closed  bool
	running sync.WaitGroup
}

// New opens a sandbox on workspace: it checks the options, opens the
// audit log and the copy-on-write state (recovering any interrupted
// commit), and chooses a backend — the one given with WithBackend, or the
// first available of remote (PULSE_REMOTE_URL), Docker, namespaces and,
// only with WithUnsafeHostExecution, the host. The choice is audited.
// With no backend available it returns an *UnavailableError that wraps
// ErrUnavailable and names what was tried.
func New(ctx context.Context, workspace string, opts ...Option) (_ *Sandbox, err error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if o.backend == nil && o.backendName != "" && o.backendName != "auto" && o.image == "" && o.keepWarm == 0 {
		// What the named backend prepares in the background when it is
		// made (namespaces: backend.Driver.Prewarm) starts now, beside the
		// audit log's and the store's opening (with a keeper, the first
		// init most likely comes ready from it).
		for _, d := range candidates() {
			if d.Name == o.backendName && d.Prewarm != nil {
				d.Prewarm()
			}
		}
	}
	if o.network == nil && o.policy.Network != nil {
		n := *o.policy.Network
		o.network = &n
	}
	// The policy's limits, defaults filled in, are the ceiling of every
	// command; WithLimits and Command.Limits may only tighten them.
	ceil := o.policy.Limits.WithDefaults()
	if o.limits != nil {
		if ceil, err = ceil.Tighten(*o.limits); err != nil {
			return nil, fmt.Errorf("sandbox: WithLimits: %w", err)
		}
	}
	o.limits = &ceil
	early := probeAhead(ctx, &o)
	defer early.discard()

	abs, err := resolveWorkspace(workspace)
	if err != nil {
		return nil, err
	}

	s := &Sandbox{o: o, workspace: abs, log: o.logger, shared: &shared{refs: 1}}
	s.warnUnappliedNetwork() // network_why.go
	if s.caches, err = o.cacheList(); err != nil {
		return nil, err
	}
	s.ruledActions, s.rulesOnly = policyDigest(o.policy)
	s.readScope = readDigest(o.policy)
	s.readAhead = aheadTargets(o.policy)
	defer func() {
		if err != nil {
			s.release()
		}
	}()

	s.guard, err = pathguard.New(abs, pathguard.WithExternalReads(o.externalReads...), pathguard.WithLogger(o.logger))
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := s.setupEgress(); err != nil {
		return nil, err
	}
	if s.scrubber, err = newScrubber(o.secrets, s.inject); err != nil {
		return nil, err
	}

	// The workspace's state directory must be a real directory: a
	// repository that ships .pulse as a symlink would otherwise have the
	// audit log and the staged bytes written wherever it points.
	if fi, err := os.Lstat(filepath.Join(abs, pathguard.ReservedDir)); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("sandbox: %s in the workspace is not a directory (a symlink?); refusing to write state through it",
			pathguard.ReservedDir)
	}

	// The backend is chosen, and what it starts ahead started, before
	// the audit log and the store are opened, so that those openings run
	// while the backend's sandbox comes up rather than before it; but
	// when the choice would wait for a probe still on its way (a remote
	// server's answer, probeAhead), the openings run while it comes and
	// the choice follows them. Nothing of a command runs before Execute
	// audits it; a failure to choose is audited once the log is open, and
	// a failure after the choice closes the backend (release), the
	// started sandbox with it.
	var selErr error
	chooseFirst := !early.pending()
	if chooseFirst {
		selErr = s.chooseBackend(ctx, &o, early)
	}

	if err := s.openAudit(ctx); err != nil {
		return nil, err
	}

	s.cow, err = cowfs.Open(ctx, abs, append([]cowfs.Option{cowfs.WithLogger(o.logger), cowfs.WithoutNewWriteBits(o.writeGuard())}, o.cowOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if rerr := s.cow.RecoveryErr(); rerr != nil {
		// A quarantined commit is kept for a person to inspect; it does
		// not stop new work.
		s.record(ctx, audit.Event{Action: "cow-recovery", Decision: "deny", Detail: rerr.Error()})
	}
	if !chooseFirst {
		selErr = s.chooseBackend(ctx, &o, early)
	}

	if selErr != nil {
		s.record(ctx, audit.Event{Action: "sandbox-init", Target: "none", Decision: "deny",
			IsolationLevel: "unavailable", Detail: selErr.Error()})
		return nil, selErr
	}
	s.recordChoice(ctx)
	return s, nil
}

// resolveWorkspace is workspace made absolute, checked to be a directory,
// and with symlinks in its own path resolved (the caller's choice), once,
// so that every later containment check is exact.
func resolveWorkspace(workspace string) (string, error) {
	abs, err := filepath.Abs(workspace)
	if err != nil {
		return "", fmt.Errorf("sandbox: workspace %q: %w", workspace, err)
	}
	if fi, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("sandbox: workspace: %w", err)
	} else if !fi.IsDir() {
		return "", fmt.Errorf("sandbox: workspace %s is not a directory", abs)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return "", fmt.Errorf("sandbox: workspace: %w", err)
	}
	return abs, nil
}

// newScrubber redacts the configured secrets (by value, or by name and
// value) and the secrets the egress proxy injects, which the sandbox
// itself never sees but a reply could echo.
func newScrubber(given []secrets.Secret, inject []egress.Injection) (*secrets.Scrubber, error) {
	values := make([]string, 0, len(given))
	named := injectedSecrets(inject)
	for _, sec := range given {
		if sec.Name != "" {
			named = append(named, sec)
		} else {
			values = append(values, sec.Value)
		}
	}
	sc, err := secrets.New(values, secrets.WithSecrets(named...))
	if err != nil {
		return nil, fmt.Errorf("sandbox: secrets: %w", err)
	}
	return sc, nil
}

// openAudit sets the sandbox's audit log: the one given with
// WithAuditLogger, or the file (WithAuditPath, by default
// .pulse/audit.jsonl in the workspace) opened with the sandbox's
// scrubber, session and the workspace's audit key.
func (s *Sandbox) openAudit(ctx context.Context) error {
	o := &s.o
	if o.auditLogger != nil {
		s.audit = o.auditLogger
		return nil
	}
	path := o.auditPath
	if path == "" {
		path = filepath.Join(s.workspace, pathguard.ReservedDir, "audit.jsonl")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("sandbox: audit log directory: %w", err)
	}
	key, err := auditKeyFor(s.workspace, o.getenv)
	if err != nil {
		return err
	}
	s.audit, err = audit.Open(ctx, path, audit.WithScrubber(s.scrubber), audit.WithSessionID(o.sessionID), audit.WithLogger(o.logger),
		audit.WithKey(key))
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	s.ownsAudit = true
	return nil
}

// recordChoice audits the backend chosen, with the ones passed over and
// why, and warns where the choice runs commands off what was asked: a
// configured remote not used, or the unsafe host.
func (s *Sandbox) recordChoice(ctx context.Context) {
	ev := audit.Event{Action: "sandbox-init", Target: s.backend.Name(), Decision: "allow",
		IsolationLevel: string(s.caps.Isolation), Backend: s.backend.Name(),
		Detail: fmt.Sprintf("backend %s selected", s.backend.Name())}
	if len(s.passedOver) > 0 {
		ev.Detail += "; passed over: " + strings.Join(s.passedOver, "; ")
	}
	if s.remoteConfigured() && s.backend.Name() != "remote" {
		// A configured remote is a request to keep commands off this
		// machine: falling back to a local engine is allowed (as the
		// Python agent does), but never quietly.
		s.log.Warn("PULSE_REMOTE_URL is set but the remote backend is unavailable; running locally",
			"backend", s.backend.Name(), "why", strings.Join(s.passedOver, "; "))
	}
	if s.caps.Isolation == backend.IsolationHostUnsafe {
		ev.Reason = "UNSAFE_HOST"
		ev.Detail = "WARNING: UNSAFE_HOST: commands run unisolated on the host, in the workspace itself"
		s.log.Warn("UNSAFE_HOST: commands run unisolated on the host", "workspace", s.workspace)
	}
	s.record(ctx, ev)
}

// chooseBackend sets the sandbox's backend: the one given with
// WithBackend, or the first available candidate (which it then owns). It
// returns why none was available, scrubbed, for New to audit once the
// log is open. With a backend it starts ahead, for a one-command
// sandbox, what the command will run in, and reconciles it.
func (s *Sandbox) chooseBackend(ctx context.Context, o *options, early *ahead) error {
	if o.backend != nil {
		s.backend = o.backend
	} else {
		var err error
		s.backend, s.passedOver, err = selectBackend(ctx, o, early)
		// A reason may quote configuration (a URL, an engine's answer):
		// it is scrubbed like everything else the sandbox hands back.
		s.passedOver = s.scrubAll(s.passedOver)
		var ue *UnavailableError
		if errors.As(err, &ue) {
			ue.Tried = s.scrubAll(ue.Tried)
		}
		if err != nil {
			return err
		}
		s.ownsBE = true
		// A backend whose driver applies the limits to the whole box
		// (Docker: the container's memory, cpu and pids, set from o.limits
		// when it was opened) takes no command's own.
		s.wholeLimits = s.driver(s.backend.Name()).BoxLimits
	}
	s.caps = s.backend.Capabilities()
	if err := o.checkIsolation(s.backend.Name(), s.caps); err != nil {
		if s.ownsBE {
			_ = s.backend.Close()
		}
		s.backend = nil
		return err
	}
	if a, ok := s.backend.(startAheader); ok && o.noPrestart && s.ownsBE {
		// A sandbox for one command (a CLI process): what the backend
		// starts for it now starts while the rest of New and Execute's
		// admission run, instead of after them. A command that brings
		// limits of its own may not use it (the backend then starts
		// another). It starts before Reconcile, which then runs beside
		// it: Reconcile leaves alone what live executions use, this
		// process's included (backend.Backend), and the init's start is
		// what a CLI command waits for longest.
		net, _ := s.effectivePolicies()
		a.StartAhead(net, s.o.limits.WithDefaults())
	}
	if err := s.backend.Reconcile(ctx); err != nil {
		s.log.Warn("backend reconcile failed", "backend", s.backend.Name(), "err", err)
	}
	return nil
}

// startAheader is a backend that can start, ahead of the first Exec, what
// that Exec will run in (namespace.Backend.StartAhead).
type startAheader interface {
	StartAhead(policy.NetworkPolicy, policy.ResourceLimits)
}

// buildOptions applies opts and fills in the defaults.
func buildOptions(opts []Option) (options, error) {
	o := options{getenv: os.Getenv}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	if o.policy == nil {
		o.policy = policy.Default()
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.sessionID == "" {
		o.sessionID = randomID()
	}
	return o, nil
}

// PassedOver says, one "name: reason" line each, why the backends tried
// before the chosen one were not used — for example why a configured
// remote server was not reached. It is empty when WithBackend was given.
func (s *Sandbox) PassedOver() []string { return append([]string(nil), s.passedOver...) }

// remoteConfigured reports whether PULSE_REMOTE_URL asked for the remote
// backend.
func (s *Sandbox) remoteConfigured() bool {
	return strings.TrimSpace(s.o.getenv("PULSE_REMOTE_URL")) != ""
}

// Workspace is the absolute path of the sandbox's workspace.
func (s *Sandbox) Workspace() string { return s.workspace }

// Backend returns the backend the sandbox runs commands on.
func (s *Sandbox) Backend() backend.Backend { return s.backend }

// Capabilities returns what the sandbox's backend enforces.
func (s *Sandbox) Capabilities() backend.Capabilities { return s.caps }

// AuditPath is the file audit events go to.
func (s *Sandbox) AuditPath() string { return s.audit.Path() }

// ReadFile reads a file of the workspace (or of an external read root)
// after the policy allows the read action on it, as the next command
// would see it: through the pending stack (ReadCommittedFile reads the
// workspace alone). The read is TOCTOU-safe and size-limited, and
// configured secrets are redacted from the bytes returned.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	data, err := s.readFile(ctx, path, false)
	return data, s.scrubErr(err)
}

// ReadCommittedFile reads path as the workspace has it on disk, without
// the pending stack, under the same checks as ReadFile.
func (s *Sandbox) ReadCommittedFile(ctx context.Context, path string) ([]byte, error) {
	data, err := s.readFile(ctx, path, true)
	return data, s.scrubErr(err)
}

func (s *Sandbox) readFile(ctx context.Context, path string, committed bool) ([]byte, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.running.Done()
	// The policy sees the path as the caller spelled it (cleaned, relative
	// to the workspace) and as it resolves through symlinks, and both must
	// be allowed: neither an absolute spelling nor a link can walk past a
	// rule.
	targets := []string{path}
	if rel, err := s.workspaceRel(path); err == nil {
		targets[0] = rel
	}
	if t, err := s.resolvedReadTarget(path); err == nil {
		targets = append(targets, t)
	}
	for _, t := range targets {
		if _, err := s.decide(ctx, policy.Read, t, ""); err != nil {
			return nil, err
		}
	}
	if !committed {
		// Through the pending stack first: what the next command sees.
		if data, ok, err := s.readPending(ctx, targets[0]); ok {
			if err != nil {
				s.record(ctx, audit.Event{Action: "read", Target: path, Decision: "deny", Detail: err.Error()})
				return nil, fmt.Errorf("sandbox: read: %w", err)
			}
			s.record(ctx, audit.Event{Action: "read", Target: path, Decision: "allow", Detail: "through the pending stack"})
			return s.scrubber.RedactBytes(data), nil
		}
	}
	data, err := s.guard.ReadFile(path)
	if err != nil {
		s.record(ctx, audit.Event{Action: "read", Target: path, Decision: "deny", Detail: err.Error()})
		return nil, fmt.Errorf("sandbox: read: %w", err)
	}
	s.record(ctx, audit.Event{Action: "read", Target: path, Decision: "allow"})
	return s.scrubber.RedactBytes(data), nil
}

// resolvedReadTarget is path as the read policy sees it once resolved
// through the workspace's symlinks: relative to the workspace, or
// absolute when it resolves outside it.
func (s *Sandbox) resolvedReadTarget(path string) (string, error) {
	abs, err := s.guard.Resolve(path)
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(s.workspace, abs); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return filepath.ToSlash(rel), nil
	}
	return abs, nil
}

// Close stops forwarding exposed ports, kills the processes still
// running (their writes are staged as usual), waits for running calls to
// return, then closes the backend (when the sandbox chose it), the
// copy-on-write state and the audit log. Pending transactions stay on
// disk for review. Close is idempotent.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.closeExposed()
	s.killProcesses()
	s.running.Wait()
	s.closeLogs()
	return s.release()
}

func (s *Sandbox) release() error {
	var errs []error
	if s.cow != nil {
		errs = append(errs, s.cow.Close())
	}
	errs = append(errs, s.releaseShared())
	return errors.Join(errs...)
}

// enter registers a call in flight, refusing after Close.
func (s *Sandbox) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	s.running.Add(1)
	return nil
}

// decide evaluates the policy for a on target. Ask goes to the Approver
// when there is one. Without one, Ask lets an action whose effects are
// staged anyway (write, delete, shell, git) proceed with review set: its
// transaction is held for a person and never auto-committed; any other
// action is refused, because its effect would be immediate. Refusals are
// audited.
func (s *Sandbox) decide(ctx context.Context, a policy.Action, target, execID string) (review bool, err error) {
	deny := func(detail string) error {
		s.record(ctx, audit.Event{ExecutionID: execID, Action: string(a), Target: target, Decision: "deny", Detail: detail})
		if detail == "denied by policy" {
			return fmt.Errorf("%w: %s %q", ErrPolicyDenied, a, target) // the class says it all
		}
		return fmt.Errorf("%w: %s %q: %s", ErrPolicyDenied, a, target, detail)
	}
	switch s.o.policy.Evaluate(a, target) {
	case policy.Allow:
		return false, nil
	case policy.Ask:
		if s.o.approver != nil {
			ok, err := s.o.approver(ctx, a, target)
			if err != nil {
				return false, deny("approval failed: " + err.Error())
			}
			if !ok {
				return false, deny("policy asks and the approver refused")
			}
			return false, nil
		}
		if stagedAction(a) {
			return true, nil
		}
		return false, deny("policy asks and no approver is configured")
	default:
		return false, deny("denied by policy")
	}
}

// stagedAction reports whether a's effects on the workspace go through a
// copy-on-write transaction, so that a person can still review them.
func stagedAction(a policy.Action) bool {
	switch a {
	case policy.Write, policy.Delete, policy.Shell, policy.Git:
		return true
	}
	return false
}

// record writes an audit event. Its error is returned for the events a
// command must not run without (Execute fails closed on them); elsewhere
// it is also reported to the operational logger.
func (s *Sandbox) record(ctx context.Context, e audit.Event) error {
	if s.audit == nil {
		return nil
	}
	if err := s.audit.Record(context.WithoutCancel(ctx), e); err != nil {
		s.log.Error("audit record failed", "action", e.Action, "err", err)
		return fmt.Errorf("sandbox: audit: %w", err)
	}
	return nil
}

// recordBatch writes events as one append (one lock, one write), in order.
// As with record, they are written even when ctx has ended, and a failure
// is reported to the operational logger: by then the work they describe
// is done.
func (s *Sandbox) recordBatch(ctx context.Context, what string, events []audit.Event) {
	if s.audit == nil || len(events) == 0 {
		return
	}
	if err := s.audit.RecordBatch(context.WithoutCancel(ctx), events); err != nil {
		s.log.Error("audit record failed", "action", what, "events", len(events), "err", err)
	}
}

func randomID() string {
	return randhex.String(12)
}

// driver is the registered driver of the backend named name (the zero
// Driver when none is).
func (s *Sandbox) driver(name string) backend.Driver {
	for _, d := range candidates() {
		if d.Name == name {
			return d
		}
	}
	return backend.Driver{}
}
