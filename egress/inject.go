package egress

import (
	"net/http"
	"strings"

	"github.com/pulse-agent/pulse/internal/randhex"
	"github.com/pulse-agent/pulse/policy"
)

// Injection is a secret bound to hosts: the command's environment holds
// Placeholder under Name, and the proxy replaces Placeholder with Value in
// the headers of requests to Hosts (name entries, as in the allowlist;
// ports ignored), and nowhere else.
type Injection struct {
	Name        string
	Value       string
	Placeholder string
	Hosts       []string
}

// NewPlaceholder returns a fresh placeholder for the secret called name:
// random, so that it cannot be guessed from outside the sandbox, and
// plain ASCII, so that it survives any header a tool builds from it.
func NewPlaceholder(name string) string {
	safe := strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, name)
	return "pulse-placeholder-" + safe + "-" + randhex.String(16)
}

func (in Injection) boundTo(host string) bool {
	return policy.SecretInjection{Env: "X", Hosts: in.Hosts}.Matches(host)
}

// placeholdersIn returns the injections whose placeholder appears in s.
func placeholdersIn(ins []Injection, s string) []Injection {
	var out []Injection
	for _, in := range ins {
		if in.Placeholder != "" && strings.Contains(s, in.Placeholder) {
			out = append(out, in)
		}
	}
	return out
}

// inject replaces the placeholders in h's values with the real values of
// the injections bound to host. It returns the names it injected, and the
// first injection whose placeholder appears but is not bound to host (the
// request must then be refused, not sent).
func inject(ins []Injection, h http.Header, host string) (injected []string, stray *Injection) {
	for k, vs := range h {
		for i, v := range vs {
			for _, in := range placeholdersIn(ins, k+": "+v) {
				if !in.boundTo(host) || strings.Contains(k, in.Placeholder) {
					return nil, &in
				}
				v = strings.ReplaceAll(v, in.Placeholder, in.Value)
				injected = append(injected, in.Name)
			}
			vs[i] = v
		}
	}
	return injected, nil
}
