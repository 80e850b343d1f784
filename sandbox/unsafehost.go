package sandbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// UnsafeRule names a kind of rule the host backend cannot enforce, which
// a caller of WithUnsafeHostExecution may accept going unenforced. The
// opt-in alone is consent to running unisolated, in the workspace itself;
// it is not consent to dropping a rule. A policy that asks for what the
// host cannot do is refused (ErrHostCannotEnforce) unless its rule is
// named too.
type UnsafeRule string

const (
	// UnsafeNetwork accepts that a network deny-all or allowlist is not
	// enforced: the command has the host's network, all of it.
	UnsafeNetwork UnsafeRule = "network"
	// UnsafeSecrets accepts that a secrets deny-all or allowlist holds
	// only for the environment (which the host backend builds from
	// scratch): the command can still read every secret on the disk.
	UnsafeSecrets UnsafeRule = "secrets"
	// UnsafeReads accepts that paths the read policy denies are not
	// hidden: the command can read them.
	UnsafeReads UnsafeRule = "reads"
	// UnsafeLimits accepts that resource limits the host backend cannot
	// apply (memory, cpus, pids) are not applied.
	UnsafeLimits UnsafeRule = "limits"
)

// UnsafeRules lists every UnsafeRule, in the order the checks meet them.
func UnsafeRules() []UnsafeRule {
	return []UnsafeRule{UnsafeNetwork, UnsafeSecrets, UnsafeReads, UnsafeLimits}
}

func (r UnsafeRule) valid() bool { return slices.Contains(UnsafeRules(), r) }

// ParseUnsafeRules reads a comma-separated list of rule names ("network,
// secrets"), as `pulse exec --unsafe-host=network,secrets` takes it. An
// empty string is no rule.
func ParseUnsafeRules(s string) ([]UnsafeRule, error) {
	var out []UnsafeRule
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		r := UnsafeRule(f)
		if !r.valid() {
			return nil, fmt.Errorf("sandbox: unknown unsafe host rule %q (want %s)", f, joinRules(UnsafeRules()))
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

func joinRules(rs []UnsafeRule) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ",")
}

// ErrHostCannotEnforce: the command runs on the unsafe host backend and
// its policy asks for something the host cannot enforce, which the caller
// did not accept by name (WithUnsafeHostExecution(UnsafeNetwork, ...)).
// The command was refused before anything started. Errors that match it
// match ErrUnsupportedPolicy too; a *HostRuleError says which rule.
var ErrHostCannotEnforce = errors.New("sandbox: the unsafe host backend cannot enforce the policy")

// HostRuleError is the refusal of rules the host backend cannot enforce
// and the caller did not accept.
type HostRuleError struct {
	// Rules are what the caller would have to accept for the command to
	// run, each once.
	Rules []UnsafeRule
	// Unenforced says, for each, what the host would not enforce and
	// what running anyway would mean.
	Unenforced []string
	// Accepted are the rules the caller accepted already. The way out
	// the error names is those and Rules together: naming Rules alone
	// would refuse the command again for the ones accepted now.
	Accepted []UnsafeRule
}

// add records that rule goes unenforced: what (the rule as the policy
// has it), at level, with that consequence.
func (e *HostRuleError) add(rule UnsafeRule, what string, level policy.EnforcementLevel, consequence string) {
	if !slices.Contains(e.Rules, rule) {
		e.Rules = append(e.Rules, rule)
	}
	e.Unenforced = append(e.Unenforced, fmt.Sprintf("%s (%s: %s)", what, level, consequence))
}

// err is e, or nil when nothing went unenforced.
func (e *HostRuleError) err() error {
	if len(e.Rules) == 0 {
		return nil
	}
	return e
}

func (e *HostRuleError) Error() string {
	var all []UnsafeRule
	for _, r := range UnsafeRules() {
		if slices.Contains(e.Rules, r) || slices.Contains(e.Accepted, r) {
			all = append(all, r)
		}
	}
	consts := make([]string, len(all))
	for i, r := range all {
		consts[i] = "sandbox." + constName(r)
	}
	return fmt.Sprintf("sandbox: the unsafe host backend cannot enforce %s; refused. "+
		"To run anyway, accept each by name: WithUnsafeHostExecution(%s), or `pulse exec --unsafe-host=%s`",
		strings.Join(e.Unenforced, "; "), strings.Join(consts, ", "), joinRules(all))
}

// Unwrap makes the error match ErrHostCannotEnforce and, as every
// refusal of a policy a backend cannot enforce, ErrUnsupportedPolicy.
func (e *HostRuleError) Unwrap() []error { return []error{ErrHostCannotEnforce, ErrUnsupportedPolicy} }

func constName(r UnsafeRule) string {
	return "Unsafe" + strings.ToUpper(string(r[:1])) + string(r[1:])
}

// unsafeHostRun reports whether commands run on the host backend the
// caller opted into.
func (s *Sandbox) unsafeHostRun() bool {
	return s.o.unsafeHost && s.caps.Isolation == backend.IsolationHostUnsafe
}

// acceptsUnsafe reports whether the caller accepted that rule r goes
// unenforced on the unsafe host backend.
func (s *Sandbox) acceptsUnsafe(r UnsafeRule) bool {
	return s.unsafeHostRun() && slices.Contains(s.o.unsafeAccept, r)
}
