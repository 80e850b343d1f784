package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

// Error classes of the remote backend; test with errors.Is. Those that
// mean "cannot run commands" also wrap backend.ErrUnavailable.
var (
	// ErrUnauthorized: the server refused the token (HTTP 401).
	ErrUnauthorized = errors.New("remote server refused the token")
	// ErrUnreachable: no server answered at the URL (DNS, refused
	// connection, timeout), or the connection was lost and could not be
	// re-established within the reconnect window.
	ErrUnreachable = errors.New("remote server unreachable")
	// ErrTLS: the TLS handshake failed (unknown CA, bad certificate).
	ErrTLS = errors.New("remote TLS handshake failed")
	// ErrVersion: something answered, but not a pulse-server this client
	// can work with (not a WebSocket endpoint, or no capabilities action).
	ErrVersion = errors.New("remote server speaks another protocol version")
	// ErrCapacity: the server is running as many executions as it may.
	ErrCapacity = errors.New("remote server at capacity")
	// ErrExecutionLost: the server no longer knows how a started execution
	// ended: it restarted while the command ran (UNKNOWN), has no record
	// of it (NOT_FOUND), or the pulse-worker running it went away
	// (WORKER_LOST, wrapped with backend.ErrUnavailable). The command may
	// or may not have run to its end.
	ErrExecutionLost = errors.New("remote execution lost")
	// ErrTooLarge: the workspace or stdin is over a limit; nothing was
	// sent. Wrapped together with backend.ErrUnsupported.
	ErrTooLarge = errors.New("too large to send to the remote server")
	// ErrOverlay: the command ran but what it wrote could not be fetched,
	// was malformed, or was lost by the server. It is wrapped with
	// backend.ErrOverlayLost, and Exec returns the Result with it (see
	// that error's contract), never a Result that looks like no writes.
	ErrOverlay = errors.New("remote overlay not retrieved")
	// ErrProtocol: the server sent something this client cannot accept.
	ErrProtocol = errors.New("remote protocol violation")
)

// Backend runs commands on a pulse-server over its WebSocket protocol.
// Each Exec uses its own connection, which it re-establishes (and
// reattaches with the last event it saw) when it drops.
type Backend struct {
	o      options
	u      *url.URL
	client *http.Client
	log    *slog.Logger

	ctx    context.Context // cancelled by Close: every Exec ends
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	caps     *backend.Capabilities
	executor string
	// server is what the server's capabilities reply said about the
	// protocol, cached with caps.
	server serverInfo
	// legacy makes the client ignore the server's features, as against
	// a server that lists none; only tests set it.
	legacy bool
	// spare is a connection a one-question call (Probe, Reconcile) left
	// open, when it did, for the next call to use instead of dialling:
	// a CLI process probes, reconciles and runs one command, and each
	// dial is a TCP connect (and a TLS handshake) and an HTTP upgrade.
	spare    *link
	spareAt  time.Time
	spareFor time.Duration // defaultSpareFor; a test's may be longer
}

// defaultSpareFor is how long a spare connection is used: the calls a
// process makes one after another, not a connection idle long enough for
// a proxy or the server to have dropped it.
const defaultSpareFor = 2 * time.Second

// serverInfo is the protocol side of a capabilities reply: which additive
// submit fields the server honours.
type serverInfo struct {
	features map[string]bool
	maxStdin int64
}

var _ backend.Backend = (*Backend)(nil)

// New builds a remote backend. It checks the configuration only; Probe
// contacts the server.
func New(opts ...Option) (*Backend, error) {
	o := options{}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	def := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	o.workspace = o.workspace.WithDefaults()
	def(&o.maxStdin, DefaultMaxStdin)
	def(&o.maxOverlay, DefaultMaxOverlay)
	if o.reconnect <= 0 {
		o.reconnect = DefaultReconnect
	}
	if o.cancelWait <= 0 {
		o.cancelWait = DefaultCancelWait
	}
	if o.keepalive == 0 {
		o.keepalive = DefaultKeepalive
	}
	if o.dialTimeout <= 0 {
		o.dialTimeout = DefaultDialTimeout
	}
	u, err := checkURL(o.url)
	if err != nil {
		return nil, err
	}
	if o.token == "" {
		return nil, fmt.Errorf("no bearer token (set %s): %w", EnvToken, ErrConfig)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// WebSocket upgrades need HTTP/1.1.
	tr.ForceAttemptHTTP2 = false
	tr.Proxy = nil
	tlsFiles := o.certFile != "" || o.keyFile != "" || o.caFile != ""
	if u.Scheme == "wss" {
		cfg, err := o.tlsConfig(u.Hostname())
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = cfg
	} else if tlsFiles {
		// Fail closed: certificates were given, so encryption was meant.
		return nil, fmt.Errorf("TLS files are set but %s is ws://; use wss://: %w", u.Redacted(), ErrConfig)
	} else if !loopback(u.Hostname()) {
		o.log.Warn("the bearer token is sent unencrypted: use wss:// for a server on another machine", "url", u.Redacted())
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Backend{
		o: o, u: u, client: &http.Client{Transport: tr}, log: o.log,
		ctx: ctx, cancel: cancel, spareFor: defaultSpareFor,
	}, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "remote" }

// URL returns the server URL, for messages.
func (b *Backend) URL() string { return b.u.Redacted() }

// Executor names what runs commands on the server ("local:docker",
// "relay", ...) as its last Probe reported it; "" before one.
func (b *Backend) Executor() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.executor
}

// Probe connects, authenticates and fetches the server's capabilities,
// which Capabilities then reports. Its error wraps backend.ErrUnavailable
// and one of ErrUnreachable, ErrUnauthorized, ErrTLS or ErrVersion.
func (b *Backend) Probe(ctx context.Context) error {
	return b.onLink(ctx, func(l *link) error {
		_, err := b.fetchCapabilities(ctx, l)
		return err
	})
}

// onLink runs f on a connection (the spare one, else a new one), which is
// kept as the spare when f succeeded: the shared part of the calls that
// ask the server one thing (Probe, Reconcile).
func (b *Backend) onLink(ctx context.Context, f func(l *link) error) error {
	if b.isClosed() {
		return fmt.Errorf("remote: %w", backend.ErrClosed)
	}
	l, err := b.takeLink(ctx)
	if err != nil {
		return err
	}
	if err := f(l); err != nil {
		l.close()
		return err
	}
	b.keepLink(l)
	return nil
}

// takeLink returns the spare connection when it is fresh and up, else
// dials a new one.
func (b *Backend) takeLink(ctx context.Context) (*link, error) {
	b.mu.Lock()
	l, at := b.spare, b.spareAt
	b.spare = nil
	b.mu.Unlock()
	if l != nil {
		if time.Since(at) < b.spareFor && l.up() {
			return l, nil
		}
		l.close()
	}
	return b.dial(ctx)
}

// dropSpare closes the spare connection, if any.
func (b *Backend) dropSpare() {
	b.mu.Lock()
	l := b.spare
	b.spare = nil
	b.mu.Unlock()
	if l != nil {
		l.close()
	}
}

// keepLink makes l the spare connection, or closes it when there is one
// already or the backend is closed.
func (b *Backend) keepLink(l *link) {
	b.mu.Lock()
	if b.closed || b.spare != nil {
		b.mu.Unlock()
		l.close()
		return
	}
	b.spare, b.spareAt = l, time.Now()
	b.mu.Unlock()
}

// fetchCapabilities asks the server over l and caches the answer.
func (b *Backend) fetchCapabilities(ctx context.Context, l *link) (backend.Capabilities, error) {
	if l.caps != nil {
		// Answered with the upgrade (protocol.HeaderCapabilities).
		r := l.caps
		l.caps = nil
		return b.keepCapabilities(r), nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.o.dialTimeout)
	defer cancel()
	r, err := l.call(ctx, protocol.ActionCapabilities, &protocol.Empty{}, nil)
	if errors.Is(err, ErrProtocol) {
		return backend.Capabilities{}, fmt.Errorf("remote: %s answered the capabilities action with something else: is it a pulse-server? %w: %w",
			b.u.Redacted(), ErrVersion, backend.ErrUnavailable)
	}
	if err != nil {
		return backend.Capabilities{}, b.unreachable("capabilities", err)
	}
	if r.Code == protocol.CodeUnknown || r.Message == protocol.MsgUnknown {
		return backend.Capabilities{}, fmt.Errorf("remote: %s does not answer the capabilities action (a server older than this client): upgrade pulse-server: %w: %w",
			b.u.Redacted(), ErrVersion, backend.ErrUnavailable)
	}
	if r.Status != protocol.StatusCapabilities || r.Capabilities == nil {
		return backend.Capabilities{}, fmt.Errorf("remote: capabilities answered %q %q: %w: %w", r.Status, r.Message, ErrVersion, backend.ErrUnavailable)
	}
	return b.keepCapabilities(&r.Reply), nil
}

// keepCapabilities records a capabilities answer as what the server
// offers and returns what this backend then enforces.
func (b *Backend) keepCapabilities(r *protocol.Reply) backend.Capabilities {
	info := serverInfo{features: map[string]bool{}, maxStdin: r.MaxStdinBytes}
	b.mu.Lock()
	if !b.legacy {
		for _, f := range r.Features {
			info.features[f] = true
		}
	}
	caps := remoteCaps(*r.Capabilities, r.Executor, info)
	b.caps, b.executor, b.server = &caps, r.Executor, info
	b.mu.Unlock()
	return caps
}

// remoteCaps turns what the server's executor enforces into what this
// backend enforces: the same network and secret levels, writes always
// captured (the server returns an overlay whatever its executor), and the
// limits the server's executor enforces when the server takes submit
// limits (none but the timeout otherwise).
func remoteCaps(server backend.Capabilities, executor string, info serverInfo) backend.Capabilities {
	c := backend.Capabilities{
		Isolation:      backend.IsolationRemote,
		Network:        map[policy.NetworkMode]policy.EnforcementLevel{},
		Secrets:        map[secrets.Mode]policy.EnforcementLevel{},
		CapturesWrites: true,
		// Hidden paths are left out of the upload: the server never has
		// them to show.
		HidesPaths: true,
		// The upload is the workspace with the pending view laid over
		// it (pending.go), whatever the server.
		StacksPending: true,
		Limits: map[policy.LimitKey]policy.EnforcementLevel{
			policy.LimitTimeout: server.Limits[policy.LimitTimeout],
			// Enforced by this client: what reaches the writers is capped,
			// and the command is cancelled once it goes over.
			policy.LimitOutputBytes: policy.Strong,
		},
	}
	for _, k := range []policy.LimitKey{policy.LimitMemoryBytes, policy.LimitCPUs, policy.LimitPids, policy.LimitFileSizeBytes, policy.LimitDiskBytes} {
		// Sent in submit's limits only to a server that lists the
		// feature; the server's executor enforces them as it says.
		c.Limits[k] = policy.Unsupported
		if info.features[protocol.FeatureLimits] {
			c.Limits[k] = known(server.Limits[k])
		}
	}
	if c.Limits[policy.LimitTimeout] == "" {
		c.Limits[policy.LimitTimeout] = policy.BestEffort
	}
	for m, l := range server.Network {
		c.Network[m] = known(l)
	}
	for m, l := range server.Secrets {
		c.Secrets[m] = known(l)
	}
	c.Notes = append(c.Notes, fmt.Sprintf("commands run on the server by executor %q, isolation %q", executor, server.Isolation))
	if server.Isolation == backend.IsolationHostUnsafe {
		c.Notes = append(c.Notes, "UNSAFE: the server runs commands directly on its host")
	}
	switch {
	case info.features[protocol.FeatureProcess]:
		c.Notes = append(c.Notes, "Exec streams stdin while the command runs (input in memory travels whole with the submission)")
	case info.features[protocol.FeatureStdin]:
		c.Notes = append(c.Notes, "Exec sends stdin whole with the submission (no interactive input)")
	default:
		c.Notes = append(c.Notes, "Exec sends stdin whole as a file beside the workspace (the server has no stdin field; no interactive input)")
	}
	if info.features[protocol.FeatureProcess] {
		note := "started processes (Start) take their input while they run and can be signalled"
		if info.features[protocol.FeatureTTY] {
			note += ", run on a terminal"
		}
		if info.features[protocol.FeatureDial] {
			note += ", and be reached on exposed ports"
		}
		c.Notes = append(c.Notes, note)
	} else {
		c.Notes = append(c.Notes, "the server runs no background processes: Start and Expose are unsupported")
	}
	for _, n := range server.Notes {
		c.Notes = append(c.Notes, "server: "+n)
	}
	return c
}

// known maps a level this client does not know to Unsupported, so that a
// newer server's vocabulary never reads as enforcement.
func known(l policy.EnforcementLevel) policy.EnforcementLevel {
	switch l {
	case policy.Strong, policy.BestEffort:
		return l
	}
	return policy.Unsupported
}

// Capabilities implements backend.Backend: what the server reported at
// the last successful Probe, or, before one, every mode Unsupported so
// that a caller checking enforcement refuses to run.
func (b *Backend) Capabilities() backend.Capabilities {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.caps != nil {
		return *b.caps
	}
	return backend.Capabilities{
		Isolation:      backend.IsolationRemote,
		Network:        map[policy.NetworkMode]policy.EnforcementLevel{},
		Secrets:        map[secrets.Mode]policy.EnforcementLevel{},
		CapturesWrites: true,
		// The upload is the workspace with the pending view laid over
		// it (pending.go), whatever the server.
		StacksPending: true,
		Notes:         []string{"not probed yet: nothing is known to be enforced"},
	}
}

// Reconcile asks the server to remove the workspaces of this token's
// executions that ended or were never submitted; the server spares live
// executions and fresh uploads. It returns once the request is sent: the
// removals overlap the caller's own work, and on the server they run
// beside what this backend sends next on the connection Reconcile leaves
// (an Exec that follows it), instead of adding a round trip or holding
// that back. The answer is logged when a later read of the connection
// meets it; one still on its way when the connection closes is dropped
// with it.
func (b *Backend) Reconcile(ctx context.Context) error {
	return b.onLink(ctx, func(l *link) error {
		err := l.sendLater(ctx, protocol.ActionReconcile, &protocol.Empty{}, func(r *reply) {
			if r.isErr || r.Status != protocol.StatusReconciled {
				b.log.Warn("remote reconcile refused", "status", r.Status, "code", r.Code, "message", r.Message)
				return
			}
			b.log.Info("remote reconcile", "orphans_cleaned", r.Orphans)
		})
		if err != nil {
			return b.unreachable("reconcile", err)
		}
		return nil
	})
}

// Close cancels every running execution, waits for the server to confirm
// their end (at most the cancel wait), and refuses later calls. It is
// idempotent.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	spare := b.spare
	b.spare = nil
	b.mu.Unlock()
	if spare != nil {
		spare.close()
	}
	b.cancel()
	b.wg.Wait()
	b.client.CloseIdleConnections()
	return nil
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// begin registers an Exec so that Close waits for it.
func (b *Backend) begin() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.wg.Add(1)
	return true
}

// unreachable wraps a transport error met after the connection was up.
func (b *Backend) unreachable(what string, err error) error {
	if errors.Is(err, backend.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("remote: %s at %s: connection lost: %v: %w: %w", what, b.u.Redacted(), err, ErrUnreachable, backend.ErrUnavailable)
}

// backoff returns the pause before reconnect attempt n (0-based): 50ms
// doubling to 2s.
func backoff(n int) time.Duration {
	d := 50 * time.Millisecond
	for i := 0; i < n && d < 2*time.Second; i++ {
		d *= 2
	}
	return min(d, 2*time.Second)
}
