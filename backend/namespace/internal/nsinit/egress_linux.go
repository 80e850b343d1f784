package nsinit

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend/internal/cabundle"
	"github.com/pulse-agent/pulse/internal/bridge"
)

// Allowlist mode: the command keeps its empty network namespace (loopback
// only: no route, no resolver) and reaches the network only through the
// egress proxy, which runs outside. The proxy's unix socket is bound
// read-only into the sandbox at EgressDir, and the init — which stays in
// the namespace as pid 1 — listens on 127.0.0.1:EgressPort and relays each
// connection to it, so tools that only speak TCP proxies work.
const (
	EgressDir    = "/run/pulse-egress"
	EgressSocket = EgressDir + "/proxy.sock"
	EgressCA     = EgressDir + "/ca.pem"
	EgressPort   = 3128
)

// EgressConfig is the init's part of an allowlist request.
type EgressConfig struct {
	// Socket and CAFile are host paths, bound into the sandbox.
	Socket string `json:"socket"`
	CAFile string `json:"ca_file,omitempty"`
	Port   int    `json:"port"`
	// Forward are the allowlist's loopback targets the init also listens
	// on, tunnelled through the proxy (backend.LoopbackForwards, in the parent).
	Forward []string `json:"forward,omitempty"`
}

// mountEgress binds the proxy's socket and CA bundle into the new root
// (in the init, before pivot_root).
func mountEgress(cfg *Config) error {
	e := cfg.Egress
	if e == nil {
		return nil
	}
	if err := bindReadOnly(e.Socket, cfg.Root+EgressSocket); err != nil {
		return fmt.Errorf("egress socket: %w", err)
	}
	if e.CAFile != "" {
		if err := bindReadOnly(e.CAFile, cfg.Root+EgressCA); err != nil {
			return fmt.Errorf("egress CA: %w", err)
		}
		// The bundle holds the system roots too, so it also stands in
		// for the system trust store, for tools that read only that
		// (regular files only: a symlink would be followed to the
		// host's file).
		for _, p := range cabundle.System {
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
func startForwarder(cfg *Config) error {
	e := cfg.Egress
	if e == nil {
		return nil
	}
	l, err := bridge.ListenLoopback("127.0.0.1:" + strconv.Itoa(e.Port))
	if err != nil {
		return fmt.Errorf("egress forwarder: %w", err)
	}
	go l.Serve(func(c io.ReadWriteCloser) { bridge.ToUnix(c, EgressSocket) })
	// Clients that never use a proxy for a loopback address (Go's
	// net/http) reach an allowed 127.0.0.1:PORT here, through the proxy.
	for _, target := range e.Forward {
		fl, err := bridge.ListenLoopback(target)
		if err != nil {
			return fmt.Errorf("egress forwarder for %s: %w", target, err)
		}
		go fl.Serve(func(c io.ReadWriteCloser) { bridge.Tunnel(c, EgressSocket, target) })
	}
	return nil
}
