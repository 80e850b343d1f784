package namespace

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"
)

// Name is the backend's stable identifier.
const Name = "namespace"

// ErrOverlayTooLarge: the command wrote more than the backend holds in
// memory as one Result's overlay (4 GiB in all, 1 GiB per file). Exec then
// returns the Result, which says how the command ended, with a nil Overlay
// and an error wrapping this and backend.ErrOverlayLost.
var ErrOverlayTooLarge = errors.New("namespace: overlay too large")

// Option configures a Backend.
type Option func(*options) error

type options struct {
	logger     *slog.Logger
	readOnly   []string
	readWrite  []string
	stateDir   string
	hostname   string
	noPrestart bool
	poolSize   int
	probeCache string
	keeperIdle time.Duration // keeper_linux.go
	freshMasks bool          // a keeper's backend: each init walks /etc anew
	// phaseHook, set by tests only, receives the start-up trace: each
	// step of the backend and of the init, with its CLOCK_MONOTONIC time.
	phaseHook func(name string, monoNs int64)
}

// WithoutPrestart stops the backend from starting, after each Exec, the
// sandbox init the next Exec of the same network mode will use. Starting
// ahead halves the latency of an Exec at the cost of one idle process per
// network mode in use.
func WithoutPrestart() Option {
	return func(o *options) error {
		o.noPrestart = true
		return nil
	}
}

// DefaultPoolSize is how many idle inits per network mode the backend may
// keep ready by default: enough for 16 commands at once to start mostly
// warm. Each idle init costs about 0.4 MiB of private memory, 1.3 MiB
// proportional set size with the binary's shared pages, and about nine
// threads (see WithPoolSize).
const DefaultPoolSize = 16

// WithPoolSize sets the most sandbox inits per network mode the backend
// keeps started ahead (default DefaultPoolSize). It keeps as many as the
// most Execs of that mode it has seen running at once, within n: one for a
// caller that runs one command at a time, more after bursts. Each idle init
// is a process (a Go runtime with about nine threads, 0.4 MiB private memory,
// 1.3 MiB proportional set size) with its own namespaces and mounts, and an
// empty run directory. n must be at least 1; WithoutPrestart keeps none.
func WithPoolSize(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 1024 {
			return fmt.Errorf("namespace: pool size %d out of range 1..1024", n)
		}
		o.poolSize = n
		return nil
	}
}

// WithProbeCache remembers a successful Probe in file, so that later
// processes on the same machine skip the trial sandbox Probe runs: with a
// record that matches, Probe only checks the kernel's features (user
// namespaces allowed, overlayfs present). The record is keyed by the
// kernel (release and version), the executable re-run as the sandbox init
// (path, inode, size, modification time), the caller's uid and gid and
// the backend's configuration; a record that does not match exactly, or
// does not parse, is ignored and the full Probe runs and adds its own.
// The file keeps the newest few records, so that configurations taking
// turns on one machine (the CLI and a pulse-server, two builds) each find
// theirs. A wrong record cannot weaken isolation: an Exec whose sandbox
// cannot be set up fails with ErrUnavailable, as it would without the
// cache.
func WithProbeCache(file string) Option {
	return func(o *options) error {
		if !filepath.IsAbs(file) {
			return fmt.Errorf("namespace: probe cache %q is not absolute", file)
		}
		o.probeCache = filepath.Clean(file)
		return nil
	}
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("namespace: nil logger")
		}
		o.logger = l
		return nil
	}
}

// WithReadOnlyBind shows the host path dir, read-only, at the same path
// inside every sandbox (for example a toolchain outside /usr). Exec
// refuses, with backend.ErrInvalidRequest, a command whose workspace such
// a bind would cover or reach into: dir (or where it resolves to) at,
// above or below the workspace.
func WithReadOnlyBind(dir string) Option {
	return func(o *options) error {
		p, err := bindPath(dir)
		if err != nil {
			return err
		}
		o.readOnly = append(o.readOnly, p)
		return nil
	}
}

// WithReadWriteBind shows the host path dir, writable, at the same path
// inside every sandbox. Writes there land on the host directly and are not
// captured: use it only for caches the caller accepts to share. Exec
// refuses a command whose workspace it overlaps, as for WithReadOnlyBind.
func WithReadWriteBind(dir string) Option {
	return func(o *options) error {
		p, err := bindPath(dir)
		if err != nil {
			return err
		}
		o.readWrite = append(o.readWrite, p)
		return nil
	}
}

// WithStateDir sets where run directories (the mount points of a
// sandbox), pending layers and the keeper's socket are kept. The default is $XDG_RUNTIME_DIR/pulse-namespace, or without
// XDG_RUNTIME_DIR the user's cache directory's pulse/namespace (see
// defaultStateDir): never a name in the shared temporary directory that
// another user could take first. It must be this user's directory, on
// a filesystem overlayfs accepts as a lower layer (the pending layers).
func WithStateDir(dir string) Option {
	return func(o *options) error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("namespace: state dir %q is not absolute", dir)
		}
		o.stateDir = filepath.Clean(dir)
		return nil
	}
}

// WithHostname sets the sandbox's hostname (default "pulse-sandbox").
func WithHostname(name string) Option {
	return func(o *options) error {
		if name == "" || len(name) > 64 {
			return fmt.Errorf("namespace: bad hostname %q", name)
		}
		o.hostname = name
		return nil
	}
}

func bindPath(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("namespace: bind path %q is not absolute", dir)
	}
	p := filepath.Clean(dir)
	if p == "/" {
		return "", errors.New("namespace: refusing to bind /")
	}
	return p, nil
}

func buildOptions(opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.poolSize == 0 {
		o.poolSize = DefaultPoolSize
	}
	if o.hostname == "" {
		o.hostname = "pulse-sandbox"
	}
	return o, nil
}

// WithKeeper lets the backend take the init for its first command from
// this binary's keeper, and start one where there is none, which then
// keeps an init ready for the next process with this state dir and
// hostname until idle passes without a request (see keeper_linux.go). It
// is for processes that run one command each (a CLI), which would
// otherwise start an init per command. idle must be positive.
func WithKeeper(idle time.Duration) Option {
	return func(o *options) error {
		if idle <= 0 {
			return fmt.Errorf("namespace: WithKeeper: idle time %s is not positive", idle)
		}
		o.keeperIdle = idle
		return nil
	}
}
