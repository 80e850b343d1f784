package secrets

// Mode says which secrets a command may see.
type Mode string

// The secret modes.
const (
	// DenyAll: no secret reaches the command.
	DenyAll Mode = "deny-all"
	// AllowAll: every configured secret reaches the command.
	AllowAll Mode = "allow-all"
	// Allowlist: only the secrets named in Policy.Names.
	Allowlist Mode = "allowlist"
)

// Valid reports whether m is one of the three secret modes. The zero
// value is not a mode, though Policy.Validate accepts it (it allows
// nothing).
func (m Mode) Valid() bool {
	switch m {
	case DenyAll, AllowAll, Allowlist:
		return true
	}
	return false
}

// Policy says which secrets (by name, e.g. an environment variable)
// a command may see.
type Policy struct {
	Mode  Mode     `json:"mode" yaml:"mode"`
	Names []string `json:"names,omitempty" yaml:"names,omitempty"`
}

// DenyAllSecrets is the policy that passes no secret to a command.
func DenyAllSecrets() Policy { return Policy{Mode: DenyAll} }
