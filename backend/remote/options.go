package remote

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/protocol"
)

// Environment variables read by FromEnv.
const (
	EnvURL     = "PULSE_REMOTE_URL"
	EnvToken   = "PULSE_REMOTE_TOKEN"
	EnvTLSCert = "PULSE_TLS_CERT"
	EnvTLSKey  = "PULSE_TLS_KEY"
	EnvTLSCA   = "PULSE_TLS_CA"
)

// Defaults. The workspace limits are the server's defaults (protocol's),
// so that a workspace the server would refuse is refused here, before it
// is sent.
const (
	DefaultMaxCompressed       = protocol.DefaultMaxCompressed
	DefaultMaxUnpacked         = protocol.DefaultMaxUnpacked
	DefaultMaxMembers          = protocol.DefaultMaxMembers
	DefaultMaxStdin      int64 = 16 << 20
	DefaultMaxOverlay    int64 = 512 << 20
	// DefaultReconnect outlasts the server's detection of a dead
	// connection (a 20s ping answered within 20s): until then it refuses
	// a reattach as "already attached".
	DefaultReconnect   = 60 * time.Second
	DefaultCancelWait  = 15 * time.Second
	DefaultKeepalive   = 15 * time.Second
	DefaultDialTimeout = 10 * time.Second
)

var (
	// ErrConfig: New was given an unusable configuration.
	ErrConfig = errors.New("invalid remote backend configuration")
	// ErrNotConfigured: FromEnv found no PULSE_REMOTE_URL; remote execution
	// is not asked for.
	ErrNotConfigured = errors.New("remote backend not configured")
)

type options struct {
	url      string
	token    string
	certFile string
	keyFile  string
	caFile   string
	log      *slog.Logger
	// workspace bounds the upload, as the server's archive limits do.
	workspace   protocol.ArchiveLimits
	maxStdin    int64
	maxOverlay  int64
	reconnect   time.Duration
	cancelWait  time.Duration
	keepalive   time.Duration
	dialTimeout time.Duration
	progress    func(string)
}

// Option configures New.
type Option func(*options) error

// WithURL sets the server's WebSocket URL (ws:// or wss://).
func WithURL(u string) Option { return func(o *options) error { o.url = u; return nil } }

// WithToken sets the bearer token sent on every connection.
func WithToken(t string) Option { return func(o *options) error { o.token = t; return nil } }

// WithTLSFiles sets PEM files for wss://: a client certificate and its key
// (both or neither) and a CA bundle to verify the server with (empty: the
// system roots).
func WithTLSFiles(cert, key, ca string) Option {
	return func(o *options) error {
		o.certFile, o.keyFile, o.caFile = cert, key, ca
		return nil
	}
}

// WithLogger sets the structured logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) error { o.log = l; return nil } }

// WithWorkspaceLimits bounds the packed workspace: its compressed size,
// the bytes of its files and its number of entries. A workspace over any
// of them is refused before anything is sent. Zero keeps a default.
func WithWorkspaceLimits(compressed, unpacked int64, members int) Option {
	return func(o *options) error {
		if compressed < 0 || unpacked < 0 || members < 0 {
			return fmt.Errorf("negative workspace limit: %w", ErrConfig)
		}
		o.workspace = protocol.ArchiveLimits{MaxCompressed: compressed, MaxUnpacked: unpacked, MaxMembers: members}
		return nil
	}
}

// WithMaxStdinBytes bounds the standard input sent with a command (the
// protocol carries it whole, before the command starts).
func WithMaxStdinBytes(n int64) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("max stdin bytes %d: %w", n, ErrConfig)
		}
		o.maxStdin = n
		return nil
	}
}

// WithMaxOverlayBytes bounds the overlay archive accepted from the server.
func WithMaxOverlayBytes(n int64) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("max overlay bytes %d: %w", n, ErrConfig)
		}
		o.maxOverlay = n
		return nil
	}
}

// WithReconnectWindow sets how long a dropped connection is retried, with
// backoff, before a running execution is given up as unreachable.
func WithReconnectWindow(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("reconnect window %v: %w", d, ErrConfig)
		}
		o.reconnect = d
		return nil
	}
}

// WithCancelWait sets how long a cancelled execution waits for the
// server to confirm that the command ended.
func WithCancelWait(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("cancel wait %v: %w", d, ErrConfig)
		}
		o.cancelWait = d
		return nil
	}
}

// WithKeepalive sets the interval of WebSocket pings that detect a
// connection which died silently (<= 0 disables them).
func WithKeepalive(d time.Duration) Option {
	return func(o *options) error { o.keepalive = d; return nil }
}

// FromEnv builds a Backend from PULSE_REMOTE_URL, PULSE_REMOTE_TOKEN and
// PULSE_TLS_CERT/KEY/CA as read by getenv; opts are applied after them
// and win. It returns an error wrapping ErrNotConfigured when
// PULSE_REMOTE_URL is empty.
func FromEnv(getenv func(string) string, opts ...Option) (*Backend, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	u := strings.TrimSpace(getenv(EnvURL))
	if u == "" {
		return nil, fmt.Errorf("%s is not set: %w", EnvURL, ErrNotConfigured)
	}
	base := []Option{WithURL(u), WithToken(strings.TrimSpace(getenv(EnvToken)))}
	cert, key, ca := getenv(EnvTLSCert), getenv(EnvTLSKey), getenv(EnvTLSCA)
	if cert != "" || key != "" || ca != "" {
		base = append(base, WithTLSFiles(cert, key, ca))
	}
	return New(append(base, opts...)...)
}

// tlsConfig builds the client TLS configuration from the PEM files.
func (o *options) tlsConfig(host string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if (o.certFile == "") != (o.keyFile == "") {
		return nil, fmt.Errorf("%s and %s must be set together: %w", EnvTLSCert, EnvTLSKey, ErrConfig)
	}
	if o.certFile != "" {
		pair, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %v: %w", err, ErrConfig)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("CA bundle: %v: %w", err, ErrConfig)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA bundle %s holds no PEM certificate: %w", o.caFile, ErrConfig)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// checkURL validates the server URL and says whether it is encrypted.
func checkURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, fmt.Errorf("no server URL (set %s): %w", EnvURL, ErrConfig)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("server URL %q: %v: %w", raw, err, ErrConfig)
	}
	if u.Scheme != "ws" && u.Scheme != "wss" {
		return nil, fmt.Errorf("server URL %q: scheme must be ws or wss: %w", raw, ErrConfig)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("server URL %q has no host: %w", raw, ErrConfig)
	}
	if u.User != nil {
		return nil, fmt.Errorf("server URL must not carry credentials; use %s: %w", EnvToken, ErrConfig)
	}
	return u, nil
}

// loopback reports whether host names this machine, where a token sent in
// clear text crosses no network.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// WithProgress has the backend report slow steps a person may be waiting
// on — today the upload of a workspace of a MiB or more — as a line for a
// progress display, and "" when the step is over. It is called from Exec's
// goroutine and must not block.
func WithProgress(f func(step string)) Option {
	return func(o *options) error { o.progress = f; return nil }
}
