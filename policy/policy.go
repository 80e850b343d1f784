package policy

import (
	"fmt"
	"github.com/pulse-agent/pulse/errdefs"
	"path"
	"strings"
)

// ErrInvalid is wrapped by every error about a malformed action, decision,
// glob, rule, network policy, resource limit or policy file.
var ErrInvalid = errdefs.New("invalid policy", errdefs.ErrInvalidArgument)

// Action is a kind of thing an agent asks to do.
type Action string

// The actions. Their string forms are the names used in policy files and
// audit events.
const (
	Read    Action = "read"
	Write   Action = "write"
	Delete  Action = "delete"
	Shell   Action = "shell"
	Git     Action = "git"
	Network Action = "network"
	Secrets Action = "secrets"
)

// Actions lists every action, in a stable order.
func Actions() []Action {
	return []Action{Read, Write, Delete, Shell, Git, Network, Secrets}
}

// String returns the action's name.
func (a Action) String() string { return string(a) }

// Valid reports whether a is one of the seven actions.
func (a Action) Valid() bool {
	switch a {
	case Read, Write, Delete, Shell, Git, Network, Secrets:
		return true
	}
	return false
}

// ParseAction returns the action named s (exact, lower case).
func ParseAction(s string) (Action, error) {
	if a := Action(s); a.Valid() {
		return a, nil
	}
	return "", fmt.Errorf("%w: unknown action %q (want one of read, write, delete, shell, git, network, secrets)", ErrInvalid, s)
}

// UnmarshalText makes decoding strict: unknown names are errors.
func (a *Action) UnmarshalText(b []byte) error {
	v, err := ParseAction(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Decision is what a policy says about one action on one target.
type Decision string

// The decisions.
const (
	// Allow: go ahead.
	Allow Decision = "allow"
	// Deny: refuse, and audit the refusal.
	Deny Decision = "deny"
	// Ask: go ahead only into review. Writes and deletions are staged in a
	// pending transaction that a person (or a rule) approves; callers that
	// cannot stage treat Ask as needing approval before acting.
	Ask Decision = "ask"
)

// String returns the decision's name.
func (d Decision) String() string { return string(d) }

// Valid reports whether d is one of the three decisions.
func (d Decision) Valid() bool { return d == Allow || d == Deny || d == Ask }

// ParseDecision returns the decision named s (exact, lower case).
func ParseDecision(s string) (Decision, error) {
	if d := Decision(s); d.Valid() {
		return d, nil
	}
	return "", fmt.Errorf("%w: unknown decision %q (want allow, deny or ask)", ErrInvalid, s)
}

// UnmarshalText makes decoding strict: unknown names are errors.
func (d *Decision) UnmarshalText(b []byte) error {
	v, err := ParseDecision(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// Rule decides Action on the targets that match Target.
//
// Target is a glob in the style of shell fnmatch, so that one language
// serves paths, command lines and host names alike: "*" matches any run of
// characters (including "/" and spaces), "?" any one character, "[abc]",
// "[a-z]" and "[!abc]" (or "[^abc]") one character of (or not of) a set, and "\" quotes
// the next character. "*" alone matches every target.
type Rule struct {
	Action   Action   `json:"action" yaml:"action"`
	Target   string   `json:"target" yaml:"target"`
	Decision Decision `json:"decision" yaml:"decision"`
}

// Validate reports a malformed rule with an error wrapping ErrInvalid.
func (r Rule) Validate() error {
	if !r.Action.Valid() {
		return fmt.Errorf("%w: unknown action %q", ErrInvalid, string(r.Action))
	}
	if !r.Decision.Valid() {
		return fmt.Errorf("%w: unknown decision %q", ErrInvalid, string(r.Decision))
	}
	if err := ValidGlob(r.Target); err != nil {
		return err
	}
	return nil
}

// Policy is an ordered rule list plus a default decision per action. The
// first rule whose action and target match decides; when none does, the
// action's default decides. A Policy is not modified by its methods, so it
// is safe for concurrent use as long as no one changes its fields.
type Policy struct {
	Rules    []Rule              `json:"rules,omitempty" yaml:"rules,omitempty"`
	Defaults map[Action]Decision `json:"defaults,omitempty" yaml:"defaults,omitempty"`
	// Network is the network policy the file asks for; nil means unset, and
	// the caller resolves it (the facade picks deny-all unless the Network
	// action is allowed).
	Network *NetworkPolicy `json:"network,omitempty" yaml:"network,omitempty"`
	// Limits are the resource limits the file asks for; zero fields take
	// the backend's defaults (see ResourceLimits).
	Limits ResourceLimits `json:"limits,omitzero" yaml:"limits,omitempty"`
	// Inject binds secrets to hosts (the file's secrets.inject): the
	// command sees a placeholder, and the egress proxy puts the real value
	// into request headers bound for those hosts only.
	Inject []SecretInjection `json:"inject,omitempty" yaml:"inject,omitempty"`
	// Image is the container image commands run in on the Docker backend
	// (the file's image:); empty means the backend's default. Other
	// backends have no image and ignore it.
	Image string `json:"image,omitempty" yaml:"image,omitempty"`
	// Caches are the persistent directories mounted read-write into
	// every command (the file's caches:); see Cache.
	Caches []Cache `json:"caches,omitempty" yaml:"caches,omitempty"`
	// GroupWrite lets what a command writes keep group write permission
	// when committed (a repository a group shares, umask 002). Without
	// it, a commit gives group or other write only where the workspace
	// entry already had it; other write never (the file's group_write:).
	GroupWrite bool `json:"group_write,omitempty" yaml:"group_write,omitempty"`
	// Isolation is the least isolation every command must run under (the
	// file's isolation:): IsolationStrong, or "" for whatever backend
	// selection finds. The sandbox refuses to run under less, never
	// downgrades it.
	Isolation IsolationLevel `json:"isolation,omitempty" yaml:"isolation,omitempty"`
}

// IsolationLevel is a policy's isolation: requirement.
type IsolationLevel string

// IsolationStrong asks that a command's system calls never reach the
// host kernel directly: a user-space kernel (gVisor) serves them. The
// namespace, Docker and host backends share the host kernel and do not
// meet it.
const IsolationStrong IsolationLevel = "strong"

// Default returns the built-in policy: reads and shell commands allowed,
// writes and deletions staged for review (Ask), git operations staged for
// review (Ask), network and secrets denied. It has no rules.
func Default() *Policy {
	return &Policy{Defaults: map[Action]Decision{
		Read:    Allow,
		Write:   Ask,
		Delete:  Ask,
		Shell:   Allow,
		Git:     Ask,
		Network: Deny,
		Secrets: Deny,
	}}
}

// Evaluate returns the decision for action a on target. It fails closed:
// an unknown action, a missing default or a rule with a malformed glob
// (reached before any match) yields Deny. Targets of Read, Write and Delete
// are paths and are cleaned first ("./a//b" is "a/b").
func (p *Policy) Evaluate(a Action, target string) Decision {
	if p == nil || !a.Valid() {
		return Deny
	}
	if a == Read || a == Write || a == Delete {
		target = cleanTarget(target)
	}
	for _, r := range p.Rules {
		if r.Action != a {
			continue
		}
		ok, err := matchGlob(r.Target, target)
		if err != nil || !r.Decision.Valid() {
			return Deny
		}
		if ok {
			return r.Decision
		}
	}
	if d, ok := p.Defaults[a]; ok && d.Valid() {
		return d
	}
	return Deny
}

// Allowed reports whether a is allowed whatever the target: its default is
// Allow and no rule for a says Deny or Ask. The facade uses it to decide
// whether network access and secrets may be granted at all.
func (p *Policy) Allowed(a Action) bool {
	if p == nil || !a.Valid() || p.Defaults[a] != Allow {
		return false
	}
	for _, r := range p.Rules {
		if r.Action == a && r.Decision != Allow {
			return false
		}
	}
	return true
}

// Validate reports the first malformed part of p with an error wrapping
// ErrInvalid that names it.
func (p *Policy) Validate() error {
	if p == nil {
		return fmt.Errorf("%w: nil policy", ErrInvalid)
	}
	for a, d := range p.Defaults {
		if !a.Valid() {
			return fmt.Errorf("defaults: %w: unknown action %q", ErrInvalid, string(a))
		}
		if !d.Valid() {
			return fmt.Errorf("defaults.%s: %w: unknown decision %q", a, ErrInvalid, string(d))
		}
	}
	for i, r := range p.Rules {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("rules[%d]: %w", i, err)
		}
	}
	if p.Network != nil {
		if err := p.Network.Validate(); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	if err := p.Limits.Validate(); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if err := ValidateCaches(p.Caches); err != nil {
		return fmt.Errorf("caches: %w", err)
	}
	for i, in := range p.Inject {
		if err := in.Validate(); err != nil {
			return fmt.Errorf("secrets.inject[%d]: %w", i, err)
		}
	}
	return nil
}

func cleanTarget(t string) string {
	if t == "" {
		return t
	}
	t = strings.ReplaceAll(t, "\\", "/")
	c := path.Clean(t)
	return strings.TrimPrefix(c, "./")
}

// ValidGlob reports whether pattern is a well-formed Rule target glob.
func ValidGlob(pattern string) error {
	if pattern == "" {
		return fmt.Errorf("%w: empty target glob", ErrInvalid)
	}
	if strings.IndexByte(pattern, 0) >= 0 {
		return fmt.Errorf("%w: NUL byte in target glob", ErrInvalid)
	}
	_, err := matchGlob(pattern, "")
	return err
}

// matchGlob reports whether name matches pattern. It checks the whole
// pattern, so a malformed pattern is an error whatever name is. Stars are
// handled by remembering the last one and retrying from it, which keeps
// matching linear in practice and free of exponential backtracking.
func matchGlob(pattern, name string) (bool, error) {
	if err := scanGlob(pattern); err != nil {
		return false, err
	}
	px, nx := 0, 0
	starPx, starNx := -1, -1
	for nx < len(name) || px < len(pattern) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				starPx, starNx = px, nx
				px++
				continue
			case '?':
				if nx < len(name) {
					px++
					nx++
					continue
				}
			case '[':
				if nx < len(name) {
					ok, end := matchClass(pattern, px, name[nx])
					if ok {
						px = end
						nx++
						continue
					}
				}
			case '\\':
				if nx < len(name) && name[nx] == pattern[px+1] {
					px += 2
					nx++
					continue
				}
			default:
				if nx < len(name) && name[nx] == c {
					px++
					nx++
					continue
				}
			}
		}
		if starPx >= 0 && starNx < len(name) {
			starNx++
			px, nx = starPx+1, starNx
			continue
		}
		return false, nil
	}
	return true, nil
}

// scanGlob checks that every class is closed and no escape dangles.
func scanGlob(pattern string) error {
	for i := 0; i < len(pattern); i++ {
		switch pattern[i] {
		case '\\':
			if i+1 >= len(pattern) {
				return fmt.Errorf("%w: glob %q ends with a lone backslash", ErrInvalid, pattern)
			}
			i++
		case '[':
			end, err := classEnd(pattern, i)
			if err != nil {
				return err
			}
			i = end - 1
		}
	}
	return nil
}

// classEnd returns the index just past the class that starts at pattern[i].
func classEnd(pattern string, i int) (int, error) {
	j := i + 1
	if j < len(pattern) && (pattern[j] == '!' || pattern[j] == '^') {
		j++
	}
	first := true
	for ; j < len(pattern); j++ {
		c := pattern[j]
		if c == ']' && !first {
			return j + 1, nil
		}
		first = false
		if c == '\\' {
			j++
			if j >= len(pattern) {
				break
			}
			c = pattern[j]
		}
		if j+2 < len(pattern) && pattern[j+1] == '-' && pattern[j+2] != ']' {
			lo := c
			j += 2
			hi := pattern[j]
			if hi == '\\' {
				j++
				if j >= len(pattern) {
					break
				}
				hi = pattern[j]
			}
			if hi < lo {
				return 0, fmt.Errorf("%w: glob %q has a reversed range %c-%c", ErrInvalid, pattern, lo, hi)
			}
		}
	}
	return 0, fmt.Errorf("%w: glob %q has an unclosed [", ErrInvalid, pattern)
}

// matchClass matches c against the (well-formed) class at pattern[i] and
// returns whether it matched and the index just past the class.
func matchClass(pattern string, i int, c byte) (bool, int) {
	end, _ := classEnd(pattern, i)
	j := i + 1
	negate := false
	if pattern[j] == '!' || pattern[j] == '^' {
		negate = true
		j++
	}
	matched := false
	for j < end-1 {
		lo := pattern[j]
		if lo == '\\' {
			j++
			lo = pattern[j]
		}
		j++
		hi := lo
		if j+1 < end-1 && pattern[j] == '-' {
			hi = pattern[j+1]
			j += 2
			if hi == '\\' {
				hi = pattern[j]
				j++
			}
		}
		if lo <= c && c <= hi {
			matched = true
		}
	}
	return matched != negate, end
}
