package sandbox

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// egressOptions are the allowlist and injection options.
type egressOptions struct {
	allowHosts []string
	inject     []policy.SecretInjection
	injectVals map[string]string
	resolver   egress.Resolver
	roots      *x509.CertPool
}

// WithAllowHosts lets commands reach these allowlist entries (host,
// *.domain, host:port, IP, CIDR[:port]; see policy.NetworkPolicy) through
// the egress proxy. It is a grant of its own: the hosts are reachable
// even when the policy's network action is denied (then only they are);
// when it is allowed they are added to the configured allowlist, and an
// allow-all policy stays allow-all.
func WithAllowHosts(entries ...string) Option {
	return func(o *options) error {
		for _, e := range entries {
			if _, err := policy.ParseAllowEntry(e); err != nil {
				return fmt.Errorf("sandbox: WithAllowHosts: %w", err)
			}
		}
		o.egress.allowHosts = append(o.egress.allowHosts, entries...)
		return nil
	}
}

// WithInjectedSecret binds a secret to hosts: commands see a placeholder
// in the environment variable name, and the egress proxy puts value into
// the headers of requests to hosts (and nowhere else). The value is
// scrubbed from everything the sandbox hands back. It works whether or
// not the policy allows the secrets action: the secret never enters the
// sandbox. A policy file's secrets.inject entries are bound the same way,
// with the value from WithSecrets or the caller's environment.
func WithInjectedSecret(name, value string, hosts ...string) Option {
	return func(o *options) error {
		in := policy.SecretInjection{Env: name, Hosts: hosts}
		if err := in.Validate(); err != nil {
			return fmt.Errorf("sandbox: WithInjectedSecret: %w", err)
		}
		if value == "" {
			return fmt.Errorf("sandbox: WithInjectedSecret: %s has an empty value", name)
		}
		if o.egress.injectVals == nil {
			o.egress.injectVals = map[string]string{}
		}
		o.egress.inject = append(o.egress.inject, in)
		o.egress.injectVals[name] = value
		return nil
	}
}

// WithEgressResolver makes the egress proxy look names up with r instead
// of the system resolver: the resolver override tests and `pulse doctor
// network` use to map names to local servers.
func WithEgressResolver(r egress.Resolver) Option {
	return func(o *options) error { o.egress.resolver = r; return nil }
}

// WithEgressRoots verifies the real servers of hosts with injected
// secrets against roots instead of the system's.
func WithEgressRoots(roots *x509.CertPool) Option {
	return func(o *options) error { o.egress.roots = roots; return nil }
}

// injections resolves the secrets to inject (options, then the policy's
// secrets.inject with values from WithSecrets or the environment) and
// returns them with fresh placeholders. A policy entry whose value is
// nowhere is skipped with a warning: the command then simply lacks it.
func (s *Sandbox) injections() []egress.Injection {
	var out []egress.Injection
	seen := map[string]bool{}
	add := func(in policy.SecretInjection, value string) {
		if seen[in.Env] || value == "" {
			return
		}
		seen[in.Env] = true
		out = append(out, egress.Injection{Name: in.Env, Value: value, Placeholder: egress.NewPlaceholder(in.Env), Hosts: in.Hosts})
	}
	for _, in := range s.o.egress.inject {
		add(in, s.o.egress.injectVals[in.Env])
	}
	for _, in := range s.o.policy.Inject {
		v := ""
		for _, sec := range s.o.secrets {
			if sec.Name == in.Env {
				v = sec.Value
			}
		}
		if v == "" && s.o.getenv != nil {
			v = s.o.getenv(in.Env)
		}
		if v == "" {
			s.log.Warn("secret to inject is not set; commands get no placeholder for it", "env", in.Env)
		}
		add(in, v)
	}
	return out
}

// injectedSecrets are the injected values, for the scrubber.
func injectedSecrets(ins []egress.Injection) []secrets.Secret {
	var out []secrets.Secret
	for _, in := range ins {
		out = append(out, secrets.Secret{Name: in.Name, Value: in.Value})
	}
	return out
}

// withAllowHosts applies WithAllowHosts to the effective network policy.
func (s *Sandbox) withAllowHosts(net policy.NetworkPolicy, allowed bool) policy.NetworkPolicy {
	hosts := s.o.egress.allowHosts
	if len(hosts) == 0 {
		return net
	}
	switch {
	case !allowed || net.Mode == policy.NetworkDenyAll || net.Mode == "":
		return policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: append([]string(nil), hosts...)}
	case net.Mode == policy.NetworkAllowlist:
		net.Allow = append(append([]string(nil), net.Allow...), hosts...)
	}
	return net
}

// egressRun is the proxy of one Execute in allowlist mode.
type egressRun struct {
	proxy *egress.Proxy
	dir   string
	be    *backend.Egress
	done  chan struct{}
	once  sync.Once
	err   error // what close could not remove

	mu      sync.Mutex
	refused []string
	why     []NetworkRefusal // refused, in its order
}

// startEgress starts the proxy for one command: on a unix socket in a
// private temporary directory, with the sandbox's CA bundle beside it
// when secrets are injected. Every connection becomes an audit `network`
// event of execID.
func (s *Sandbox) startEgress(ctx context.Context, execID string, np policy.NetworkPolicy) (*egressRun, error) {
	if np.Mode != policy.NetworkAllowlist {
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "pulse-egress-")
	if err != nil {
		return nil, fmt.Errorf("sandbox: egress: %w", err)
	}
	r := &egressRun{dir: dir, done: make(chan struct{})}
	cfg := egress.Config{
		Policy:        np,
		Inject:        s.inject,
		CA:            s.ca,
		UpstreamRoots: s.o.egress.roots,
		Resolver:      s.o.egress.resolver,
		Logger:        s.log,
		OnEvent:       func(ev egress.Event) { s.recordEgress(ctx, execID, ev, r) },
	}
	be := &backend.Egress{Socket: filepath.Join(dir, "proxy.sock")}
	// A backend whose commands reach the network through a proxy of its
	// own (remote) injects the same secrets, with the same placeholders.
	for _, in := range s.inject {
		be.Inject = append(be.Inject, backend.Injection{Name: in.Name, Placeholder: in.Placeholder, Value: in.Value, Hosts: in.Hosts})
	}
	if len(s.inject) > 0 {
		be.CAFile, be.CA = filepath.Join(dir, "ca.pem"), s.ca.CertPEM()
		if err := os.WriteFile(be.CAFile, append(backend.SystemRoots(), s.ca.CertPEM()...), 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("sandbox: egress CA: %w", err)
		}
	}
	if r.proxy, err = egress.New(cfg); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	l, err := net.Listen("unix", be.Socket)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sandbox: egress socket: %w", err)
	}
	// The directory stays private (0700): the namespace sandbox's user is
	// this process's uid mapped, and the Docker bridge is this process.
	go func() { r.proxy.Serve(l); close(r.done) }()
	// A backend that accepts the command's connections in this process
	// hands them straight to the proxy (one relay, not two).
	be.ServeConn = r.proxy.ServeConn
	r.be = be
	return r, nil
}

// close stops the proxy (waiting for its connections, so every event is
// recorded) and removes its directory. Safe on nil.
// close stops the proxy and removes its directory; the error (the same
// on every call) names the directory when it is left on the host.
func (r *egressRun) close() error {
	if r == nil {
		return nil
	}
	r.once.Do(func() {
		r.proxy.Close()
		<-r.done
		if err := os.RemoveAll(r.dir); err != nil {
			r.err = fmt.Errorf("egress proxy directory %s: %w", r.dir, err)
		}
	})
	return r.err
}

func (r *egressRun) backendEgress() *backend.Egress {
	if r == nil {
		return nil
	}
	return r.be
}

// NetworkRefusal is one destination the egress proxy refused, the first
// time it did.
type NetworkRefusal struct {
	// Destination is host:port as the command named it.
	Destination string
	// Reason is why, as the audit log's event has it.
	Reason string
	// Cut is true when the destination itself is allowed and the proxy
	// refused what the command sent through the connection (a request
	// in a tunnel naming another host, a secret's placeholder bound to
	// other hosts) and cut it: allowing the destination changes nothing.
	Cut bool
}

// refusals lists why each destination of refusedHosts was refused.
func (r *egressRun) refusals() []NetworkRefusal {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]NetworkRefusal(nil), r.why...)
}

// refusedHosts lists the host:port destinations refused, each once.
func (r *egressRun) refusedHosts() []string {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.refused...)
}

// recordBackendEgress audits the connections through a proxy the backend
// ran itself (a remote server's, Result.Network) as recordEgress does
// this process's.
func (s *Sandbox) recordBackendEgress(ctx context.Context, execID string, br *backend.Result, r *egressRun) {
	if br == nil || r == nil {
		return
	}
	for _, ev := range br.Network {
		s.recordEgress(ctx, execID, egress.Event{Method: ev.Method, Host: ev.Host, Port: ev.Port, Addr: ev.Addr,
			Allowed: ev.Allowed, Rule: ev.Rule, Reason: ev.Reason, Injected: ev.Injected,
			Sent: ev.Sent, Received: ev.Received, Duration: ev.Duration}, r)
	}
	if br.NetworkDropped > 0 {
		s.log.Warn("the backend's egress proxy reported only some connections", "execution_id", execID,
			"reported", len(br.Network), "not_reported", br.NetworkDropped)
		// The log says that it is incomplete, rather than leaving a gap
		// nobody reading it would see.
		s.record(ctx, audit.Event{ExecutionID: execID, Action: "network", Destination: "*", Protocol: "tcp",
			Reason: "not_reported", Backend: s.backend.Name(), EnforcementLevel: string(policy.Strong),
			Detail: fmt.Sprintf("%d more connections went through the backend's egress proxy than it reported (%d, refusals first); they are not in this log",
				br.NetworkDropped, len(br.Network))})
	}
}

func (s *Sandbox) recordEgress(ctx context.Context, execID string, ev egress.Event, r *egressRun) {
	decision, why := "allow", "rule: "+ev.Rule
	if !ev.Allowed {
		decision, why = "deny", ev.Reason
		hp := net.JoinHostPort(ev.Host, strconv.Itoa(ev.Port))
		r.mu.Lock()
		dup := false
		for _, h := range r.refused {
			dup = dup || h == hp
		}
		if !dup && ev.Host != "" {
			r.refused = append(r.refused, hp)
			// A refused event that names the rule that allowed its
			// destination was refused after the check passed: for what
			// went through it, not for where it went.
			r.why = append(r.why, NetworkRefusal{Destination: hp, Reason: ev.Reason, Cut: ev.Rule != ""})
		}
		r.mu.Unlock()
	} else if ev.Reason != "" {
		why += "; " + ev.Reason
	}
	detail := fmt.Sprintf("%s %s: %s; sent %d bytes, received %d", ev.Method, net.JoinHostPort(ev.Host, strconv.Itoa(ev.Port)), why, ev.Sent, ev.Received)
	if ev.Addr != "" {
		detail += "; dialled " + ev.Addr
	}
	if len(ev.Injected) > 0 {
		detail += "; injected " + strings.Join(ev.Injected, ", ")
	}
	reason := ev.Rule
	if !ev.Allowed {
		reason = ev.Reason
	}
	s.record(ctx, audit.Event{ExecutionID: execID, Action: "network", Destination: ev.Host, Port: ev.Port, Protocol: "tcp",
		Decision: decision, Reason: reason, Backend: s.backend.Name(), EnforcementLevel: string(policy.Strong),
		DurationMS: float64(ev.Duration.Microseconds()) / 1000, Detail: detail})
}

// setupEgress resolves the injected secrets and, when there are any,
// makes the sandbox's CA.
func (s *Sandbox) setupEgress() error {
	s.inject = s.injections()
	if len(s.inject) == 0 {
		return nil
	}
	ca, err := egress.NewCA()
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	s.ca = ca
	return nil
}
