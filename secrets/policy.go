package secrets

// EnforcementLevel is how strongly a backend can enforce a policy mode.
// The facade runs a command only when every effective mode is Strong.
type EnforcementLevel string

// The enforcement levels, strongest first.
const (
	// Strong: the mechanism cannot be bypassed by the command
	// (an empty network namespace, an environment built from scratch).
	Strong EnforcementLevel = "strong"
	// BestEffort: honoured by well-behaved commands only.
	BestEffort EnforcementLevel = "best-effort"
	// Unsupported: the backend cannot enforce the mode at all.
	Unsupported EnforcementLevel = "unsupported"
)

// Mode says which secrets a command may see.
type Mode string

// The secret modes.
const (
	// DenyAll: no secret reaches the command.
	DenyAll Mode = "deny-all"
	// AllowAll: every configured secret reaches the command.
	AllowAll Mode = "allow-all"
	// Allowlist: only the secrets named in SecretPolicy.Names.
	Allowlist Mode = "allowlist"
)

// SecretPolicy says which secrets (by name, e.g. an environment variable)
// a command may see.
type SecretPolicy struct {
	Mode  Mode     `json:"mode" yaml:"mode"`
	Names []string `json:"names,omitempty" yaml:"names,omitempty"`
}

// DenyAllSecrets is the policy that passes no secret to a command.
func DenyAllSecrets() SecretPolicy { return SecretPolicy{Mode: DenyAll} }
