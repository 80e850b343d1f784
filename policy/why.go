package policy

import "fmt"

// WhyNotAllowed says what keeps action a from being allowed for every
// target, in the words of a policy file: "defaults.network: deny", or
// the first rule for a that is not allow. It returns "" when Allowed(a).
func (p *Policy) WhyNotAllowed(a Action) string {
	if p.Allowed(a) {
		return ""
	}
	if p == nil || !a.Valid() {
		return fmt.Sprintf("unknown action %q", string(a))
	}
	d, ok := p.Defaults[a]
	switch {
	case !ok:
		return fmt.Sprintf("defaults.%s is not set (deny)", a)
	case d != Allow:
		return fmt.Sprintf("defaults.%s: %s", a, d)
	}
	for i, r := range p.Rules {
		if r.Action == a && r.Decision != Allow {
			return fmt.Sprintf("rules[%d] (action %s, target %q) decides %s", i, a, r.Target, r.Decision)
		}
	}
	return ""
}
