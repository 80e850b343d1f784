package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Option configures a Sandbox.
type Option func(*options) error

// Approver decides an action the policy marks Ask. It returns true to
// allow. Without an Approver, Ask is treated as Deny: nothing runs on an
// unanswered question.
type Approver func(ctx context.Context, a policy.Action, target string) (bool, error)

type options struct {
	policy        *policy.Policy
	network       *policy.NetworkPolicy
	secretPolicy  *secrets.Policy
	secrets       []secrets.Secret
	limits        *policy.ResourceLimits
	backend       backend.Backend
	backendName   string
	unsafeHost    bool
	unsafeAccept  []UnsafeRule  // unsafehost.go
	noPrestart    bool          // select.go
	keepWarm      time.Duration // select.go
	fullProbe     bool          // select.go: pulse doctor probes every time
	autoCommit    bool
	auditPath     string
	auditLogger   *audit.Logger
	logger        *slog.Logger
	externalReads []string
	approver      Approver
	sessionID     string
	getenv        func(string) string
	cowOpts       []cowfs.Option   // tests: limits of the transaction store
	egress        egressOptions    // egress.go
	backendOpts   map[string][]any // select.go: WithRemoteOptions
	maxStack      int              // stack.go
	image         string           // image.go
	caches        []policy.Cache   // caches.go
}

// writeGuard is the write bits a commit never adds where the workspace
// entry had them not (cowfs.WithoutNewWriteBits): group and other, or
// other only when the policy allows group write.
func (o *options) writeGuard() os.FileMode {
	if o.policy != nil && o.policy.GroupWrite {
		return 0o002
	}
	return 0o022
}

// WithPolicy sets the action policy. The default is policy.Default():
// reads allowed, writes staged, shell allowed, network and secrets denied.
func WithPolicy(p *policy.Policy) Option {
	return func(o *options) error {
		if p == nil {
			return errors.New("sandbox: WithPolicy(nil)")
		}
		if err := p.Validate(); err != nil {
			return fmt.Errorf("sandbox: WithPolicy: %w", err)
		}
		o.policy = p
		return nil
	}
}

// WithNetworkPolicy sets the network a command may reach when the policy
// allows the network action. Unset, commands get no network (deny-all),
// except on the unsafe host backend, which cannot restrict it.
func WithNetworkPolicy(n policy.NetworkPolicy) Option {
	return func(o *options) error {
		if err := n.Validate(); err != nil {
			return fmt.Errorf("sandbox: WithNetworkPolicy: %w", err)
		}
		o.network = &n
		return nil
	}
}

// WithSecretPolicy sets which of the configured secrets a command may see
// in its environment when the policy allows the secrets action. Unset,
// commands see none.
func WithSecretPolicy(p secrets.Policy) Option {
	return func(o *options) error {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("sandbox: WithSecretPolicy: %w", err)
		}
		o.secretPolicy = &p
		return nil
	}
}

// WithSecrets adds secrets: each value is scrubbed from command output,
// file reads and audit events, and staged content containing one is
// refused. A named secret is also passed to commands as an environment
// variable of that name when the secret policy allows it. Values shorter
// than secrets.MinSecretLen are refused by New.
func WithSecrets(list []secrets.Secret) Option {
	return func(o *options) error {
		o.secrets = append(o.secrets, list...)
		return nil
	}
}

// WithLimits tightens the policy's resource limits for every command:
// each field set is used when it is no larger than the policy's (with
// defaults filled in, see policy.ResourceLimits); a zero field keeps the
// policy's. A field above the policy's makes New fail with
// ErrLimitExceeded.
func WithLimits(l policy.ResourceLimits) Option {
	return func(o *options) error {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("sandbox: WithLimits: %w", err)
		}
		o.limits = &l
		return nil
	}
}

// WithBackend uses b instead of choosing one. The Sandbox does not close
// a backend it was given, and does not probe it.
func WithBackend(b backend.Backend) Option {
	return func(o *options) error {
		if b == nil {
			return errors.New("sandbox: WithBackend(nil)")
		}
		o.backend = b
		return nil
	}
}

// WithBackendName restricts selection to one backend by name ("remote",
// "docker", "namespace", "gvisor", "host"); "auto" or "" keeps the
// default order. Naming "host" still requires WithUnsafeHostExecution.
func WithBackendName(name string) Option {
	return func(o *options) error {
		switch name {
		case "", "auto", "remote", "docker", "namespace", "gvisor", "host":
			o.backendName = name
			return nil
		}
		return fmt.Errorf("sandbox: unknown backend %q (want auto, remote, docker, namespace, gvisor or host)", name)
	}
}

// WithUnsafeHostExecution allows the host backend: commands then run
// unisolated, in the workspace itself. It is chosen only when no isolating
// backend is available (or when named), and it is logged as UNSAFE_HOST.
//
// The opt-in is consent to running unisolated, not to dropping rules: a
// command whose policy asks for what the host cannot enforce — a network
// deny-all or allowlist, a secrets deny-all or allowlist, hidden paths,
// memory, cpu or pids limits — is refused with ErrHostCannotEnforce,
// unless that rule is named here too, as in
//
//	sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets)
//
// Each rule accepted that way is audited (UNSAFE_HOST) for every command
// it applies to. A policy that allows the network and secrets needs no
// rule named: the host enforces allow-all. Options given more than once
// add up.
func WithUnsafeHostExecution(accept ...UnsafeRule) Option {
	return func(o *options) error {
		for _, r := range accept {
			if !r.valid() {
				return fmt.Errorf("sandbox: WithUnsafeHostExecution: unknown rule %q (want %s)", r, joinRules(UnsafeRules()))
			}
			if !slices.Contains(o.unsafeAccept, r) {
				o.unsafeAccept = append(o.unsafeAccept, r)
			}
		}
		o.unsafeHost = true
		return nil
	}
}

// WithAutoCommit commits each command's writes at once. Conflicts are
// reported in Result.CommitErr and the transaction is kept pending; a
// file someone else changed is never overwritten.
func WithAutoCommit() Option {
	return func(o *options) error { o.autoCommit = true; return nil }
}

// WithAuditLog writes the audit log to path (default:
// <workspace>/.pulse/audit.jsonl).
func WithAuditLog(path string) Option {
	return func(o *options) error { o.auditPath = path; return nil }
}

// WithAuditLogger records to an audit logger the caller owns (and
// closes). Its scrubber, if any, is the caller's to configure.
func WithAuditLogger(l *audit.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("sandbox: WithAuditLogger(nil)")
		}
		o.auditLogger = l
		return nil
	}
}

// WithLogger sets the operational logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("sandbox: WithLogger(nil)")
		}
		o.logger = l
		return nil
	}
}

// WithExternalReads lets ReadFile read (never write) under these
// directories outside the workspace.
func WithExternalReads(dirs ...string) Option {
	return func(o *options) error { o.externalReads = append(o.externalReads, dirs...); return nil }
}

// WithApprover answers the policy's Ask decisions.
func WithApprover(a Approver) Option {
	return func(o *options) error { o.approver = a; return nil }
}

// WithSessionID sets the session id written to every audit event
// (default: random).
func WithSessionID(id string) Option {
	return func(o *options) error {
		if id == "" {
			return errors.New("sandbox: empty session id")
		}
		o.sessionID = id
		return nil
	}
}

// withGetenv replaces os.Getenv for backend selection (tests).
func withGetenv(f func(string) string) Option {
	return func(o *options) error { o.getenv = f; return nil }
}

// withCOWOptions passes options to the workspace's cowfs store (tests:
// its size limits).
func withCOWOptions(opts ...cowfs.Option) Option {
	return func(o *options) error { o.cowOpts = append(o.cowOpts, opts...); return nil }
}

// WithRemoteOptions passes options to the remote backend when selection
// builds it from PULSE_REMOTE_URL (for example remote.WithWorkspaceLimits,
// to upload a larger workspace to a server that accepts one). Each must be
// a remote.Option: the facade links no backend, so the type is checked
// when the backend is opened, and New fails on one of another type. They
// do not apply to a backend given with WithBackend.
func WithRemoteOptions(opts ...any) Option {
	return WithBackendOptions("remote", opts...)
}

// WithBackendOptions passes options, of the named backend package's own
// Option type (namespace.Option, docker.Option, ...), to that backend when
// selection opens it (backend.Config.Options). New fails on an option of
// another type. They do not apply to a backend given with WithBackend.
func WithBackendOptions(name string, opts ...any) Option {
	return func(o *options) error {
		if o.backendOpts == nil {
			o.backendOpts = map[string][]any{}
		}
		o.backendOpts[name] = append(o.backendOpts[name], opts...)
		return nil
	}
}
