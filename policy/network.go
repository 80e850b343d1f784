package policy

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

// NetworkPolicy is the network a command may reach. Backends report how
// strongly they can enforce each Mode; the facade refuses to run a command
// whose effective policy a backend cannot enforce strongly.
type NetworkPolicy struct {
	Mode NetworkMode `json:"mode" yaml:"mode"`
	// Hosts are DNS names (exact, or "*.example.com") allowed in allowlist mode.
	Hosts []string `json:"hosts,omitempty" yaml:"hosts,omitempty"`
	// CIDRs are address ranges allowed in allowlist mode.
	CIDRs []string `json:"cidrs,omitempty" yaml:"cidrs,omitempty"`
	// Ports restricts allowlisted destinations to these ports; empty means any.
	Ports []int `json:"ports,omitempty" yaml:"ports,omitempty"`
}

// DenyAllNetwork is the policy that isolates a command from every network.
func DenyAllNetwork() NetworkPolicy { return NetworkPolicy{Mode: NetworkDenyAll} }
