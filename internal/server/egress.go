package server

import (
	"log/slog"
	"maps"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/egressrun"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// withEgress is egressrun.Start: the local executor's proxy for an
// allowlist request.
func withEgress(req *backend.Request, log *slog.Logger) (*backend.Request, func() ([]backend.NetworkEvent, int), error) {
	return egressrun.Start(req, log)
}

// injectInto is a submit's inject for the backend request: the
// placeholders in the command's environment (whatever the client put
// there under those names), the values for the proxy alone. Only an
// allowlist command has the proxy; otherwise the values are not kept.
func injectInto(np policy.NetworkPolicy, env map[string]string, ins []protocol.Injection) (map[string]string, *backend.Egress) {
	if len(ins) == 0 || np.Mode != policy.NetworkAllowlist {
		return env, nil
	}
	env = maps.Clone(env)
	if env == nil {
		env = map[string]string{}
	}
	for _, in := range ins {
		env[in.Env] = in.Placeholder
	}
	return env, &backend.Egress{Inject: protocol.BackendInject(ins)}
}
