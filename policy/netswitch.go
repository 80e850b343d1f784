package policy

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// netSwitch is what a policy file says about the network action itself,
// beside its network: section: the defaults.network entry and the rules
// for the network action, kept with their nodes for the error lines.
type netSwitch struct {
	def   *yaml.Node
	rules []netRule
}

type netRule struct {
	i    int
	node *yaml.Node
}

// apply settles the network action of a parsed policy file. The facade
// grants a network only when the network action is allowed (as the
// Python sandbox did: a policy that denies it forces deny-all), and the
// built-in default denies it. A file whose network: section lets
// commands out (allowlist or allow-all) would then mean deny-all unless
// it also said defaults.network: allow: a second switch that nothing
// asked for. So such a section allows the action by itself; and a file
// that both lets commands out and keeps the action denied (by
// defaults.network or a rule) contradicts itself and is refused, naming
// the line and what to change, rather than quietly run with no network.
func (sw *netSwitch) apply(p *Policy) error {
	if p.Network == nil || p.Network.Mode == NetworkDenyAll {
		return nil
	}
	mode := p.Network.Mode
	if sw.def != nil && p.Defaults[Network] != Allow {
		return fieldErr(sw.def, "defaults.network", "network.mode %s needs the network action allowed; remove defaults.network (or set it to allow), or set network.mode: deny-all", mode)
	}
	for _, r := range sw.rules {
		if d := p.Rules[r.i].Decision; d != Allow {
			return fieldErr(r.node, fmt.Sprintf("rules[%d]", r.i), "network.mode %s needs the network action allowed; remove this rule (decision %s), or set network.mode: deny-all", mode, d)
		}
	}
	p.Defaults[Network] = Allow
	return nil
}
