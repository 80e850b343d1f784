package sandbox

import (
	"context"

	"github.com/pulse-agent/pulse/backend"
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
}

// Diagnose probes every backend New could choose, in selection order, and
// reports what each enforces — the table `pulse doctor` prints. It honours
// the same options as New (WithUnsafeHostExecution, WithBackendName).
func Diagnose(ctx context.Context, opts ...Option) ([]BackendStatus, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	var out []BackendStatus
	for _, c := range candidates() {
		if o.backendName != "" && o.backendName != "auto" && o.backendName != c.name {
			continue
		}
		st := BackendStatus{Name: c.name}
		skip := ""
		if c.skip != nil {
			skip = c.skip(&o)
		}
		b, err := c.make(&o)
		if err != nil {
			st.Reason = err.Error()
			out = append(out, st)
			continue
		}
		st.Capabilities = b.Capabilities()
		if skip != "" && c.name == "remote" {
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
			default:
				st.Selectable = true
			}
		}
		b.Close()
		out = append(out, st)
	}
	return out, nil
}
