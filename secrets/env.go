package secrets

import (
	"fmt"
	"os"
)

// FromEnv returns the named environment variables that are set and not
// empty, as Secrets named after the variable, in the order given. Pass the
// result to WithSecrets (each is then redacted as "[REDACTED:NAME]") or to
// a sandbox that forwards them to commands its Policy allows.
// A variable that is unset is left out; a value shorter than MinSecretLen
// is kept, so that New reports it instead of it being skipped silently.
func FromEnv(names ...string) []Secret {
	return fromLookup(os.LookupEnv, names)
}

func fromLookup(lookup func(string) (string, bool), names []string) []Secret {
	out := make([]Secret, 0, len(names))
	for _, n := range names {
		if v, ok := lookup(n); ok && v != "" {
			out = append(out, Secret{Name: n, Value: v})
		}
	}
	return out
}

// AllowAllSecrets is the policy that passes every configured secret.
func AllowAllSecrets() Policy { return Policy{Mode: AllowAll} }

// AllowSecrets is the policy that passes only the secrets named.
func AllowSecrets(names ...string) Policy {
	return Policy{Mode: Allowlist, Names: append([]string(nil), names...)}
}

// Validate reports a policy whose mode is unknown.
func (p Policy) Validate() error {
	if p.Mode == "" || p.Mode.Valid() {
		return nil
	}
	return fmt.Errorf("secrets: unknown secret mode %q", string(p.Mode))
}

// Allows reports whether a secret called name may reach a command. The
// zero policy and any unknown mode allow nothing: fail closed.
func (p Policy) Allows(name string) bool {
	switch p.Mode {
	case AllowAll:
		return true
	case Allowlist:
		for _, n := range p.Names {
			if n == name {
				return true
			}
		}
	}
	return false
}

// Filter returns the secrets the policy lets through, in order.
func (p Policy) Filter(list []Secret) []Secret {
	var out []Secret
	for _, s := range list {
		if p.Allows(s.Name) {
			out = append(out, s)
		}
	}
	return out
}
