package sandbox

import (
	"context"
	"errors"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// BackendStatus is one backend as Diagnose found it.
type BackendStatus struct {
	Name string `json:"name"`
	// Available is true when the backend answered its Probe.
	Available bool `json:"available"`
	// Reason says why it is not available, or why it would not be chosen
	// (the host backend without the unsafe opt-in, remote without a URL).
	Reason string `json:"reason,omitempty"`
	// Selectable is true when New would pick it in its turn.
	Selectable   bool                 `json:"selectable"`
	Capabilities backend.Capabilities `json:"capabilities"`
	// Policy is how the backend would treat a command under the policy
	// of the options (WithPolicy, else the default one); nil when the
	// backend could not be made.
	Policy *PolicyFit `json:"policy,omitempty"`
}

// PolicyFit is what Execute would decide about a command on one backend
// under a policy: the effective network and secret modes and each limit
// with the level the backend enforces it at, and, when it would refuse
// the command, why.
type PolicyFit struct {
	Network      policy.NetworkMode      `json:"network"`
	NetworkLevel policy.EnforcementLevel `json:"network_level"`
	// NetworkWhy says why the network is what it is (which setting made
	// it so) and, when commands get none, what would let them out.
	NetworkWhy   string                  `json:"network_why,omitempty"`
	Secrets      secrets.Mode            `json:"secrets"`
	SecretsLevel policy.EnforcementLevel `json:"secrets_level"`
	// Limits holds every limit a command would have (the policy's, the
	// timeout and output cap filled in by default), by name.
	Limits map[policy.LimitKey]LimitFit `json:"limits"`
	// Refused is the error Execute would return before starting anything
	// ("" when the command would run).
	Refused string `json:"refused,omitempty"`
	// NeedsUnsafe lists, on the unsafe host backend, the rules the caller
	// would have to accept by name (WithUnsafeHostExecution(rules...),
	// --unsafe-host=rules) for the command to run.
	NeedsUnsafe []UnsafeRule `json:"needs_unsafe,omitempty"`
}

// LimitFit is one resource limit and the level it is enforced at.
type LimitFit struct {
	// Value is in Unit: "ms" for the timeout, "bytes", "cpus" or
	// "processes".
	Value float64                 `json:"value"`
	Unit  string                  `json:"unit"`
	Level policy.EnforcementLevel `json:"level"`
}

// fit runs the checks Execute runs before a command starts, against b's
// capabilities, with nothing audited.
func fit(ctx context.Context, o *options, b backend.Backend, caps backend.Capabilities) *PolicyFit {
	o2 := *o
	if o2.network == nil && o2.policy.Network != nil {
		n := *o2.policy.Network
		o2.network = &n
	}
	limits := o2.policy.Limits.WithDefaults()
	if o2.limits != nil {
		if l, err := limits.Tighten(*o2.limits); err == nil {
			limits = l
		}
	}
	probe := &Sandbox{o: o2, caps: caps, backend: b}
	net, sec := probe.effectivePolicies()
	_, why := probe.effectiveNetwork()
	f := &PolicyFit{Network: net.Mode, NetworkLevel: caps.NetworkLevel(net.Mode), NetworkWhy: why,
		Secrets: sec.Mode, SecretsLevel: caps.SecretLevel(sec.Mode), Limits: map[policy.LimitKey]LimitFit{}}
	if _, _, err := probe.checkEnforcement(ctx, "", "", limits); err != nil {
		f.Refused = err.Error()
		var he *HostRuleError
		if errors.As(err, &he) {
			f.NeedsUnsafe = he.Rules
		}
	}
	add := func(name policy.LimitKey, value float64, unit string) {
		if !limits.IsSet(name) {
			return
		}
		level, ok := caps.Limits[name]
		if !ok {
			level = policy.Unsupported
			if name.Defaulted() {
				level = policy.BestEffort // see checkLimits
			}
		}
		f.Limits[name] = LimitFit{Value: value, Unit: unit, Level: level}
	}
	add(policy.LimitTimeout, float64(limits.Timeout.Milliseconds()), "ms")
	add(policy.LimitOutputBytes, float64(limits.OutputBytes), "bytes")
	add(policy.LimitMemoryBytes, float64(limits.MemoryBytes), "bytes")
	add(policy.LimitCPUs, limits.CPUs, "cpus")
	add(policy.LimitPids, float64(limits.Pids), "processes")
	add(policy.LimitFileSizeBytes, float64(limits.FileSizeBytes), "bytes")
	add(policy.LimitDiskBytes, float64(limits.DiskBytes), "bytes")
	return f
}

// Diagnose probes every backend New could choose, in selection order, and
// reports what each enforces — the table `pulse doctor` prints. It honours
// the same options as New (WithUnsafeHostExecution, WithBackendName).
func Diagnose(ctx context.Context, opts ...Option) ([]BackendStatus, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	o.fullProbe = true // a diagnosis trusts no remembered probe
	var out []BackendStatus
	for _, c := range candidates() {
		if o.backendName != "" && o.backendName != "auto" && o.backendName != c.Name {
			continue
		}
		st := BackendStatus{Name: c.Name}
		skip := o.skip(c)
		b, err := o.open(c)
		if err != nil {
			st.Reason = err.Error()
			out = append(out, st)
			continue
		}
		st.Capabilities = b.Capabilities()
		if skip != "" && c.Name == "remote" {
			st.Reason = skip
		} else {
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			perr := b.Probe(pctx)
			cancel()
			st.Available = perr == nil
			st.Capabilities = b.Capabilities()
			switch {
			case perr != nil:
				st.Reason = perr.Error()
			case skip != "":
				st.Reason = skip
			case !o.tries(c) && c.StrongIsolation:
				st.Reason = "tried only when named (--backend " + c.Name + ") or when the policy asks for isolation: strong"
			case !o.tries(c):
				st.Reason = "the policy asks for isolation: strong, which this backend does not meet (it shares the host kernel)"
			default:
				st.Selectable = true
			}
		}
		st.Policy = fit(ctx, &o, b, st.Capabilities)
		b.Close()
		out = append(out, st)
	}
	return out, nil
}
