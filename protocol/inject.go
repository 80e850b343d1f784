package protocol

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// FeatureInject: submit takes inject (secrets bound to hosts, injected by
// the server's egress proxy) and the result carries network (the
// connections that proxy saw).
const FeatureInject = "inject"

const (
	// MaxInjections bounds inject.
	MaxInjections = 64
	// MaxSecretLen bounds an injected secret's value, in bytes.
	MaxSecretLen = 64 << 10
	// MaxNetworkEvents bounds a result's network list; what is over it
	// is counted in NetworkDropped.
	MaxNetworkEvents = 1000
)

// placeholderPrefix starts every placeholder: a value the command sees
// in its environment, random past the prefix.
const placeholderPrefix = "pulse-placeholder-"

// Injection is a secret bound to hosts (FeatureInject). The command's
// environment holds Placeholder under Env; the server's egress proxy puts
// Value into the headers of requests to Hosts only, and refuses a request
// carrying Placeholder anywhere else. Value is the caller's: it crosses
// the wire (the connection is the client's own, authenticated, TLS when
// not on loopback), is held in the server's memory for the execution
// only, and is never logged, stored or handed to the sandbox. Format
// leaves it out, so that no %v of a request prints it.
type Injection struct {
	Env         string   `json:"env"`
	Hosts       []string `json:"hosts"`
	Placeholder string   `json:"placeholder"`
	Value       string   `json:"value"`
}

// Format implements fmt.Formatter: the binding without its value.
func (in Injection) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "{env:%s hosts:%v value:[redacted]}", in.Env, in.Hosts)
}

// NetworkEvent is one connection (or plain-HTTP request) through the
// server's egress proxy, as a result's network list carries it.
type NetworkEvent struct {
	Method     string   `json:"method"`
	Host       string   `json:"host"`
	Port       int      `json:"port"`
	Addr       string   `json:"addr,omitempty"`
	Allowed    bool     `json:"allowed"`
	Rule       string   `json:"rule,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	Injected   []string `json:"injected,omitempty"`
	Sent       int64    `json:"sent"`
	Received   int64    `json:"received"`
	DurationMS int64    `json:"duration_ms"`
}

// WireInject is a request's secret bindings as submit's inject carries
// them (the client's edge); Name travels as env. BackendInject is its
// inverse (the server's edge).
func WireInject(ins []backend.Injection) []Injection {
	var out []Injection
	for _, in := range ins {
		out = append(out, Injection{Env: in.Name, Hosts: in.Hosts, Placeholder: in.Placeholder, Value: in.Value})
	}
	return out
}

// BackendInject is submit's inject as the backend contract takes it; see
// WireInject.
func BackendInject(ins []Injection) []backend.Injection {
	var out []backend.Injection
	for _, in := range ins {
		out = append(out, backend.Injection{Name: in.Env, Hosts: in.Hosts, Placeholder: in.Placeholder, Value: in.Value})
	}
	return out
}

// WireNetwork is a backend result's network list as a result carries it
// (the server's edge): field for field, the duration in whole
// milliseconds. BackendNetwork is its inverse (the client's edge).
func WireNetwork(evs []backend.NetworkEvent) []NetworkEvent {
	var out []NetworkEvent
	for _, ev := range evs {
		out = append(out, NetworkEvent{Method: ev.Method, Host: ev.Host, Port: ev.Port, Addr: ev.Addr,
			Allowed: ev.Allowed, Rule: ev.Rule, Reason: ev.Reason, Injected: ev.Injected,
			Sent: ev.Sent, Received: ev.Received, DurationMS: ev.Duration.Milliseconds()})
	}
	return out
}

// BackendNetwork is a result's network list as the backend contract
// reports it; see WireNetwork.
func BackendNetwork(evs []NetworkEvent) []backend.NetworkEvent {
	var out []backend.NetworkEvent
	for _, ev := range evs {
		out = append(out, backend.NetworkEvent{Method: ev.Method, Host: ev.Host, Port: ev.Port, Addr: ev.Addr,
			Allowed: ev.Allowed, Rule: ev.Rule, Reason: ev.Reason, Injected: ev.Injected,
			Sent: ev.Sent, Received: ev.Received, Duration: time.Duration(ev.DurationMS) * time.Millisecond})
	}
	return out
}

// parseInject validates a submit's inject list.
func parseInject(v json.RawMessage) ([]Injection, error) {
	var ins []Injection
	if err := decodeStrict(v, &ins); err != nil {
		return nil, invalid("inject is not a list of {env, hosts, placeholder, value}")
	}
	if len(ins) > MaxInjections {
		return nil, invalid("inject has more than %d entries", MaxInjections)
	}
	seen := map[string]bool{}
	for _, in := range ins {
		if err := (policy.SecretInjection{Env: in.Env, Hosts: in.Hosts}).Validate(); err != nil || !ValidEnvName(in.Env) {
			return nil, invalid("inject entry %q is not a variable bound to host names", in.Env)
		}
		if seen[in.Env] {
			return nil, invalid("inject names %q twice", in.Env)
		}
		seen[in.Env] = true
		// The placeholder is looked for in headers: it must be long,
		// random and plain, never something a request holds by chance.
		ph := strings.TrimPrefix(in.Placeholder, placeholderPrefix)
		if ph == in.Placeholder || len(ph) < 16 || len(in.Placeholder) > 256 || strings.IndexFunc(in.Placeholder, notPlain) >= 0 {
			return nil, invalid("inject entry %q has no valid placeholder", in.Env)
		}
		if in.Value == "" || len(in.Value) > MaxSecretLen || strings.ContainsAny(in.Value, "\x00\r\n") {
			return nil, invalid("inject entry %q has an empty, overlong or multi-line value", in.Env)
		}
	}
	return ins, nil
}

func notPlain(r rune) bool {
	return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-')
}
