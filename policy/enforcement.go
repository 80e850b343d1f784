package policy

// EnforcementLevel is how strongly a backend can enforce a policy mode
// (a network mode, a secret mode, a resource limit). The facade runs a
// command only when every effective mode is Strong, or the caller
// accepted less for that mode explicitly.
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
