package worker

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/internal/worker/runner"
)

// Config is the worker's configuration. FromEnv fills it from the
// environment variables of the design; BindFlags lets flags override it.
type Config struct {
	// RelayAddr is the relay's host:port, or several separated by
	// commas: the worker attaches to each (RELAY_ADDR).
	RelayAddr string
	// RelayEach attaches to every address each relay name resolves to,
	// looked up again every few seconds: the pods of a pulse-server
	// Deployment behind a headless Service (RELAY_EACH_ADDRESS).
	RelayEach     bool
	SandboxID     string // SANDBOX_ID
	Token         string // SANDBOX_TOKEN
	TLS           bool   // RELAY_TLS
	MaxConcurrent int    // WORKER_MAX_CONCURRENT
	Image         string // SANDBOX_IMAGE
	Trust         string // SANDBOX_TRUST
	// HealthListen, when set, is a plain-HTTP address serving /healthz
	// (the process is up) and /readyz (attached to the relay), for a
	// kubelet's probes (WORKER_HEALTH_LISTEN).
	HealthListen string
	// Isolation chooses what makes the executions' boxes
	// (WORKER_ISOLATION): "auto" (the default: the namespace backend,
	// else gVisor's runsc where namespaces cannot be made, else no box
	// and one execution at a time), "namespace" or "gvisor" (that one or
	// no box).
	Isolation string

	// Capabilities defaults to the programs of CapabilityProbes found on
	// PATH.
	Capabilities []string
	Heartbeat    time.Duration // default session.DefaultHeartbeat
	BackoffMin   time.Duration // default 500ms
	BackoffMax   time.Duration // default 5s
	// Env is the commands' environment; default the worker's own minus
	// SANDBOX_TOKEN.
	Env    []string
	Logger *slog.Logger
}

// Environment variable names, with the defaults of the design.
const (
	EnvRelayAddr     = "RELAY_ADDR"
	EnvSandboxID     = "SANDBOX_ID"
	EnvToken         = "SANDBOX_TOKEN"
	EnvTLS           = "RELAY_TLS"
	EnvMaxConcurrent = "WORKER_MAX_CONCURRENT"
	EnvImage         = "SANDBOX_IMAGE"
	EnvTrust         = "SANDBOX_TRUST"
	EnvHealthListen  = "WORKER_HEALTH_LISTEN"
	EnvRelayEach     = "RELAY_EACH_ADDRESS"
	EnvIsolation     = "WORKER_ISOLATION"
	// EnvTokenFile names a file holding the token, as Kubernetes mounts a
	// secret, so that it need not sit in the environment.
	EnvTokenFile = "SANDBOX_TOKEN_FILE"
)

// maxTokenFile bounds what SANDBOX_TOKEN_FILE may hold.
const maxTokenFile = 64 << 10

// DefaultToken is the token of the design's defaults, fit only for a
// development relay; Run warns when it is used.
const DefaultToken = "dev-token"

// ErrConfig marks an invalid configuration value.
var ErrConfig = errors.New("worker: invalid configuration")

// CapabilityProbes are the programs Hello reports when found on PATH.
var CapabilityProbes = []string{"bash", "rg", "base64", "file", "python3", "git"}

// Default returns the configuration with every default of the design.
func Default() Config {
	return Config{
		RelayAddr:     "localhost:8443",
		SandboxID:     "sbx-laptop-1",
		Token:         DefaultToken,
		MaxConcurrent: 4,
		Trust:         "untrusted",
		Isolation:     runner.IsolationAuto,
	}
}

// FromEnv returns Default overridden by the environment, read through
// getenv (os.Getenv in production). It fails only on values it cannot
// parse; call Validate once flags have been applied.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Default()
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	str(EnvRelayAddr, &c.RelayAddr)
	str(EnvSandboxID, &c.SandboxID)
	str(EnvToken, &c.Token)
	str(EnvImage, &c.Image)
	str(EnvTrust, &c.Trust)
	str(EnvHealthListen, &c.HealthListen)
	str(EnvIsolation, &c.Isolation)
	if path := getenv(EnvTokenFile); path != "" {
		if getenv(EnvToken) != "" {
			return c, fmt.Errorf("%w: %s and %s are both set; set one", ErrConfig, EnvToken, EnvTokenFile)
		}
		tok, err := readTokenFile(path)
		if err != nil {
			return c, fmt.Errorf("%w: %s: %w", ErrConfig, EnvTokenFile, err)
		}
		c.Token = tok
	}
	if v := getenv(EnvTLS); v != "" {
		b, err := parseBool(v)
		if err != nil {
			return c, fmt.Errorf("%w: %s=%q: %w", ErrConfig, EnvTLS, v, err)
		}
		c.TLS = b
	}
	if v := getenv(EnvRelayEach); v != "" {
		b, err := parseBool(v)
		if err != nil {
			return c, fmt.Errorf("%w: %s=%q: %w", ErrConfig, EnvRelayEach, v, err)
		}
		c.RelayEach = b
	}
	if v := getenv(EnvMaxConcurrent); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("%w: %s=%q: %w", ErrConfig, EnvMaxConcurrent, v, err)
		}
		c.MaxConcurrent = n
	}
	return c, nil
}

// BindFlags registers flags that override c's current values.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.RelayAddr, "relay-addr", c.RelayAddr, "relay host:port, or several separated by commas, each attached to ("+EnvRelayAddr+")")
	fs.BoolVar(&c.RelayEach, "relay-each-address", c.RelayEach, "attach to every address each relay name resolves to, re-resolved every 10s: the replicas behind a headless Service ("+EnvRelayEach+")")
	fs.StringVar(&c.SandboxID, "sandbox-id", c.SandboxID, "id reported in Hello ("+EnvSandboxID+")")
	fs.StringVar(&c.Token, "token", c.Token, "bearer token; prefer the environment, flags show in ps ("+EnvToken+")")
	fs.BoolVar(&c.TLS, "tls", c.TLS, "dial with TLS instead of h2c ("+EnvTLS+")")
	fs.IntVar(&c.MaxConcurrent, "max-concurrent", c.MaxConcurrent, "execs run at once ("+EnvMaxConcurrent+")")
	fs.StringVar(&c.Image, "image", c.Image, "image reported in Hello ("+EnvImage+")")
	fs.StringVar(&c.Trust, "trust", c.Trust, "trust level reported in Hello ("+EnvTrust+")")
	fs.StringVar(&c.Isolation, "isolation", c.Isolation, "what boxes each execution: auto (namespace, else gvisor), namespace or gvisor ("+EnvIsolation+")")
	fs.StringVar(&c.HealthListen, "health-listen", c.HealthListen, "plain-HTTP address serving /healthz and /readyz ("+EnvHealthListen+")")
}

// Validate reports the first invalid value.
func (c Config) Validate() error {
	switch {
	case len(c.RelayAddrs()) == 0:
		return fmt.Errorf("%w: empty relay address", ErrConfig)
	case c.SandboxID == "":
		return fmt.Errorf("%w: empty sandbox id", ErrConfig)
	case c.MaxConcurrent < 1 || c.MaxConcurrent > 1024:
		return fmt.Errorf("%w: max concurrent %d outside 1..1024", ErrConfig, c.MaxConcurrent)
	case c.BackoffMin < 0 || c.BackoffMax < 0 || (c.BackoffMax > 0 && c.BackoffMin > c.BackoffMax):
		return fmt.Errorf("%w: backoff %v..%v", ErrConfig, c.BackoffMin, c.BackoffMax)
	case !runner.ValidIsolation(c.Isolation):
		return fmt.Errorf("%w: isolation %q: want %s, %s or %s", ErrConfig, c.Isolation, runner.IsolationAuto, runner.IsolationNamespace, runner.IsolationGVisor)
	}
	if c.RelayEach {
		for _, a := range c.RelayAddrs() {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return fmt.Errorf("%w: relay %q with %s: %w", ErrConfig, a, EnvRelayEach, err)
			}
		}
	}
	return nil
}

// RelayAddrs returns the relay addresses of RelayAddr, each once.
func (c Config) RelayAddrs() []string {
	var out []string
	for _, a := range strings.Split(c.RelayAddr, ",") {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// readTokenFile reads a token file, dropping the trailing newline that
// `kubectl create secret --from-file` and editors leave.
func readTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxTokenFile {
		return "", fmt.Errorf("%s is larger than %d bytes", path, maxTokenFile)
	}
	tok := strings.TrimRight(string(b), " \t\r\n")
	if tok == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return tok, nil
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, errors.New("want 0 or 1")
}

// RequiredPrograms are what the relay's exec path runs on the worker: it
// makes each execution's directory with mktemp, moves the workspace in
// and out as base64 of a gzipped tar, runs the command under env -i bash,
// and removes the directory with rm. A worker image without one of them
// would run every command and then lose its writes, and say so only
// afterwards; Run refuses to start instead.
var RequiredPrograms = []string{"bash", "env", "mktemp", "cat", "rm", "base64", "tar", "gzip"}

// ErrMissingPrograms marks a worker that lacks a program of
// RequiredPrograms.
var ErrMissingPrograms = errors.New("worker: programs the relay's exec path needs are missing")

// CheckPrograms reports, wrapping ErrMissingPrograms, every program of
// RequiredPrograms that lookPath (exec.LookPath when nil) does not find.
func CheckPrograms(lookPath func(string) (string, error)) error {
	if lookPath == nil {
		lookPath = exec.LookPath
	}
	var missing []string
	for _, p := range RequiredPrograms {
		if _, err := lookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s not on PATH; add them to the worker image", ErrMissingPrograms, strings.Join(missing, ", "))
	}
	return nil
}

// execPathProbe runs, in a scratch directory ($1), the relay's own steps
// as it sends them (internal/server/relay): a workspace packed with tar
// and gzip, minus .pulse, through base64 and back, unpacked with
// --no-same-owner, directories made with mktemp and removed. BusyBox's
// tar has the program's name but not these options.
// It uses RequiredPrograms and bash's builtins alone.
const execPathProbe = `set -e
src=$(mktemp -d "$1/src.XXXXXX")
dst=$(mktemp -d "$1/dst.XXXXXX")
echo probe > "$src/file"
echo internal > "$src/.pulse"
(cd "$src" && tar -czf - --exclude=./.pulse .) | base64 > "$1/ws.b64"
base64 -d < "$1/ws.b64" | tar -xzpf - --no-same-owner -C "$dst"
test "$(cat "$dst/file")" = probe
test ! -e "$dst/.pulse"
rm -rf "$src" "$dst"
env -i bash -c true
`

// CheckExecPath runs the relay's exec path once, in a scratch directory,
// with env (the commands' environment; the worker's own when nil), and
// reports, wrapping ErrMissingPrograms, a step that fails here with what
// it printed: a program there in name only (BusyBox's tar lacks
// --exclude and --no-same-owner) would lose every command's writes.
func CheckExecPath(ctx context.Context, env []string) error {
	dir, err := os.MkdirTemp("", "pulse-worker-check-")
	if err != nil {
		return fmt.Errorf("worker: checking the exec path: %w", err)
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "bash", "-c", execPathProbe, "check", dir)
	if env != nil {
		cmd.Env = env
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: the relay's steps (tar -czf --exclude, base64, tar -xzpf --no-same-owner, mktemp) fail here: %v: %s; the worker image needs GNU tar, gzip and coreutils",
			ErrMissingPrograms, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DetectCapabilities returns the probes that lookPath finds (exec.LookPath
// when nil), in probe order.
func DetectCapabilities(lookPath func(string) (string, error)) []string {
	if lookPath == nil {
		lookPath = exec.LookPath
	}
	caps := []string{}
	for _, p := range CapabilityProbes {
		if _, err := lookPath(p); err == nil {
			caps = append(caps, p)
		}
	}
	return caps
}

// childEnv drops the worker's own secrets from env.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, EnvToken+"=") || strings.HasPrefix(kv, EnvTokenFile+"=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}
