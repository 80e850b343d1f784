package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// NetworkMode says how much of the network a sandboxed command may reach.
type NetworkMode string

// The network modes. The zero value is not a valid mode: callers must say
// what they want, and the facade resolves an unset policy to deny-all.
const (
	// NetworkDenyAll gives the command no network at all (loopback only).
	NetworkDenyAll NetworkMode = "deny-all"
	// NetworkAllowAll gives the command the host's network.
	NetworkAllowAll NetworkMode = "allow-all"
	// NetworkAllowlist allows only the listed hosts, CIDRs and ports.
	NetworkAllowlist NetworkMode = "allowlist"
)

// Valid reports whether m is one of the three network modes (the zero
// value is not).
func (m NetworkMode) Valid() bool {
	switch m {
	case NetworkDenyAll, NetworkAllowAll, NetworkAllowlist:
		return true
	}
	return false
}

// NetworkPolicy is the network a command may reach. Backends report how
// strongly they can enforce each Mode; the facade refuses to run a command
// whose effective policy a backend cannot enforce strongly.
//
// In allowlist mode, Allow is the list to use: each entry is a host name
// ("proxy.golang.org"), a wildcard ("*.github.com": any deeper name, not
// github.com itself), an IP address, or a CIDR, each with an optional port
// ("example.com:8443", "[::1]:8080", "10.0.0.0/8:443", "host:*" for any
// port). An entry without a port allows 80 and 443. Hosts, CIDRs and Ports
// are the older form and keep their meaning: any port unless Ports is set.
//
// Loopback, link-local, private, unspecified and multicast addresses are
// reached only through an address entry at least as narrow as the special
// range (127.0.0.1, 10.0.0.0/8; 0.0.0.0/0 does not count), or through the
// name entry "localhost" for loopback addresses. A name is reached only
// when a name entry matches it: the proxy does not even resolve other
// names, so DNS cannot carry data out.
type NetworkPolicy struct {
	Mode NetworkMode `json:"mode" yaml:"mode"`
	// Allow are allowlist entries (see above).
	Allow []string `json:"allow,omitempty" yaml:"allow,omitempty"`
	// Hosts are DNS names (exact, or "*.example.com") allowed in allowlist mode.
	Hosts []string `json:"hosts,omitempty" yaml:"hosts,omitempty"`
	// CIDRs are address ranges allowed in allowlist mode.
	CIDRs []string `json:"cidrs,omitempty" yaml:"cidrs,omitempty"`
	// Ports restricts Hosts and CIDRs to these ports; empty means any.
	Ports []int `json:"ports,omitempty" yaml:"ports,omitempty"`
	// Expose lists the TCP ports that a process listening on them inside
	// the sandbox may be reached on from the host's loopback
	// (sandbox.Expose). It is inbound only, grants no way out, and is
	// valid in every mode, deny-all included.
	Expose []int `json:"expose,omitempty" yaml:"expose,omitempty"`
	// ExposeRanges are ranges of ports exposed as Expose's are, for a
	// caller that does not know the port in advance (a dev server that
	// picks one): in a policy file, entries of the same expose list
	// written "3000-3999".
	ExposeRanges []PortRange `json:"expose_ranges,omitempty" yaml:"-"`
}

// Exposes reports whether n lists port in Expose or in one of
// ExposeRanges.
func (n NetworkPolicy) Exposes(port int) bool {
	for _, p := range n.Expose {
		if p == port {
			return true
		}
	}
	for _, r := range n.ExposeRanges {
		if r.Contains(port) {
			return true
		}
	}
	return false
}

// PortRange is an inclusive range of TCP ports, written "From-To"
// ("3000-3999"; "8080-8080" is one port).
type PortRange struct {
	From, To int
}

// Contains reports whether port is in r.
func (r PortRange) Contains(port int) bool { return r.From <= port && port <= r.To }

func (r PortRange) String() string { return strconv.Itoa(r.From) + "-" + strconv.Itoa(r.To) }

// ParsePortRange parses "From-To": two decimal ports, 1-65535, From no
// greater than To. Anything else is an error wrapping ErrInvalid.
func ParsePortRange(s string) (PortRange, error) {
	from, to, ok := strings.Cut(s, "-")
	if !ok {
		return PortRange{}, fmt.Errorf("%w: port range %q: want FROM-TO", ErrInvalid, s)
	}
	var r PortRange
	for _, f := range []struct {
		s string
		p *int
	}{{from, &r.From}, {to, &r.To}} {
		if f.s == "" || len(f.s) > 5 || strings.TrimLeft(f.s, "0123456789") != "" {
			return PortRange{}, fmt.Errorf("%w: port range %q: want FROM-TO, two decimal ports", ErrInvalid, s)
		}
		*f.p, _ = strconv.Atoi(f.s)
	}
	if err := r.validate(); err != nil {
		return PortRange{}, err
	}
	return r, nil
}

func (r PortRange) validate() error {
	if r.From < 1 || r.To > 65535 || r.From > r.To {
		return fmt.Errorf("%w: port range %d-%d: want 1 <= FROM <= TO <= 65535", ErrInvalid, r.From, r.To)
	}
	return nil
}

// MarshalText writes r as "From-To", the form ParsePortRange reads, so
// that a policy sent as JSON (to pulse-server) keeps its ranges.
func (r PortRange) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads "From-To".
func (r *PortRange) UnmarshalText(b []byte) error {
	v, err := ParsePortRange(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// DenyAllNetwork is the policy that isolates a command from every network.
func DenyAllNetwork() NetworkPolicy { return NetworkPolicy{Mode: NetworkDenyAll} }

// DefaultPorts are the ports an allowlist entry without a port allows.
var DefaultPorts = []int{80, 443}

// AllowEntry is one parsed allowlist entry: a name entry (Host set) or an
// address entry (Prefix valid).
type AllowEntry struct {
	// Rule is how the entry was written, for audit events and denials.
	Rule string
	// Host is a lower-case name without a trailing dot, or "*.suffix".
	Host string
	// Prefix is the address range of an address entry.
	Prefix netip.Prefix
	// Ports the entry allows; nil means any.
	Ports []int
}

// ParseAllowEntry parses one allowlist entry (see NetworkPolicy). It wraps
// ErrInvalid; it is fuzzed, because entries come from policy files and the
// command line.
func ParseAllowEntry(s string) (AllowEntry, error) {
	bad := func(why string) (AllowEntry, error) {
		return AllowEntry{}, fmt.Errorf("%w: allow entry %q: %s", ErrInvalid, s, why)
	}
	if s == "" || len(s) > 300 || strings.TrimSpace(s) != s {
		return bad("want host, *.domain, host:port, an IP or a CIDR with an optional :port")
	}
	e := AllowEntry{Rule: s, Ports: DefaultPorts}
	hostPart, portPart, hasPort := s, "", false
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return bad("unclosed [")
		}
		hostPart = s[1:end]
		rest := s[end+1:]
		if rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok {
				return bad("want [address]:port")
			}
			portPart, hasPort = p, true
		}
		if _, err := netip.ParseAddr(hostPart); err != nil {
			if _, err := netip.ParsePrefix(hostPart); err != nil {
				return bad("not an IP address or CIDR inside [ ]")
			}
		}
	case strings.Contains(s, "/"):
		// A CIDR: the port, if any, follows the prefix length.
		addr, bits, _ := strings.Cut(s, "/")
		if b, p, ok := strings.Cut(bits, ":"); ok {
			bits, portPart, hasPort = b, p, true
		}
		hostPart = addr + "/" + bits
	default:
		if _, err := netip.ParseAddr(s); err == nil {
			hostPart = s // a bare IPv6 address: its colons are not a port
		} else if i := strings.LastIndexByte(s, ':'); i >= 0 {
			hostPart, portPart, hasPort = s[:i], s[i+1:], true
		}
	}
	if hasPort {
		switch {
		case portPart == "*":
			e.Ports = nil
		default:
			p, err := strconv.Atoi(portPart)
			if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != portPart {
				return bad("port must be 1-65535 or *")
			}
			e.Ports = []int{p}
		}
	}
	if strings.Contains(hostPart, "/") {
		p, err := netip.ParsePrefix(hostPart)
		if err != nil || p.Addr().Zone() != "" {
			return bad("not a CIDR")
		}
		e.Prefix = unmapPrefix(p)
		return e, nil
	}
	if a, err := netip.ParseAddr(hostPart); err == nil {
		if a.Zone() != "" {
			return bad("zoned addresses are not allowed")
		}
		a = a.Unmap()
		e.Prefix = netip.PrefixFrom(a, a.BitLen())
		return e, nil
	}
	if strings.HasPrefix(s, "[") {
		return bad("not an IP address inside [ ]")
	}
	if err := validHost(hostPart); err != nil {
		return bad("invalid host name")
	}
	name := strings.TrimSuffix(strings.ToLower(hostPart), ".")
	if strings.Contains(name, "*") && !strings.HasPrefix(name, "*.") {
		return bad("a wildcard must be a leading *.")
	}
	if w, ok := strings.CutPrefix(name, "*."); ok {
		if _, err := netip.ParseAddr(w); err == nil || strings.Contains(w, "*") {
			return bad("a wildcard must be followed by a domain name")
		}
	}
	e.Host = name
	return e, nil
}

func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// Entries returns the allowlist as parsed entries: Allow first, then the
// older Hosts and CIDRs (restricted to Ports when set). It fails on the
// first malformed entry.
func (n NetworkPolicy) Entries() ([]AllowEntry, error) {
	var out []AllowEntry
	for i, s := range n.Allow {
		e, err := ParseAllowEntry(s)
		if err != nil {
			return nil, fmt.Errorf("allow[%d]: %w", i, err)
		}
		out = append(out, e)
	}
	var ports []int
	if len(n.Ports) > 0 {
		ports = n.Ports
	}
	for i, h := range n.Hosts {
		if err := validHost(h); err != nil {
			return nil, fmt.Errorf("hosts[%d]: %w", i, err)
		}
		e := AllowEntry{Rule: "hosts: " + h, Ports: ports}
		if a, err := netip.ParseAddr(h); err == nil {
			a = a.Unmap()
			e.Prefix = netip.PrefixFrom(a, a.BitLen())
		} else {
			e.Host = strings.TrimSuffix(strings.ToLower(h), ".")
		}
		out = append(out, e)
	}
	for i, c := range n.CIDRs {
		p, err := ParseCIDR(c)
		if err != nil {
			return nil, fmt.Errorf("cidrs[%d]: %w", i, err)
		}
		out = append(out, AllowEntry{Rule: "cidrs: " + c, Prefix: p, Ports: ports})
	}
	return out, nil
}

func (e AllowEntry) allowsPort(port int) bool {
	if e.Ports == nil {
		return port >= 1 && port <= 65535
	}
	for _, p := range e.Ports {
		if p == port {
			return true
		}
	}
	return false
}

// MatchName reports whether e, a name entry, matches host (lower-case, no
// trailing dot).
func (e AllowEntry) MatchName(host string) bool {
	if e.Host == "" {
		return false
	}
	if suffix, ok := strings.CutPrefix(e.Host, "*"); ok {
		return strings.HasSuffix(host, suffix) && len(host) > len(suffix)
	}
	return e.Host == host
}

// specialRanges are the ranges an address entry must name explicitly.
var specialRanges = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "64:ff9b::/96", "2001:db8::/32",
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

// SpecialRange returns the loopback, link-local, private, unspecified or
// multicast range holding a, and false for an ordinary public address.
func SpecialRange(a netip.Addr) (netip.Prefix, bool) {
	a = a.Unmap().WithZone("")
	for _, p := range specialRanges {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// MatchAddr reports whether e, an address entry, allows a on port. A
// special address needs an entry no wider than its special range.
func (e AllowEntry) MatchAddr(a netip.Addr, port int) bool {
	if !e.Prefix.IsValid() || !e.allowsPort(port) {
		return false
	}
	a = a.Unmap().WithZone("")
	if !e.Prefix.Contains(a) {
		return false
	}
	if sp, ok := SpecialRange(a); ok && e.Prefix.Bits() < sp.Bits() {
		return false
	}
	return true
}

// NetworkCheck is the outcome of checking one destination: whether it is
// allowed and by which entry (Rule), or why not (Reason).
type NetworkCheck struct {
	Allowed bool
	Rule    string
	Reason  string
}

// CheckHost checks a destination as a command names it: an IP literal
// (brackets allowed) or a host name, and a port. For a name, an allowed
// result still needs CheckResolved on each address the name resolves to.
// A policy that does not validate allows nothing.
func (n NetworkPolicy) CheckHost(host string, port int) NetworkCheck {
	switch {
	case n.Validate() != nil:
		return NetworkCheck{Reason: "the network policy is invalid"}
	case n.Mode == NetworkAllowAll:
		return NetworkCheck{Allowed: true, Rule: "mode allow-all"}
	case n.Mode != NetworkAllowlist:
		return NetworkCheck{Reason: "network mode " + string(n.Mode)}
	case port < 1 || port > 65535:
		return NetworkCheck{Reason: "invalid port"}
	}
	entries, _ := n.Entries()
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
		return checkAddr(entries, a, port, nil)
	}
	portDenied := false
	for _, e := range entries {
		if e.MatchName(host) {
			if e.allowsPort(port) {
				return NetworkCheck{Allowed: true, Rule: e.Rule}
			}
			portDenied = true
		}
	}
	if portDenied {
		return NetworkCheck{Reason: fmt.Sprintf("port %d is not allowed for %s", port, host)}
	}
	return NetworkCheck{Reason: fmt.Sprintf("%s is not in the allowlist", host)}
}

// CheckResolved checks an address that host, allowed by CheckHost's rule,
// resolved to: an ordinary address passes; a special one (loopback,
// private, ...) needs an address entry of its own, or the name entry
// "localhost" for loopback, so that a listed name cannot be pointed at the
// host's own services.
func (n NetworkPolicy) CheckResolved(host string, a netip.Addr, port int) NetworkCheck {
	if n.Validate() != nil {
		return NetworkCheck{Reason: "the network policy is invalid"}
	}
	if n.Mode == NetworkAllowAll {
		return NetworkCheck{Allowed: true, Rule: "mode allow-all"}
	}
	entries, _ := n.Entries()
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	var byName *AllowEntry
	for i, e := range entries {
		if e.MatchName(host) && e.allowsPort(port) {
			byName = &entries[i]
			break
		}
	}
	if byName == nil {
		return NetworkCheck{Reason: fmt.Sprintf("%s is not in the allowlist", host)}
	}
	return checkAddr(entries, a, port, byName)
}

func checkAddr(entries []AllowEntry, a netip.Addr, port int, byName *AllowEntry) NetworkCheck {
	a = a.Unmap().WithZone("")
	for _, e := range entries {
		if e.MatchAddr(a, port) {
			return NetworkCheck{Allowed: true, Rule: e.Rule}
		}
	}
	sp, special := SpecialRange(a)
	if byName != nil {
		if !special {
			return NetworkCheck{Allowed: true, Rule: byName.Rule}
		}
		if byName.Host == "localhost" && a.IsLoopback() {
			return NetworkCheck{Allowed: true, Rule: byName.Rule}
		}
		return NetworkCheck{Reason: fmt.Sprintf("it resolves to %s, in %s, which is reached only when listed explicitly", a, sp)}
	}
	if special {
		return NetworkCheck{Reason: fmt.Sprintf("%s is in %s, which is reached only when listed explicitly", a, sp)}
	}
	return NetworkCheck{Reason: fmt.Sprintf("%s (port %d) is not in the allowlist", a, port)}
}

// SecretInjection binds the secret held in the caller's environment
// variable Env to Hosts (name entries as in NetworkPolicy.Allow, ports
// ignored: "api.github.com", "*.example.com").
type SecretInjection struct {
	Env   string   `json:"env" yaml:"env"`
	Hosts []string `json:"hosts" yaml:"hosts"`
}

// Validate reports an injection without a valid variable name or hosts.
func (s SecretInjection) Validate() error {
	if !validEnvName(s.Env) {
		return fmt.Errorf("%w: env %q is not a variable name", ErrInvalid, s.Env)
	}
	if len(s.Hosts) == 0 {
		return fmt.Errorf("%w: env %s is bound to no hosts", ErrInvalid, s.Env)
	}
	for i, h := range s.Hosts {
		e, err := ParseAllowEntry(h)
		if err != nil {
			return fmt.Errorf("hosts[%d]: %w", i, err)
		}
		if e.Host == "" {
			return fmt.Errorf("hosts[%d]: %w: %q: bind secrets to host names, not addresses", i, ErrInvalid, h)
		}
	}
	return nil
}

// Matches reports whether the injection is bound to host.
func (s SecretInjection) Matches(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, h := range s.Hosts {
		if e, err := ParseAllowEntry(h); err == nil && e.MatchName(host) {
			return true
		}
	}
	return false
}

func validEnvName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
