package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Name is the backend's stable identifier.
const Name = "host"

// DefaultPath is the PATH every command starts with unless Request.Env
// sets its own. It is fixed rather than copied from the caller, so that
// what a command finds does not depend on who called it.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// DefaultWaitDelay bounds how long Exec waits, once the command's process
// group has been killed, for output pipes that an escaped process (one
// that left the group with setsid) still holds open.
const DefaultWaitDelay = 2 * time.Second

// Option configures a Backend.
type Option func(*options) error

type options struct {
	logger    *slog.Logger
	shell     string
	waitDelay time.Duration
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("host: nil logger")
		}
		o.logger = l
		return nil
	}
}

// WithShell sets the shell that runs Request.Shell scripts, as an absolute
// path. The default is bash, or /bin/sh where bash is missing.
func WithShell(path string) Option {
	return func(o *options) error {
		if !filepath.IsAbs(path) {
			return fmt.Errorf("host: shell %q is not an absolute path", path)
		}
		o.shell = path
		return nil
	}
}

// WithWaitDelay sets how long Exec waits for output pipes after the
// command's process group is gone (DefaultWaitDelay).
func WithWaitDelay(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("host: wait delay %v is not positive", d)
		}
		o.waitDelay = d
		return nil
	}
}

// Backend runs commands directly on the host. It is safe for concurrent
// use.
type Backend struct {
	log       *slog.Logger
	shell     string // "" when no shell was found; Probe says why
	shellErr  error
	waitDelay time.Duration
	home      string
	user      string
	root      bool
	// treeBase is where each execution's cgroup is made (tree_linux.go);
	// "" where no v2 hierarchy is writable (or NoCgroupEnv), and a child
	// subreaper (reaper_linux.go), or else only the process group,
	// holds a command's processes.
	treeBase string

	mu      sync.Mutex
	closed  bool
	closing chan struct{} // closed by Close to end running executions
	running sync.WaitGroup
}

var _ backend.Backend = (*Backend)(nil)

// New returns a host backend. It fails only on a bad option; a machine
// without a shell gives a Backend whose Probe says so.
func New(opts ...Option) (*Backend, error) {
	o := options{}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.waitDelay == 0 {
		o.waitDelay = DefaultWaitDelay
	}
	// The first command's start would wait for the runtime's one-time
	// check; it runs while the caller does the rest of its set-up.
	backend.PrewarmProcessStart()
	b := &Backend{
		log:       o.logger.With("backend", Name),
		shell:     o.shell,
		waitDelay: o.waitDelay,
		closing:   make(chan struct{}),
		root:      os.Geteuid() == 0,
		treeBase:  treeBase(),
	}
	if b.shell == "" {
		b.shell, b.shellErr = findShell()
	} else if err := checkExecutable(b.shell); err != nil {
		b.shell, b.shellErr = "", err
	}
	// The base HOME and USER are the account's, not the caller's
	// environment's: tools expect a home that holds their caches, and the
	// workspace must not fill up with dotfiles.
	b.home, b.user = "/", ""
	if u, err := user.Current(); err == nil {
		b.home, b.user = u.HomeDir, u.Username
	} else if h, err := os.UserHomeDir(); err == nil {
		b.home = h
	}
	return b, nil
}

// findShell prefers bash and falls back to sh, searching the fixed
// DefaultPath first so that the caller's PATH does not pick the shell.
func findShell() (string, error) {
	for _, name := range []string{"bash", "sh"} {
		if p, err := lookPath(name, DefaultPath); err == nil {
			return p, nil
		}
		if p, err := exec.LookPath(name); err == nil && filepath.IsAbs(p) {
			return p, nil
		}
	}
	return "", errors.New("neither bash nor sh was found in " + DefaultPath + " or PATH")
}

// Name returns "host".
func (b *Backend) Name() string { return Name }

// Probe reports whether a shell was found; the host needs nothing else.
func (b *Backend) Probe(ctx context.Context) error {
	if !supported {
		return fmt.Errorf("%w: host: only Linux is supported", backend.ErrUnavailable)
	}
	if b.shell == "" {
		return fmt.Errorf("%w: host: %v; install bash or provide WithShell", backend.ErrUnavailable, b.shellErr)
	}
	return nil
}

// Capabilities says what running on the host can enforce: nothing about
// the network beyond leaving it as it is, secrets only as far as the
// environment goes (the disk is readable), and writes land in place.
func (b *Backend) Capabilities() backend.Capabilities {
	fsize := policy.Strong
	notes := []string{
		"UNSAFE: commands run as this user on this machine, with its network, its files and its processes in view",
		"writes land in the workspace directly; changes are found by comparing the tree before and after",
		"the environment is built from scratch (PATH, HOME, LANG, TERM, USER and the requested variables)",
	}
	notes = append(notes, trackingNote(b.treeBase))
	notes = append(notes, "not enforced: network restriction; memory, cpu and pids limits; read-deny rules for commands (they see the whole disk); no seccomp filter")
	if b.root {
		// A root process can raise its own hard limit again.
		fsize = policy.BestEffort
		notes = append(notes, "running as root: rlimits can be raised again by the command")
	}
	return backend.Capabilities{
		Isolation: backend.IsolationHostUnsafe,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{
			// The host's network is all the command gets and all it can
			// reach: allow-all is the one mode the host honours exactly.
			policy.NetworkAllowAll:  policy.Strong,
			policy.NetworkDenyAll:   policy.Unsupported,
			policy.NetworkAllowlist: policy.Unsupported,
		},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{
			secrets.AllowAll:  policy.Strong,
			secrets.DenyAll:   policy.BestEffort,
			secrets.Allowlist: policy.BestEffort,
		},
		CapturesWrites: false,
		Limits: map[policy.LimitKey]policy.EnforcementLevel{
			policy.LimitTimeout:       policy.BestEffort,
			policy.LimitOutputBytes:   policy.Strong,
			policy.LimitFileSizeBytes: fsize,
			policy.LimitMemoryBytes:   policy.Unsupported,
			policy.LimitCPUs:          policy.Unsupported,
			policy.LimitPids:          policy.Unsupported,
		},
		Notes: notes,
	}
}

// Reconcile kills the processes left by executions whose owner process is
// gone (SIGKILLed before it could end them, as a crashed pulse-server is)
// and removes their cgroups. It never touches a live owner's executions.
// Without a cgroup hierarchy there is nothing it can find.
func (b *Backend) Reconcile(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return reconcileTrees(b.treeBase)
}

// Close ends every running execution (they report Cancelled), waits for
// them, and makes later Exec calls fail with ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.closing)
	b.mu.Unlock()
	b.running.Wait()
	return nil
}

// begin registers one execution, or refuses after Close.
func (b *Backend) begin() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("host: %w", backend.ErrClosed)
	}
	b.running.Add(1)
	return nil
}

// closeReader closes r if it is an io.Closer, as the contract promises.
func closeReader(r io.Reader) {
	if c, ok := r.(io.Closer); ok {
		_ = c.Close()
	}
}
