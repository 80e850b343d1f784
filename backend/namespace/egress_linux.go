package namespace

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
	"github.com/pulse-agent/pulse/policy"
)

// Allowlist mode: the command reaches the network only through the egress
// proxy, which runs outside; the init relays to it from inside
// (nsinit.EgressConfig). This is the backend's side: the request checked
// and the proxy's environment set.

// prepareEgress checks an allowlist request and adds the proxy variables
// to env. It returns nil for the other modes.
func prepareEgress(req *backend.Request, env map[string]string) (*nsinit.EgressConfig, error) {
	if req.Network.Mode != policy.NetworkAllowlist {
		return nil, nil
	}
	e := req.Egress
	if e == nil || e.Socket == "" {
		return nil, fmt.Errorf("%w: network allowlist needs the egress proxy (Request.Egress)", backend.ErrUnsupported)
	}
	for _, p := range []string{e.Socket, e.CAFile} {
		if p != "" && !filepath.IsAbs(p) {
			return nil, fmt.Errorf("%w: egress path %q is not absolute", backend.ErrInvalidRequest, p)
		}
	}
	if st, err := os.Stat(e.Socket); err != nil || st.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("%w: egress socket %q is not a socket", backend.ErrInvalidRequest, e.Socket)
	}
	ca := ""
	if e.CAFile != "" {
		ca = nsinit.EgressCA
	}
	for k, v := range backend.ProxyEnv("http://127.0.0.1:"+strconv.Itoa(nsinit.EgressPort), ca) {
		env[k] = v
	}
	return &nsinit.EgressConfig{Socket: e.Socket, CAFile: e.CAFile, Port: nsinit.EgressPort, Forward: backend.LoopbackForwards(req.Network, nsinit.EgressPort)}, nil
}
