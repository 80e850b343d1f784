package namespace

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/internal/bridge"
	"github.com/pulse-agent/pulse/policy"
)

// Allowlist mode: the command keeps its empty network namespace (loopback
// only: no route, no resolver) and reaches the network only through the
// egress proxy, which runs outside. The proxy's unix socket is bound
// read-only into the sandbox at egressDir, and the init — which stays in
// the namespace as pid 1 — listens on 127.0.0.1:egressPort and relays each
// connection to it, so tools that only speak TCP proxies work.
const (
	egressDir    = "/run/pulse-egress"
	egressSocket = egressDir + "/proxy.sock"
	egressCA     = egressDir + "/ca.pem"
	egressPort   = 3128
)

// egressConfig is the init's part of an allowlist request.
type egressConfig struct {
	// Socket and CAFile are host paths, bound into the sandbox.
	Socket string `json:"socket"`
	CAFile string `json:"ca_file,omitempty"`
	Port   int    `json:"port"`
	// Forward are the allowlist's loopback targets the init also listens
	// on, tunnelled through the proxy (backend.LoopbackForwards).
	Forward []string `json:"forward,omitempty"`
}

// prepareEgress checks an allowlist request and adds the proxy variables
// to env. It returns nil for the other modes.
func prepareEgress(req *backend.Request, env map[string]string) (*egressConfig, error) {
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
		ca = egressCA
	}
	for k, v := range backend.ProxyEnv("http://127.0.0.1:"+strconv.Itoa(egressPort), ca) {
		env[k] = v
	}
	return &egressConfig{Socket: e.Socket, CAFile: e.CAFile, Port: egressPort, Forward: backend.LoopbackForwards(req.Network, egressPort)}, nil
}

// mountEgress binds the proxy's socket and CA bundle into the new root
// (in the init, before pivot_root).
func mountEgress(cfg *childConfig) error {
	e := cfg.Egress
	if e == nil {
		return nil
	}
	if err := bindReadOnly(e.Socket, cfg.Root+egressSocket); err != nil {
		return fmt.Errorf("egress socket: %w", err)
	}
	if e.CAFile != "" {
		if err := bindReadOnly(e.CAFile, cfg.Root+egressCA); err != nil {
			return fmt.Errorf("egress CA: %w", err)
		}
		// The bundle holds the system roots too, so it also stands in
		// for the system trust store, for tools that read only that
		// (regular files only: a symlink would be followed to the
		// host's file).
		for _, p := range backend.SystemBundles {
			if st, err := os.Lstat(cfg.Root + p); err == nil && st.Mode().IsRegular() {
				// Not bindReadOnly: the file exists, on a read-only
				// mount, so there is no mount point to create.
				if err := unix.Mount(e.CAFile, cfg.Root+p, "", unix.MS_BIND, ""); err != nil {
					return fmt.Errorf("egress CA over %s: %w", p, err)
				}
				if err := setReadOnly(cfg.Root+p, false); err != nil {
					return fmt.Errorf("egress CA over %s: %w", p, err)
				}
			}
		}
	}
	return nil
}

// startForwarder listens on 127.0.0.1:Port inside the sandbox's network
// namespace (in the init, after pivot_root) and relays every connection
// to the proxy's socket. The listener is close-on-exec: the command does
// not inherit it.
func startForwarder(cfg *childConfig) error {
	e := cfg.Egress
	if e == nil {
		return nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(e.Port))
	if err != nil {
		return fmt.Errorf("egress forwarder: %w", err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go bridge.ToUnix(c, egressSocket)
		}
	}()
	// Clients that never use a proxy for a loopback address (Go's
	// net/http) reach an allowed 127.0.0.1:PORT here, through the proxy.
	for _, target := range e.Forward {
		fl, err := net.Listen("tcp", target)
		if err != nil {
			return fmt.Errorf("egress forwarder for %s: %w", target, err)
		}
		go func() {
			for {
				c, err := fl.Accept()
				if err != nil {
					return
				}
				go bridge.Tunnel(c, egressSocket, target)
			}
		}()
	}
	return nil
}
