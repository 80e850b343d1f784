package docker

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/internal/bridge"
	"github.com/pulse-agent/pulse/policy"
)

// Allowlist mode: the container keeps network=none (loopback only: no
// route, no resolver, no Docker DNS) and reaches the network only through
// the egress proxy. This process opens a listener on 127.0.0.1 inside the
// container's network namespace (setns on one locked thread, then back) —
// a bridged socket rather than an internal Docker network, because an
// internal network still reaches every port of the host's bridge address
// — and relays each connection to the proxy's unix socket. That needs
// privilege over the container's namespace: root, with the engine on this
// machine. Without it allowlist is unsupported (Capabilities), and an
// allowlist Exec fails closed.

// egressCAPath is where the command finds its CA bundle: the image's own
// roots plus the sandbox CA, written by the command's wrapper into /tmp
// (the root filesystem is read-only, and a file under /pulse would be
// taken for a workspace file).
const egressCAPath = "/tmp/pulse-egress/ca.pem"

// bridgeEgress prepares an allowlist request: a listener in the
// container's network namespace relaying to the proxy, and a request
// whose environment points at it. stop closes the bridge.
func (b *Backend) bridgeEgress(ctx context.Context, bx *box, req *backend.Request) (_ *backend.Request, stop func(), err error) {
	if req.Network.Mode != policy.NetworkAllowlist {
		return req, func() {}, nil
	}
	if !egressCapable() {
		return nil, nil, fmt.Errorf("docker: the egress bridge needs root on the engine's machine: %w", backend.ErrUnsupported)
	}
	info, err := b.cli.ContainerInspect(ctx, bx.id)
	if err != nil || info.State == nil || info.State.Pid <= 0 {
		return nil, nil, fmt.Errorf("docker: finding the sandbox container's process for the egress bridge: %v: %w", err, backend.ErrUnavailable)
	}
	l, err := listenInNetns(info.State.Pid)
	if err != nil {
		return nil, nil, fmt.Errorf("docker: egress bridge: %v: %w", err, backend.ErrUnavailable)
	}
	sock := req.Egress.Socket
	// The container outlives the command: a connection a leftover process
	// holds open is closed with the bridge, not left relaying.
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	stopped := false
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if stopped {
				mu.Unlock()
				c.Close()
				return
			}
			conns[c] = struct{}{}
			mu.Unlock()
			go func() {
				bridge.ToUnix(c, sock)
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	r := *req
	r.Env = make(map[string]string, len(req.Env)+16)
	for k, v := range req.Env {
		r.Env[k] = v
	}
	ca := ""
	if len(req.Egress.CA) > 0 {
		ca = egressCAPath
		r.Env["PULSE_EGRESS_CA"] = string(req.Egress.CA)
		// The wrapper writes the bundle, drops the variable and runs
		// the command as asked.
		const prep = `umask 022; mkdir -p /tmp/pulse-egress && { cat /etc/ssl/certs/ca-certificates.crt 2>/dev/null; printf '%s\n' "$PULSE_EGRESS_CA"; } > /tmp/pulse-egress/ca.pem.$$ && mv -f /tmp/pulse-egress/ca.pem.$$ ` + egressCAPath + `; unset PULSE_EGRESS_CA; `
		if r.Shell != "" {
			r.Args = []string{"/bin/sh", "-c", prep + `if [ -x /bin/bash ]; then exec /bin/bash -c "$1"; fi; exec /bin/sh -c "$1"`, "sh", r.Shell}
			r.Shell = ""
		} else {
			r.Args = append([]string{"/bin/sh", "-c", prep + `exec "$@"`, "sh"}, r.Args...)
		}
	}
	for k, v := range backend.ProxyEnv("http://127.0.0.1:"+strconv.Itoa(port), ca) {
		r.Env[k] = v
	}
	return &r, func() {
		l.Close()
		mu.Lock()
		stopped = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}, nil
}
