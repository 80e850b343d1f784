package backend

import (
	"net/netip"
	"strconv"

	"github.com/pulse-agent/pulse/policy"
)

// LoopbackForwards lists the targets ("127.0.0.1:PORT") of a network
// allowlist's loopback address entries with explicit ports, other than
// skip (the port the proxy itself listens on in the sandbox). A backend
// that bridges the egress proxy also listens on each of them on the
// sandbox's own loopback and relays every connection as a CONNECT to that
// target through the proxy (bridge.Tunnel), so the policy, the audit
// event and the inspection of the first bytes apply as to any other
// connection. It is there because some clients never use a proxy for a
// loopback address — Go's net/http, and so `go mod download` from a
// GOPROXY on 127.0.0.1, for one — and would otherwise dial the sandbox's
// empty loopback. Entries without a port (80 and 443), with any port, or
// of a range are not forwarded.
func LoopbackForwards(n policy.NetworkPolicy, skip int) []string {
	if n.Mode != policy.NetworkAllowlist {
		return nil
	}
	entries, err := n.Entries()
	if err != nil {
		return nil
	}
	lo := netip.MustParseAddr("127.0.0.1")
	seen := map[int]bool{skip: true}
	var out []string
	for _, e := range entries {
		if !e.Prefix.IsValid() || !e.Prefix.IsSingleIP() || e.Prefix.Addr() != lo || e.Ports == nil || isDefault(e.Ports) {
			continue
		}
		for _, p := range e.Ports {
			if p < 1 || p > 65535 || seen[p] {
				continue
			}
			seen[p] = true
			out = append(out, "127.0.0.1:"+strconv.Itoa(p))
		}
	}
	return out
}

func isDefault(ports []int) bool {
	if len(ports) != len(policy.DefaultPorts) {
		return false
	}
	for i, p := range ports {
		if policy.DefaultPorts[i] != p {
			return false
		}
	}
	return true
}
