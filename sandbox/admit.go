package sandbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// The admission checks of Execute's check phase: what a command may
// reach and use, and whether the backend can hold it to that. Each refusal
// is audited before it is returned, and nothing has started yet.

// commandLimits resolves the limits one command runs under: the
// sandbox's, tightened field by field by the command's own. Asking for
// more than the policy allows is refused (audited), not quietly capped,
// so the caller learns that what it asked for is not what would run.
func (s *Sandbox) commandLimits(ctx context.Context, execID, cmdStr string, asked *policy.ResourceLimits) (policy.ResourceLimits, error) {
	limits := *s.o.limits
	if asked == nil {
		return limits, nil
	}
	if err := asked.Validate(); err != nil {
		return limits, fmt.Errorf("%w: limits: %w", ErrInvalidCommand, err)
	}
	// On an isolating backend the pids, memory and disk defaults are a
	// ceiling too: a command cannot lift itself above them, only the
	// policy can. What the command leaves unset stays unset, for the
	// backend to default.
	ceil := limits
	if s.caps.Isolation != backend.IsolationHostUnsafe {
		ceil = ceil.WithIsolationDefaults()
		ceil.DiskBytes = cmp.Or(ceil.DiskBytes, policy.DefaultDiskBytes)
	}
	l, err := ceil.Tighten(*asked)
	if err != nil {
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
			Backend: s.backend.Name(), Reason: "limit_exceeded", Detail: err.Error()})
		return limits, fmt.Errorf("sandbox: %w", err)
	}
	if asked.Pids == 0 {
		l.Pids = limits.Pids
	}
	if asked.MemoryBytes == 0 {
		l.MemoryBytes = limits.MemoryBytes
	}
	if asked.DiskBytes == 0 {
		l.DiskBytes = limits.DiskBytes
	}
	if s.wholeLimits && (l.MemoryBytes != limits.MemoryBytes || l.Pids != limits.Pids || l.CPUs != limits.CPUs || l.DiskBytes != limits.DiskBytes) {
		// Quietly running under the container's higher limits would
		// be a downgrade like any other.
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
			Backend: s.backend.Name(), Reason: "unsupported_policy",
			Detail: "memory, cpu, pids and disk limits apply to the whole container; a command cannot lower them"})
		return limits, fmt.Errorf("%w: backend %q applies memory, cpu, pids and disk limits to its whole container; a command cannot lower them (set them with WithLimits or the policy instead)",
			ErrUnsupportedPolicy, s.backend.Name())
	}
	return l, nil
}

// effectivePolicies resolves what a command may reach. A policy that
// denies the network or secrets action forces deny-all; an allowed action
// with no configured policy gets deny-all too, except on the unsafe host
// backend, which can only give everything.
func (s *Sandbox) effectivePolicies() (policy.NetworkPolicy, secrets.Policy) {
	net, _ := s.effectiveNetwork()
	unsafeHost := s.caps.Isolation == backend.IsolationHostUnsafe
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
// strongly. On the host backend chosen with WithUnsafeHostExecution a
// rule the host cannot enforce is refused too (ErrHostCannotEnforce),
// unless the caller accepted it by name (UnsafeNetwork, UnsafeSecrets,
// UnsafeLimits): then a network mode the host cannot enforce at all is
// sent as what really happens (allow-all), and each accepted downgrade is
// audited.
func (s *Sandbox) checkEnforcement(ctx context.Context, execID, cmdStr string, limits policy.ResourceLimits) (policy.NetworkPolicy, secrets.Policy, error) {
	net, sec := s.effectivePolicies()
	name := s.backend.Name()
	netLevel := s.caps.NetworkLevel(net.Mode)
	secLevel := s.caps.SecretLevel(sec.Mode)
	// The admission's events go out as one append (one lock, one write),
	// whichever way it ends, before anything of the command starts.
	var events []audit.Event
	add := func(e audit.Event) { events = append(events, e) }
	defer func() { s.recordBatch(ctx, "admission", events) }()

	decision := func(denyAll bool) string {
		if denyAll {
			return "deny"
		}
		return "allow"
	}
	add(audit.Event{ExecutionID: execID, Action: "network", Destination: "*", Protocol: "any",
		Decision: decision(net.Mode == policy.NetworkDenyAll), Backend: name,
		EnforcementLevel: string(netLevel), Detail: "network policy mode applied: " + string(net.Mode)})
	add(audit.Event{ExecutionID: execID, Action: "secrets", Target: "environment",
		Decision: decision(sec.Mode == secrets.DenyAll), Backend: name,
		EnforcementLevel: string(secLevel), Detail: "secret policy mode applied: " + string(sec.Mode)})

	// On the unsafe host every rule it cannot enforce is gathered before
	// the refusal, so that it names all the caller would have to accept.
	host := HostRuleError{Accepted: slices.Clone(s.o.unsafeAccept)}
	check := func(kind, mode string, level policy.EnforcementLevel, rule UnsafeRule, consequence string) error {
		if level == policy.Strong {
			return nil
		}
		if s.acceptsUnsafe(rule) {
			add(audit.Event{ExecutionID: execID, Action: kind, Target: cmdStr, Decision: "allow",
				IsolationLevel: string(s.caps.Isolation), Backend: name, EnforcementLevel: string(level),
				Reason: "UNSAFE_HOST",
				Detail: fmt.Sprintf("%s policy %s is %s on backend %s; accepted by the unsafe host opt-in for %s", kind, mode, level, name, rule)})
			return nil
		}
		add(audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
			IsolationLevel: string(s.caps.Isolation), Backend: name, EnforcementLevel: string(level),
			Reason: "unsupported_policy",
			Detail: fmt.Sprintf("backend cannot strongly enforce %s policy: %s", kind, mode)})
		if s.unsafeHostRun() {
			host.add(rule, kind+" policy "+mode, level, consequence)
			return nil
		}
		return fmt.Errorf("%w: backend %q enforces %s policy %q only at level %q; refused to prevent a silent downgrade",
			ErrUnsupportedPolicy, name, kind, mode, level)
	}
	if err := check("network", string(net.Mode), netLevel, UnsafeNetwork,
		"the command would reach the host's network, all of it"); err != nil {
		return net, sec, err
	}
	if err := check("secrets", string(sec.Mode), secLevel, UnsafeSecrets,
		"only the environment is withheld; the command could read any secret on the disk"); err != nil {
		return net, sec, err
	}
	if err := s.checkLimits(execID, cmdStr, limits, add, &host); err != nil {
		return net, sec, err
	}
	if err := host.err(); err != nil {
		return net, sec, err
	}
	if s.acceptsUnsafe(UnsafeNetwork) && netLevel == policy.Unsupported {
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
// enforcement is accepted and audited, and so is what the unsafe host
// opt-in accepted by name (UnsafeLimits); what it did not accept goes to
// host. Its audit events go to add.
func (s *Sandbox) checkLimits(execID, cmdStr string, l policy.ResourceLimits, add func(audit.Event), host *HostRuleError) error {
	name := s.backend.Name()
	for _, k := range policy.LimitKeys() {
		if !l.IsSet(k) {
			continue
		}
		level, listed := s.caps.Limits[k]
		switch {
		case level == policy.Strong:
			continue
		case level == policy.BestEffort || (k.Defaulted() && !listed):
			add(audit.Event{ExecutionID: execID, Action: "limits", Target: string(k), Decision: "allow",
				Backend: name, EnforcementLevel: string(policy.BestEffort),
				Detail: fmt.Sprintf("limit %s is enforced best-effort by backend %s", k, name)})
			continue
		case s.acceptsUnsafe(UnsafeLimits):
			add(audit.Event{ExecutionID: execID, Action: "limits", Target: string(k), Decision: "allow",
				Backend: name, EnforcementLevel: string(policy.Unsupported), Reason: "UNSAFE_HOST",
				Detail: fmt.Sprintf("limit %s is not enforced by backend %s; accepted by the unsafe host opt-in for limits", k, name)})
			continue
		}
		add(audit.Event{ExecutionID: execID, Action: "shell", Target: cmdStr, Decision: "deny",
			IsolationLevel: string(s.caps.Isolation), Backend: name, EnforcementLevel: string(policy.Unsupported),
			Reason: "unsupported_policy", Detail: fmt.Sprintf("backend cannot enforce limit %s", k)})
		if s.unsafeHostRun() {
			host.add(UnsafeLimits, "limit "+string(k), policy.Unsupported, "the command would run without it")
			continue
		}
		return fmt.Errorf("%w: backend %q cannot enforce the %s limit; refused to prevent a silent downgrade",
			ErrUnsupportedPolicy, name, k)
	}
	return nil
}
