package remote

import (
	"fmt"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// wireInject is a submit's inject: the secrets bound to hosts, for the
// server's egress proxy to put into requests to those hosts. Their values
// cross the wire — they are the caller's, as on a local backend, and the
// server's own environment is not the caller's to hand out — so they go
// only where the connection is encrypted or never leaves this machine,
// and only for an allowlist command (no other has the proxy). A server
// that cannot inject is refused rather than left to pass placeholders
// through unchecked.
func (b *Backend) wireInject(req *backend.Request, np policy.NetworkPolicy, features map[string]bool) ([]protocol.Injection, error) {
	if req.Egress == nil || len(req.Egress.Inject) == 0 || np.Mode != policy.NetworkAllowlist {
		return nil, nil
	}
	if !features[protocol.FeatureInject] {
		return nil, fmt.Errorf("remote: the server does not inject secrets bound to hosts (no %q feature): %w", protocol.FeatureInject, backend.ErrUnsupported)
	}
	if b.u.Scheme != "wss" && !loopback(b.u.Hostname()) {
		return nil, fmt.Errorf("remote: secrets bound to hosts are sent to the server only over wss:// (or to this machine): %w", backend.ErrUnsupported)
	}
	return protocol.WireInject(req.Egress.Inject), nil
}
