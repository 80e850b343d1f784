package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/randhex"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Labels every container of this backend carries, so that Reconcile can
// tell leftovers of dead processes from containers in use.
const (
	LabelSandbox  = "pulse.sandbox"  // the sandbox (Backend) id
	LabelSession  = "pulse.session"  // the session id given with WithSessionID
	LabelHost     = "pulse.host"     // hostname of the owning process
	LabelPID      = "pulse.pid"      // pid of the owning process
	LabelPIDStart = "pulse.pidstart" // its start time, so a reused pid is not mistaken for it
)

// The hardened defaults, listed in Capabilities().Notes for `pulse doctor`.
var hardenedNotes = []string{
	"one warm container per sandbox and workspace, reused by every command",
	"network: none for deny-all (loopback only), bridge for allow-all; allowlist: none, plus the egress proxy bridged in on 127.0.0.1",
	"all capabilities dropped but CHOWN, DAC_OVERRIDE, FOWNER, SETUID, SETGID, SETPCAP, which only the wrapper around each command holds; the command's capability sets, the bounding set included, are empty; no-new-privileges",
	"read-only root filesystem; tmpfs /tmp; workspace copied in through a volume to a tmpfs, host workspace never mounted",
	"a warm container's request channel: a directory of FIFOs under the workspace's .pulse/docker/, bound in at " + chanMount + ", 0700 and root's (or a uid no process of the container has)",
	"each command runs as a uid of its own (20000 and up), never root, with no capabilities, in a working copy only that uid can enter (0700)",
	"concurrent commands of one container cannot signal, trace or read the memory of each other or of each other's wrapper, nor touch each other's working copy; they share /tmp (1777), the network, the container's limits and one group (gid 19999, through which caches are shared)",
	"memory, cpu and pids limits from ResourceLimits (WithContainerLimits) apply to the whole container; without them pids 1024 and memory 1 GiB (policy.DefaultPids, DefaultMemoryBytes)",
	"disk: the workspace, the commands' copies and their writes live on a tmpfs of limits.disk_bytes, the container's memory limit then being memory_bytes plus it (without disk_bytes: half of memory_bytes, at most 2 GiB, within it); a write past it fails with ENOSPC and the result says disk_limit",
	"seccomp: the namespace backend's deny list (ptrace, process_vm_*, io_uring, bpf, keyctl, mount, new namespaces, TIOCSTI/TIOCLINUX) replaces the engine's default profile",
	"/tmp and the working copies are tmpfs with exec allowed; the copy-in volume is a tmpfs of the scratch size",
	"timeouts and cancellation kill every process of the command's uid inside the container, setsid or not",
}

type options struct {
	image       string
	host        string
	cli         *client.Client
	logger      *slog.Logger
	session     string
	limits      policy.ResourceLimits
	scratchSize int64         // bytes; 0: limits.DiskBytes, else the default (scratchBytes)
	tools       string        // tools.go
	runtime     string        // runtime.go
	reuseIdle   time.Duration // warm.go; 0: no reuse across processes
}

// Option configures a Backend.
type Option func(*options) error

// WithImage sets the image; without it PULSE_DOCKER_IMAGE, then
// DefaultImage.
func WithImage(ref string) Option {
	return func(o *options) error {
		if strings.TrimSpace(ref) == "" {
			return errors.New("docker: empty image reference")
		}
		o.image = ref
		return nil
	}
}

// WithDockerHost sets the engine address (unix:///var/run/docker.sock,
// tcp://...); without it DOCKER_HOST and the default socket are used.
func WithDockerHost(host string) Option {
	return func(o *options) error { o.host = host; return nil }
}

// WithClient uses an existing Engine API client; Close does not close it.
func WithClient(c *client.Client) Option {
	return func(o *options) error {
		if c == nil {
			return errors.New("docker: nil client")
		}
		o.cli = c
		return nil
	}
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("docker: nil logger")
		}
		o.logger = l
		return nil
	}
}

// WithSessionID labels the backend's containers with a session id.
func WithSessionID(id string) Option {
	return func(o *options) error { o.session = id; return nil }
}

// WithContainerLimits sets the memory, cpu and pids limits of the
// containers. The engine applies them to the container as a whole, so they
// are fixed when the container is created; the Timeout, OutputBytes and
// FileSizeBytes of each Request still apply per command.
func WithContainerLimits(l policy.ResourceLimits) Option {
	return func(o *options) error {
		if l.MemoryBytes < 0 || l.CPUs < 0 || l.Pids < 0 || l.DiskBytes < 0 {
			return errors.New("docker: negative container limit")
		}
		o.limits = l
		return nil
	}
}

// WithScratchSize sets the size of the tmpfs holding the container's
// workspace and the commands' working copies and writes: bytes, or a
// number with k, m or g (binary units). It needs room for the workspace
// once plus once per concurrent command, plus what they write. A
// DiskBytes given with WithContainerLimits (the policy's
// limits.disk_bytes) takes its place; without either it is
// defaultScratch, or a quarter of the engine's memory if that is less.
// It is added to the container's memory limit (see scratchBytes).
func WithScratchSize(size string) Option {
	return func(o *options) error {
		n, err := parseSize(size)
		if err != nil || n <= 0 {
			return fmt.Errorf("docker: bad scratch size %q", size)
		}
		o.scratchSize = n
		return nil
	}
}

// parseSize reads a size as the engine's tmpfs options write it: digits,
// then an optional k, m or g (powers of 1024), either case.
func parseSize(s string) (int64, error) {
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			mult, s = 1<<10, s[:n-1]
		case 'm', 'M':
			mult, s = 1<<20, s[:n-1]
		case 'g', 'G':
			mult, s = 1<<30, s[:n-1]
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v * mult, nil
}

// Backend runs commands in Docker containers, one warm container per
// workspace and network mode.
type Backend struct {
	cli     *client.Client
	ownCli  bool
	o       options
	id      string
	log     *slog.Logger
	labels  map[string]string
	closeCh chan struct{}
	tools   string // the static busybox injected into containers, "" for none (tools.go)
	imageID string // the image's id, when Probe read it (warm.go keys on it)

	mu     sync.Mutex
	closed bool
	boxes  map[boxKey]*box
	wg     sync.WaitGroup // running Exec calls
}

var _ backend.Backend = (*Backend)(nil)

type boxKey struct {
	workspace string
	network   policy.NetworkMode
	// hidden is the request's sorted Hidden paths, NUL-joined: a
	// container holds only what its commands may read, and its baseline
	// is visible to all of them, so each hidden set gets its own.
	hidden string
	// caches is the request's caches (host dir and path), for the bind
	// mounts fixed at creation (caches.go).
	caches string
	// lane is the request's lane: a container's base holds one lane's
	// stack, so two lanes never share one (a command of one would see
	// the other's writes while both run).
	lane string
}

// New returns a Docker backend. It does not contact the engine: Probe
// does, and the first Exec creates the container.
func New(opts ...Option) (*Backend, error) {
	var o options
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.image == "" {
		o.image = os.Getenv(ImageEnv)
	}
	if o.image == "" {
		o.image = DefaultImage
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	// A container nobody set limits for still may not exhaust the host's
	// pids or memory (policy.WithIsolationDefaults).
	o.limits = o.limits.WithIsolationDefaults()
	b := &Backend{o: o, log: o.logger, boxes: map[boxKey]*box{}, closeCh: make(chan struct{}), tools: findTools(o.tools)}
	b.id = randomID()
	if o.cli != nil {
		b.cli = o.cli
	} else {
		copts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
		if o.host != "" {
			copts = append(copts, client.WithHost(o.host))
		}
		c, err := client.NewClientWithOpts(copts...)
		if err != nil {
			return nil, fmt.Errorf("docker: engine client: %w", err)
		}
		b.cli, b.ownCli = c, true
	}
	host, _ := os.Hostname()
	b.labels = map[string]string{
		LabelSandbox:  b.id,
		LabelSession:  o.session,
		LabelHost:     host,
		LabelPID:      strconv.Itoa(os.Getpid()),
		LabelPIDStart: procStart(os.Getpid()),
	}
	return b, nil
}

// ID is the sandbox id the backend's containers are labelled with.
func (b *Backend) ID() string { return b.id }

// Image is the image the backend runs.
func (b *Backend) Image() string { return b.o.image }

// Name implements backend.Backend.
func (b *Backend) Name() string { return "docker" }

// Probe implements backend.Backend: the engine must answer and the image
// must be present.
func (b *Backend) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The image first: the client's version negotiation has pinged the
	// engine by then, and a second ping would cost a round trip for
	// nothing. Only a failure asks whether the engine is there at all.
	insp, err := b.cli.ImageInspect(ctx, b.o.image)
	if err != nil {
		if _, perr := b.cli.Ping(ctx); perr != nil {
			return fmt.Errorf("docker: no engine answers at %s (%v); as root, start one with scripts/testenv.sh or `dockerd &`: %w",
				b.cli.DaemonHost(), perr, backend.ErrUnavailable)
		}
		if cerrdefs.IsNotFound(err) {
			return fmt.Errorf("docker: image %q is missing; build it with `pulse image build --tag %s`: %w",
				b.o.image, b.o.image, backend.ErrUnavailable)
		}
		return fmt.Errorf("docker: inspecting image %q: %v: %w", b.o.image, err, backend.ErrUnavailable)
	}
	b.mu.Lock()
	b.imageID = insp.ID
	b.mu.Unlock()
	return nil
}

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities {
	l := b.o.limits
	limits := map[policy.LimitKey]policy.EnforcementLevel{
		policy.LimitTimeout:       policy.Strong,
		policy.LimitOutputBytes:   policy.Strong,
		policy.LimitFileSizeBytes: policy.Strong,
		// The scratch tmpfs's size, which the kernel holds every write
		// to (scratchBytes).
		policy.LimitDiskBytes:   policy.Strong,
		policy.LimitMemoryBytes: policy.Unsupported,
		policy.LimitCPUs:        policy.Unsupported,
		policy.LimitPids:        policy.Unsupported,
	}
	// Container-wide limits are only as good as what New was given.
	if l.MemoryBytes > 0 {
		limits[policy.LimitMemoryBytes] = policy.Strong
	}
	if l.CPUs > 0 {
		limits[policy.LimitCPUs] = policy.Strong
	}
	if l.Pids > 0 {
		limits[policy.LimitPids] = policy.Strong
	}
	notes := append([]string{"image: " + b.o.image}, hardenedNotes...)
	allowlist := policy.Unsupported
	if egressCapable() {
		allowlist = policy.Strong // egress.go
	} else {
		notes = append(notes, "network allowlist: unsupported here (bridging the egress proxy into a container needs root)")
	}
	return backend.Capabilities{
		Isolation: backend.IsolationContainer,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{
			policy.NetworkDenyAll:   policy.Strong,
			policy.NetworkAllowAll:  policy.Strong,
			policy.NetworkAllowlist: allowlist,
		},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{
			secrets.DenyAll:   policy.Strong,
			secrets.AllowAll:  policy.Strong,
			secrets.Allowlist: policy.Strong,
		},
		CapturesWrites: true,
		HidesPaths:     true,
		StacksPending:  true,
		MountsCaches:   true,
		Limits:         limits,
		Notes:          notes,
	}
}

// Close implements backend.Backend: it removes the backend's containers,
// which ends every command still running, and waits for Exec calls. With
// WithReuse it ends the running commands, waits for them, and hands each
// warm container on to a later process instead (warm.go).
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.closeCh)
	boxes := b.boxes
	b.boxes = map[boxKey]*box{}
	b.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	var warm []*box
	for _, bx := range boxes {
		<-bx.ready
		if bx.id == "" {
			continue
		}
		if bx.slot != nil {
			warm = append(warm, bx)
			continue
		}
		if err := b.remove(ctx, bx.id); err != nil {
			errs = append(errs, err)
		}
		if err := bx.trust.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	b.wg.Wait()
	for _, bx := range warm {
		if err := b.releaseWarm(ctx, bx); err != nil {
			errs = append(errs, err)
		}
	}
	if b.ownCli {
		errs = append(errs, b.cli.Close())
	}
	return errors.Join(errs...)
}

func (b *Backend) remove(ctx context.Context, id string) error {
	err := b.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	// A removal already in progress (another process's Reconcile) is a
	// conflict to the engine (409); it ends with the container gone too.
	if err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
		return fmt.Errorf("docker: removing container %.12s: %w", id, err)
	}
	return nil
}

// Reconcile implements backend.Backend: it removes containers labelled by
// a process on this host that is no longer alive, and warm containers
// (WithReuse) that expired or whose holder died. Containers of live
// processes, warm ones held or fresh, and those of other hosts sharing
// the engine, are left alone.
//
// With WithReuse (a CLI, one process per command) it lists the engine's
// containers at most once per reconcileEvery on this host: warm
// containers end themselves when idle and a holder that died is found
// by the next taker of its slot (warm.go), so only the leftovers of dead
// processes wait, a bounded time; Collect (`pulse gc`) always looks.
func (b *Backend) Reconcile(ctx context.Context) error {
	stamp := ""
	if b.o.reuseIdle > 0 {
		stamp = reconcileStamp()
		if recentStamp(stamp, reconcileEvery) {
			return nil
		}
	}
	_, err := b.Collect(ctx)
	if err == nil && stamp != "" {
		touchStamp(stamp)
	}
	return err
}

// reconcileEvery bounds how often Reconcile of a Backend with reuse lists
// the engine's containers.
const reconcileEvery = 30 * time.Second

// reconcileStamp is the file whose mtime says when this user last
// reconciled on this host.
func reconcileStamp() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("pulse-docker-reconciled-%d", os.Geteuid()))
}

// recentStamp says whether p is this user's regular file, changed within
// d (and not in the future: a clock set back does not stop reconciling).
func recentStamp(p string, d time.Duration) bool {
	st, err := os.Lstat(p)
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() {
		return false
	}
	age := time.Since(st.ModTime())
	return age >= 0 && age < d
}

// touchStamp sets p's mtime to now, never through a symlink.
func touchStamp(p string) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return
	}
	_, _ = f.Write([]byte{'\n'})
	_ = f.Close()
}

// Collect is Reconcile that also returns the IDs of the containers it
// removed (`pulse gc`).
func (b *Backend) Collect(ctx context.Context) ([]string, error) {
	list, err := b.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelSandbox))})
	if err != nil {
		return nil, fmt.Errorf("docker: listing sandbox containers: %v: %w", err, backend.ErrUnavailable)
	}
	host := b.labels[LabelHost]
	var errs []error
	var removed []string
	for _, c := range list {
		if c.Labels[LabelHost] != host {
			continue
		}
		if _, ok := c.Labels[LabelWarm]; ok {
			gone, err := b.collectWarm(ctx, c)
			if err != nil {
				errs = append(errs, err)
			} else if gone {
				b.log.Info("removed a warm sandbox container", "container", c.ID, "slot", c.Labels[LabelWarm])
				removed = append(removed, c.ID)
			}
			continue
		}
		if c.Labels[LabelSandbox] == b.id {
			continue
		}
		pid, err := strconv.Atoi(c.Labels[LabelPID])
		if err == nil && pid > 0 && procStart(pid) != "" && procStart(pid) == c.Labels[LabelPIDStart] {
			continue // its owner is alive
		}
		b.log.Info("removing leftover sandbox container", "container", c.ID, "sandbox", c.Labels[LabelSandbox], "pid", c.Labels[LabelPID])
		if err := b.remove(ctx, c.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, c.ID)
	}
	return removed, errors.Join(errs...)
}

// procStart returns the start time of pid in clock ticks since boot (field
// 22 of /proc/PID/stat), or "" when there is no such process.
func procStart(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(data)
	// The command name may hold spaces and parentheses; fields start
	// after the last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func randomID() string {
	return randhex.String(8)
}
