package docker

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/docker/docker/api/types/mount"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/bridge"
	"github.com/pulse-agent/pulse/policy"
)

// Allowlist mode: the container keeps network=none (loopback only: no
// route, no resolver, no Docker DNS) and reaches the network only through
// the egress proxy. This process opens a listener on 127.0.0.1 inside the
// container's network namespace (setns on one locked thread, then back) —
// a bridged socket rather than an internal Docker network, because an
// internal network still reaches every port of the host's bridge address
// — and hands each connection to the proxy (Egress.ServeConn, when the
// proxy runs in this process) or relays it to the proxy's unix socket. That needs
// privilege over the container's namespace: root, with the engine on this
// machine. Without it allowlist is unsupported (Capabilities), and an
// allowlist Exec fails closed.

// trustStorePath is the trust store of an allowlist container: the
// system bundle path of Debian, Ubuntu, Alpine and Arch, which curl,
// OpenSSL, Go and most other TLS clients read when no variable says
// otherwise. The proxy variables' CA paths (SSL_CERT_FILE and the rest)
// point at it too.
const trustStorePath = "/etc/ssl/certs/ca-certificates.crt"

// trustStore is the host side of an allowlist container's trust store: a
// file of this machine's CA bundle plus every sandbox CA a command of the
// container was given, bound read-only over trustStorePath when the
// container is created (the root filesystem is read-only and a command
// may run without a shell, so nothing inside could write it). The image's
// own bundle at that path is shadowed: the bundle is this machine's
// roots, as on the namespace backend. The file only grows while the
// container lives, in place (the bind holds its inode): a command's CA is
// appended before the command starts, and a command running beside it
// sees the earlier CAs whole. It is removed with the container.
type trustStore struct {
	mu   sync.Mutex
	dir  string
	file string
	has  map[string]bool // CA PEMs already appended
}

// newTrustStore writes the file for a new allowlist container; nil (and
// no bind) when this machine has no CA bundle to start it with, since an
// empty trust store would break TLS to every allowed host.
func newTrustStore() (*trustStore, error) {
	roots := backend.SystemRoots()
	if len(roots) == 0 {
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "pulse-docker-trust-")
	if err != nil {
		return nil, fmt.Errorf("docker: egress trust store: %w", err)
	}
	t := &trustStore{dir: dir, file: filepath.Join(dir, "ca-certificates.crt"), has: map[string]bool{}}
	if err := os.WriteFile(t.file, roots, 0o644); err != nil {
		t.remove()
		return nil, fmt.Errorf("docker: egress trust store: %w", err)
	}
	return t, nil
}

// mounts is the bind of the trust store into the container.
func (t *trustStore) mounts() []mount.Mount {
	if t == nil {
		return nil
	}
	return []mount.Mount{{Type: mount.TypeBind, Source: t.file, Target: trustStorePath, ReadOnly: true}}
}

// add appends ca (PEM) unless it is there already.
func (t *trustStore) add(ca []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.has[string(ca)] {
		return nil
	}
	f, err := os.OpenFile(t.file, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("docker: egress trust store: %w", err)
	}
	_, err = f.Write(append(append([]byte{}, ca...), '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("docker: egress trust store: %w", err)
	}
	t.has[string(ca)] = true
	return nil
}

// remove deletes the host file; nil-safe. The error names the directory
// left on the host.
func (t *trustStore) remove() error {
	if t == nil {
		return nil
	}
	if err := os.RemoveAll(t.dir); err != nil {
		return fmt.Errorf("docker: egress trust store %s left: %w", t.dir, err)
	}
	return nil
}

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
	ca := ""
	if len(req.Egress.CA) > 0 {
		if bx.trust == nil {
			return nil, nil, fmt.Errorf("docker: this machine has no CA bundle to make the container's trust store from, so the sandbox CA cannot be trusted: %w", backend.ErrUnsupported)
		}
		if err := bx.trust.add(req.Egress.CA); err != nil {
			return nil, nil, fmt.Errorf("%v: %w", err, backend.ErrUnavailable)
		}
		ca = trustStorePath
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
	// The listener is this process's, so with the proxy here too a
	// connection goes to it at once: one relay (the proxy's) between the
	// command and the server, not the bridge's and the proxy's.
	relay := req.Egress.ServeConn
	if relay == nil {
		relay = func(c net.Conn) { bridge.ToUnix(c, sock) }
	}
	rs := &relays{}
	rs.serve(l, relay)
	b.forwardLoopback(rs, info.State.Pid, req, sock) // loopfwd.go
	port := l.Addr().(*net.TCPAddr).Port
	r := *req
	r.Env = make(map[string]string, len(req.Env)+16)
	for k, v := range req.Env {
		r.Env[k] = v
	}
	for k, v := range backend.ProxyEnv("http://127.0.0.1:"+strconv.Itoa(port), ca) {
		r.Env[k] = v
	}
	return &r, rs.stop, nil
}
