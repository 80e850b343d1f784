package sandbox

import (
	"fmt"
	"strings"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// effectiveNetwork resolves the network a command may reach, and says
// why in words a person can act on (what `pulse doctor` prints). A
// policy that denies the network action forces deny-all; an allowed
// action with no network policy gets deny-all too, except on the unsafe
// host backend, which can only give everything; WithAllowHosts adds its
// hosts (through the proxy) whatever the policy says.
func (s *Sandbox) effectiveNetwork() (policy.NetworkPolicy, string) {
	unsafeHost := s.caps.Isolation == backend.IsolationHostUnsafe
	allowed := s.o.policy.Allowed(policy.Network)
	net := policy.DenyAllNetwork()
	var why string
	switch {
	case !allowed && s.o.network != nil && s.o.network.Mode != policy.NetworkDenyAll:
		why = fmt.Sprintf("the network policy asks for %s, but the policy does not allow the network action (%s), which forces deny-all; allow the action (policy file: remove that entry; SDK: Defaults[policy.Network] = policy.Allow)",
			s.o.network.Mode, s.o.policy.WhyNotAllowed(policy.Network))
	case !allowed:
		why = fmt.Sprintf("the policy does not allow the network action (%s); a policy file's `network: {mode: allowlist, allow: [HOST]}` or --allow-host HOST lets commands reach HOST through the egress proxy",
			s.o.policy.WhyNotAllowed(policy.Network))
	case s.o.network != nil:
		net = *s.o.network
		why = describeNetwork(net, "the policy's network section")
	case unsafeHost:
		net = policy.NetworkPolicy{Mode: policy.NetworkAllowAll}
		why = "the network action is allowed and no network policy is set; the unsafe host backend cannot restrict the network, so commands get the host's"
	default:
		why = "the network action is allowed but no network policy is set; add `network: {mode: allowlist, allow: [HOST]}` to let commands reach HOST through the egress proxy"
	}
	if hosts := s.o.egress.allowHosts; len(hosts) > 0 && net.Mode != policy.NetworkAllowAll {
		if net.Mode == policy.NetworkAllowlist {
			why += "; plus --allow-host " + strings.Join(hosts, ", ")
		} else {
			why = "--allow-host " + strings.Join(hosts, ", ") + " (through the egress proxy), whatever the policy says; without it: " + why
		}
	}
	net = s.withAllowHosts(net, allowed)
	if s.o.network != nil {
		// Inbound only and valid in every mode: a backend that checks
		// Expose itself (remote: pulse-server) sees the same ports as
		// the facade's own check.
		net.Expose, net.ExposeRanges = s.o.network.Expose, s.o.network.ExposeRanges
	}
	return net, why
}

// describeNetwork says what a network policy lets out, naming its source.
func describeNetwork(n policy.NetworkPolicy, source string) string {
	switch n.Mode {
	case policy.NetworkAllowlist:
		entries := append(append(append([]string(nil), n.Allow...), n.Hosts...), n.CIDRs...)
		return fmt.Sprintf("%s allows %s, through the egress proxy; every other destination is refused", source, strings.Join(entries, ", "))
	case policy.NetworkAllowAll:
		return source + " says allow-all"
	default:
		return source + " says deny-all"
	}
}

// warnUnappliedNetwork logs, once per sandbox, a network policy that asks
// for a way out (WithNetworkPolicy, or a policy's Network) while the
// policy denies the network action: commands then get deny-all, as the
// seed's contract has it, and the caller should hear why rather than
// find a command's connections refused.
func (s *Sandbox) warnUnappliedNetwork() {
	n := s.o.network
	if n == nil || n.Mode == policy.NetworkDenyAll || s.o.policy.Allowed(policy.Network) {
		return
	}
	s.log.Warn("network policy not applied: the policy does not allow the network action, so commands get deny-all; set Defaults[policy.Network] = policy.Allow",
		"mode", string(n.Mode), "because", s.o.policy.WhyNotAllowed(policy.Network))
}
