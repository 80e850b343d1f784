package policy

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
)

// Validate reports a malformed network policy with an error wrapping
// ErrInvalid. Allow, Hosts, CIDRs and Ports are only meaningful in
// allowlist mode (Expose, inbound only, is valid in every mode), so they are refused in the other modes rather than
// silently ignored, and an allowlist must name at least one destination.
func (n NetworkPolicy) Validate() error {
	seen := map[int]bool{}
	for i, p := range n.Expose {
		if p < 1 || p > 65535 {
			return fmt.Errorf("expose[%d]: %w: port %d out of range 1-65535", i, ErrInvalid, p)
		}
		if seen[p] {
			return fmt.Errorf("expose[%d]: %w: port %d listed twice", i, ErrInvalid, p)
		}
		seen[p] = true
	}
	for i, r := range n.ExposeRanges {
		if err := r.validate(); err != nil {
			return fmt.Errorf("expose range %d: %w", i, err)
		}
	}
	switch n.Mode {
	case NetworkDenyAll, NetworkAllowAll:
		if len(n.Allow)+len(n.Hosts)+len(n.CIDRs)+len(n.Ports) > 0 {
			return fmt.Errorf("%w: mode %s takes no allow, hosts, cidrs or ports", ErrInvalid, n.Mode)
		}
		return nil
	case NetworkAllowlist:
	case "":
		return fmt.Errorf("%w: mode is required (deny-all, allow-all or allowlist)", ErrInvalid)
	default:
		return fmt.Errorf("%w: unknown mode %q (want deny-all, allow-all or allowlist)", ErrInvalid, string(n.Mode))
	}
	if len(n.Allow)+len(n.Hosts)+len(n.CIDRs) == 0 {
		return fmt.Errorf("%w: allowlist names no hosts or cidrs", ErrInvalid)
	}
	for i, p := range n.Ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("ports[%d]: %w: port %d out of range 1-65535", i, ErrInvalid, p)
		}
	}
	_, err := n.Entries()
	return err
}

// Allows reports whether n lets a command reach host (a DNS name or an IP
// address) on port, by name alone: see CheckHost, and CheckResolved for
// the addresses a name resolves to. A policy that does not validate
// allows nothing.
func (n NetworkPolicy) Allows(host string, port int) bool {
	if n.Mode == NetworkAllowAll && n.Validate() == nil {
		return true
	}
	return n.CheckHost(host, port).Allowed
}

// ParseCIDR parses an address range ("10.0.0.0/8", "fd00::/8") or a single
// address, which stands for itself alone.
func ParseCIDR(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.Prefix{}, fmt.Errorf("%w: %q is not a CIDR or an IP address", ErrInvalid, s)
}

// validHost accepts a DNS name, a "*."-prefixed wildcard name or an IP
// address.
func validHost(h string) error {
	if _, err := netip.ParseAddr(h); err == nil {
		return nil
	}
	name := strings.TrimSuffix(h, ".")
	name = strings.TrimPrefix(name, "*.")
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%w: invalid host name %q", ErrInvalid, h)
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%w: invalid host name %q", ErrInvalid, h)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%w: invalid host name %q", ErrInvalid, h)
			}
		}
	}
	return nil
}

// Validate reports a malformed limit (a negative value, a CPU count that is
// not a finite number) with an error wrapping ErrInvalid.
func (l ResourceLimits) Validate() error {
	neg := func(name LimitKey, v int64) error {
		if v < 0 {
			return fmt.Errorf("%s: %w: must not be negative, got %d", name, ErrInvalid, v)
		}
		return nil
	}
	if l.Timeout < 0 {
		return fmt.Errorf("%s: %w: must not be negative, got %s", LimitTimeout, ErrInvalid, l.Timeout)
	}
	if math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) || l.CPUs < 0 {
		return fmt.Errorf("%s: %w: must be a non-negative number, got %v", LimitCPUs, ErrInvalid, l.CPUs)
	}
	for _, c := range []struct {
		name LimitKey
		v    int64
	}{
		{LimitMemoryBytes, l.MemoryBytes},
		{LimitPids, l.Pids},
		{LimitOutputBytes, l.OutputBytes},
		{LimitFileSizeBytes, l.FileSizeBytes},
		{LimitDiskBytes, l.DiskBytes},
	} {
		if err := neg(c.name, c.v); err != nil {
			return err
		}
	}
	return nil
}
