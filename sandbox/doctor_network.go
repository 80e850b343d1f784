package sandbox

import (
	"context"

	"github.com/pulse-agent/pulse/egress/bypass"
	"github.com/pulse-agent/pulse/policy"
)

// NetworkDiagnosis is the egress bypass suite's outcome on one backend.
type NetworkDiagnosis struct {
	Backend string `json:"backend"`
	// Level is the backend's claimed enforcement of network allowlist.
	Level policy.EnforcementLevel `json:"allowlist_level"`
	// Reason says why the suite did not run ("" when it did).
	Reason  string          `json:"reason,omitempty"`
	Results []bypass.Result `json:"results,omitempty"`
}

// Held reports whether every attack of the suite failed (and every
// allowed request worked).
func (d NetworkDiagnosis) Held() bool {
	if d.Reason != "" {
		return false
	}
	for _, r := range d.Results {
		if !r.Held {
			return false
		}
	}
	return true
}

// DiagnoseNetwork runs the egress bypass suite (egress/bypass) on each
// local isolating backend that is available and claims to enforce the
// allowlist: `pulse doctor network`. Every server it uses is on
// 127.0.0.1; nothing leaves the machine. It honours WithBackendName.
func DiagnoseNetwork(ctx context.Context, opts ...Option) ([]NetworkDiagnosis, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	o.fullProbe = true // a diagnosis trusts no remembered probe
	var out []NetworkDiagnosis
	for _, c := range candidates() {
		if c.Name != "namespace" && c.Name != "docker" {
			continue
		}
		if o.backendName != "" && o.backendName != "auto" && o.backendName != c.Name {
			continue
		}
		d := NetworkDiagnosis{Backend: c.Name}
		b, err := o.open(c)
		if err != nil {
			d.Reason = err.Error()
			out = append(out, d)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		perr := b.Probe(pctx)
		cancel()
		d.Level = b.Capabilities().NetworkLevel(policy.NetworkAllowlist)
		switch {
		case perr != nil:
			d.Reason = "unavailable: " + perr.Error()
		case d.Level == policy.Unsupported:
			d.Reason = "does not enforce network allowlist here"
		default:
			d.Results, err = bypass.Run(ctx, b, o.logger)
			if err != nil {
				d.Reason = "the suite could not start: " + err.Error()
			}
		}
		b.Close()
		out = append(out, d)
	}
	return out, nil
}
