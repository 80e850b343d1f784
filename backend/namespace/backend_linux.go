package namespace

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/internal/cacheshare"
	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/internal/randhex"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// initCalled is set by Init in every process that calls it, so the parent
// can tell whether re-running its own binary reaches Init or the
// program's own main.
var initCalled atomic.Bool

// Backend runs commands in Linux namespaces. It is safe for concurrent use.
type Backend struct {
	o options

	mu     sync.Mutex
	closed bool
	// quit is closed by Close: a refill waiting for its command's
	// client (backend.BackgroundAfter) gives up.
	quit    chan struct{}
	running map[*initProc]func(backend.TerminationReason)
	// Inits started ahead, by "has its own net namespace", oldest
	// first; see pool.
	warm    map[bool][]*initProc
	filling map[bool]bool
	// ahead is closed when the init StartAhead is starting for that
	// network mode is in warm (or failed); an Exec waits for it rather
	// than starting a second one.
	ahead map[bool]chan struct{}
	// inflight counts the running Execs of each network mode, and peak
	// the most seen at once: the pool of that mode is kept that large
	// (within the configured size), so a caller that runs one command at
	// a time holds one idle init, and a bursty one as many as its bursts.
	inflight map[bool]int
	peak     map[bool]int
	// freeRuns are finished runs' directories, emptied and still locked,
	// that newRun hands out again (see recycleRun).
	freeRuns []*run
	// leftovers are the run directories that could not be removed (a
	// command's writes may still be in them); Close reports them.
	leftovers []error
	wg        sync.WaitGroup

	probeMu  sync.Mutex
	probeOK  bool
	landlock int // landlock ABI version, 0 when absent
	// path is the default PATH of commands (see sandboxPath).
	path string
	cg   cgroupSupport
	// scratch: what commands write goes to a size-limited tmpfs
	// (scratch_linux.go); false on kernels whose tmpfs cannot be the
	// upper layer.
	scratch bool

	// The separate init program, when one is installed and trusted
	// (initprog_linux.go): looked for once; used once a probe ran with it;
	// off once it failed the probe or the backend is closed.
	progMu     sync.Mutex
	progLooked bool
	progState  int // progFound, progTrial, progTrusted
	progOff    bool
	prog       *initProgram
}

var _ backend.Backend = (*Backend)(nil)

// New returns a namespace backend. It does not touch the system; Probe
// does.
func New(opts ...Option) (*Backend, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if o.stateDir == "" {
		o.stateDir = defaultStateDir()
	}
	b := &Backend{o: o, running: map[*initProc]func(backend.TerminationReason){},
		warm: map[bool][]*initProc{}, filling: map[bool]bool{}, ahead: map[bool]chan struct{}{},
		inflight: map[bool]int{}, peak: map[bool]int{}, quit: make(chan struct{})}
	if o.keeperIdle > 0 {
		// The first Exec most likely adopts an init from the keeper, whose
		// static config carries the /etc masks: the walk would be for
		// nothing. Where it does not, the init's start walks.
		backend.PrewarmProcessStart()
	} else {
		Prewarm()
	}
	b.landlock = nsinit.LandlockABI()
	b.cg = detectCgroups()
	b.scratch = scratchKernel()
	b.path = sandboxPath(os.Getenv("PATH"), o.readOnly)
	return b, nil
}

// basePath is the PATH every command gets at least.
const basePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// sandboxPath is the default PATH of commands: basePath, then the
// caller's PATH entries that the sandbox shows — under the read-only
// system directories or an extra read-only bind — so that a toolchain
// installed in, say, /usr/local/go/bin is found inside as outside. PATH
// is not a secret, and entries the sandbox does not show (a home
// directory) are left out rather than pointing at nothing.
func sandboxPath(hostPath string, readOnly []string) string {
	seen := map[string]bool{}
	out := strings.Split(basePath, ":")
	for _, d := range out {
		seen[d] = true
	}
	visible := func(d string) bool {
		for _, root := range append([]string{"/usr", "/bin", "/sbin"}, readOnly...) {
			if d == root || strings.HasPrefix(d, strings.TrimSuffix(root, "/")+"/") {
				return true
			}
		}
		return false
	}
	for _, d := range strings.Split(hostPath, ":") {
		if d == "" || !filepath.IsAbs(d) || d != filepath.Clean(d) || seen[d] || !visible(d) {
			continue
		}
		seen[d] = true
		out = append(out, d)
	}
	return strings.Join(out, ":")
}

// defaultStateDir is where runs and the keeper live unless WithStateDir
// says: $XDG_RUNTIME_DIR/pulse-namespace, a directory only this user can
// write in; without one, the user's cache directory
// ($XDG_CACHE_HOME/pulse/namespace, ~/.cache/pulse/namespace). Not a fixed
// name in the shared temporary directory: another local user could make
// it first, and a state dir this user does not own is refused
// (checkStateDir), which disabled the backend until root removed it. The
// fixed name in the temporary directory is still used where it is this
// user's already (made by an earlier pulse: nobody else can take or
// replace it there), so that its keeper and runs are found, and as the
// last resort of a user without a home (or one whose home cannot hold
// the cache directory).
func defaultStateDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "pulse-namespace")
	}
	tmp := filepath.Join(os.TempDir(), "pulse-namespace-"+strconv.Itoa(os.Getuid()))
	if checkStateDir(tmp) == nil {
		return tmp
	}
	// The cache directory only where it can be made: a user whose home
	// cannot hold one (HOME=/nonexistent, as service accounts have)
	// keeps the name in the temporary directory, as before.
	if c, err := os.UserCacheDir(); err == nil && filepath.IsAbs(c) {
		d := filepath.Join(c, "pulse", "namespace")
		if os.MkdirAll(d, 0o700) == nil {
			return d
		}
	}
	return tmp
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return Name }

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities {
	limits := map[policy.LimitKey]policy.EnforcementLevel{
		policy.LimitTimeout:       policy.Strong,
		policy.LimitOutputBytes:   policy.Strong,
		policy.LimitFileSizeBytes: policy.Strong,
		policy.LimitMemoryBytes:   policy.BestEffort,
		policy.LimitPids:          policy.BestEffort,
		policy.LimitCPUs:          policy.Unsupported,
	}
	notes := []string{
		"new user, mount, pid, ipc, uts and cgroup namespaces per command; net namespace unless allow-all",
		"workspace read-only under overlayfs; writes captured",
		"own session, no controlling terminal; descriptors above stderr closed; stdin relayed through a pipe",
		"no_new_privs, all capabilities dropped, seccomp filter (mount, ptrace, bpf, keyctl, kexec, userfaultfd, io_uring, TIOCSTI/TIOCLINUX, new namespaces refused)",
	}
	if b.cg.pids && b.cg.memory {
		notes = append(notes, fmt.Sprintf("without a policy limit: pids %d, memory %d MiB (cgroup)", policy.DefaultPids, policy.DefaultMemoryBytes>>20))
	}
	notes = append(notes, "read-denied paths are absent from the command's view (overlay whiteouts)")
	if b.cg.memory {
		limits[policy.LimitMemoryBytes] = policy.Strong
	} else {
		notes = append(notes, "memory limit: no writable memory cgroup; RLIMIT_DATA only")
	}
	if b.cg.pids {
		limits[policy.LimitPids] = policy.Strong
	} else {
		notes = append(notes, "pids limit: no writable pids cgroup; RLIMIT_NPROC only")
	}
	if b.cg.cpu {
		limits[policy.LimitCPUs] = policy.Strong
	} else {
		notes = append(notes, "cpu limit: no writable cpu cgroup")
	}
	if b.scratch {
		limits[policy.LimitDiskBytes] = policy.Strong
		notes = append(notes, "what a command writes is held in a size- and inode-limited tmpfs (limits.disk_bytes); it counts toward memory too")
	} else {
		notes = append(notes, "disk_bytes: the kernel's tmpfs cannot be the overlay's upper layer here (before Linux 6.6); writes go to the state dir, unbounded while the command runs")
	}
	if b.landlock > 0 {
		notes = append(notes, fmt.Sprintf("landlock ABI %d: writes confined to workspace, /tmp, home, /dev and caches", b.landlock))
	} else {
		notes = append(notes, "landlock: not available in this kernel (mount layout still confines writes)")
	}
	if !b.o.noPrestart {
		notes = append(notes, fmt.Sprintf("idle sandbox inits are kept ready per network mode in use, as many as the most commands run at once, up to %d (WithPoolSize, WithoutPrestart)", b.o.poolSize))
	}
	return backend.Capabilities{
		Isolation: backend.IsolationNamespace,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{
			policy.NetworkDenyAll:   policy.Strong,
			policy.NetworkAllowAll:  policy.Strong,
			policy.NetworkAllowlist: policy.Strong, // through the egress proxy in Request.Egress
		},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{
			secrets.DenyAll:   policy.Strong,
			secrets.Allowlist: policy.Strong,
			secrets.AllowAll:  policy.Strong,
		},
		CapturesWrites: true,
		HidesPaths:     true,
		StacksPending:  true,
		MountsCaches:   true,
		Limits:         limits,
		Notes:          notes,
	}
}

// Probe implements backend.Backend: it checks the kernel's features, then
// runs `true` in a sandbox once and caches success (across processes too,
// with WithProbeCache). Like any Exec, a successful trial run leaves one
// init waiting for the next Exec (see WithoutPrestart); Close ends it.
func (b *Backend) Probe(ctx context.Context) error {
	b.probeMu.Lock()
	defer b.probeMu.Unlock()
	if b.probeOK {
		return nil
	}
	if err := staticProbe(); err != nil {
		return err
	}
	// refusedKey records a probe that found the separate init program
	// unusable and passed with this binary as the init.
	key, refusedKey := "", ""
	if b.o.probeCache != "" {
		var err error
		if key, err = b.probeKey(false); err != nil {
			b.o.logger.Debug("namespace: probe cache unused", slog.Any("err", err))
		}
		if b.probeCached(key) {
			b.setInitProg(progTrusted)
			b.probeOK = true
			return nil
		}
		if b.foundInitProg() != nil {
			refusedKey, _ = b.probeKey(true)
			if b.probeCached(refusedKey) {
				b.dropInitProg(nil)
				b.probeOK = true
				return nil
			}
		}
	}
	ws, err := os.MkdirTemp("", "pulse-namespace-probe-")
	if err != nil {
		return fmt.Errorf("%w: namespace: temp dir: %v", backend.ErrUnavailable, err)
	}
	defer os.RemoveAll(ws)
	trial := b.foundInitProg() != nil
	if trial {
		b.setInitProg(progTrial)
	}
	err = b.probeRun(ctx, ws)
	if err == nil && trial {
		b.setInitProg(progTrusted)
	}
	if err != nil && trial && ctx.Err() != nil {
		// Cut short, not refused: a later probe tries the program again
		// (an Exec's probe, probeForInitProg, has the Exec's deadline).
		b.setInitProg(progFound)
		return fmt.Errorf("%w: namespace: probe: %w", backend.ErrUnavailable, ctx.Err())
	}
	if err != nil && trial {
		// The separate init program cannot serve (another build, or it
		// does not run here): this binary is the init from now on, and
		// the probe says whether that works.
		b.dropInitProg(err)
		key = refusedKey
		err = b.probeRun(ctx, ws)
	}
	if err != nil {
		return err
	}
	b.probeOK = true
	b.rememberProbe(key)
	return nil
}

// probeRun runs the probe command, `true`, in workspace ws, in an init
// started for it: one started ahead was started before the trial (from
// this binary, not the init program on trial), and passing on it would
// trust a program that never ran.
func (b *Backend) probeRun(ctx context.Context, ws string) error {
	res, err := b.execWith(ctx, &backend.Request{
		ExecutionID: "probe",
		Workspace:   ws,
		Args:        []string{"true"},
		Limits:      policy.ResourceLimits{Timeout: 30 * time.Second},
	}, nil, true)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%w: namespace: probe command `true` ended %s with code %d", backend.ErrUnavailable, res.Termination, res.ExitCode)
	}
	return nil
}

// staticProbe looks for what the kernel must offer, naming what is missing.
func staticProbe() error {
	if !initCalled.Load() {
		return fmt.Errorf("%w: namespace: namespace.Init was not called at the top of main (or TestMain)", backend.ErrUnavailable)
	}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		return fmt.Errorf("%w: namespace: kernel has no user namespaces (CONFIG_USER_NS)", backend.ErrUnavailable)
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return fmt.Errorf("%w: namespace: user namespaces are disabled (sysctl user.max_user_namespaces=0)", backend.ErrUnavailable)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(b)) == "0" && os.Getuid() != 0 {
		return fmt.Errorf("%w: namespace: unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone=0)", backend.ErrUnavailable)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil && strings.TrimSpace(string(b)) == "1" && os.Getuid() != 0 {
		return fmt.Errorf("%w: namespace: AppArmor restricts unprivileged user namespaces (sysctl kernel.apparmor_restrict_unprivileged_userns=1)", backend.ErrUnavailable)
	}
	fsys, err := os.ReadFile("/proc/filesystems")
	if err == nil && !bytes.Contains(fsys, []byte("\toverlay\n")) {
		// overlay may be a module that loads on first mount; only a
		// failed trial mount is conclusive, so this is a hint.
		if _, err := os.Stat("/sys/module/overlay"); err != nil {
			if _, err := os.Stat("/lib/modules"); err != nil {
				return fmt.Errorf("%w: namespace: kernel has no overlayfs", backend.ErrUnavailable)
			}
		}
	}
	return nil
}

// Exec implements backend.Backend.
func (b *Backend) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	if !initCalled.Load() {
		return nil, fmt.Errorf("%w: namespace: namespace.Init was not called at the top of main (or TestMain)", backend.ErrUnavailable)
	}
	return b.exec(ctx, req, nil)
}

// Reconcile implements backend.Backend: it removes run directories whose
// owner no longer holds their lock, and cgroups whose owner is gone.
func (b *Backend) Reconcile(ctx context.Context) error {
	entries, err := os.ReadDir(b.o.stateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return b.cg.reconcile()
	}
	if err != nil {
		return fmt.Errorf("namespace: reconcile: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !e.IsDir() && isKeeperLock(e.Name()) {
			reconcileKeeper(filepath.Join(b.o.stateDir, e.Name()))
			continue
		}
		if !e.IsDir() || e.Name() == layersDir {
			continue
		}
		dir := filepath.Join(b.o.stateDir, e.Name())
		lf, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|unix.O_NOFOLLOW, 0)
		if err == nil {
			err = flock.TryLock(lf)
			if err != nil {
				lf.Close()
				continue // a live run holds it
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		} else if info, ierr := e.Info(); ierr != nil || time.Since(info.ModTime()) < halfRunAge {
			// No lock file yet: a run being created right now, unless it
			// is old enough to be one that crashed while being created.
			continue
		}
		b.o.logger.Info("namespace: removing leftover run directory", slog.String("dir", dir))
		if err := removeAll(dir); err != nil {
			errs = append(errs, err)
		}
		if lf != nil {
			lf.Close()
		}
	}
	if err := b.cg.reconcile(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// halfRunAge is how old a run directory without a lock file must be for
// Reconcile to take it for the leftover of a crash rather than a run being
// created at this moment (which takes microseconds).
const halfRunAge = time.Minute

// Close implements backend.Backend: it kills running commands and waits
// for their Exec calls to return. Its error names every run directory
// (a command's overlay, its writes) that could not be removed since the
// backend was made.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.quit)
	for _, kill := range b.running {
		kill(backend.Cancelled)
	}
	var warm []*initProc
	for k, ps := range b.warm {
		warm = append(warm, ps...)
		delete(b.warm, k)
	}
	b.mu.Unlock()
	for _, p := range warm {
		p.discard()
	}
	b.wg.Wait()
	// Every recycleRun ran under b.wg, and those after closed was set
	// removed their run instead of keeping it.
	b.mu.Lock()
	free := b.freeRuns
	b.freeRuns = nil
	b.mu.Unlock()
	for _, r := range free {
		b.removeRunDir(r)
	}
	b.closeInitProg()
	b.mu.Lock()
	left := b.leftovers
	b.leftovers = nil
	b.mu.Unlock()
	return errors.Join(left...)
}

// removeRunDir removes a run for good; one that cannot be removed is
// logged and kept in b.leftovers, for Close to report: what a command
// wrote may be left in it, and the caller must know.
func (b *Backend) removeRunDir(r *run) {
	if err := r.remove(); err != nil {
		b.o.logger.Warn("namespace: removing run directory", slog.String("dir", r.dir), slog.Any("err", err))
		b.mu.Lock()
		b.leftovers = append(b.leftovers, fmt.Errorf("namespace: run directory %s left: %w", r.dir, err))
		b.mu.Unlock()
	}
}

// run is the host side state of one execution.
type run struct {
	dir  string
	lock *os.File
}

// runLockHook, when set (by tests), runs between the creation of a new
// run's lock file and its locking.
var runLockHook func(dir string)

// runSubdirs are the directories of a run: the overlay's upper and work
// directories and the mount point of the sandbox's root.
var runSubdirs = []string{"upper", "work", "root", "scratch"}

// newRun returns a run directory, locked, with empty runSubdirs: one a
// finished run left (recycleRun), or a new one.
func (b *Backend) newRun() (*run, error) {
	b.mu.Lock()
	if n := len(b.freeRuns); n > 0 && !b.closed {
		r := b.freeRuns[n-1]
		b.freeRuns = b.freeRuns[:n-1]
		b.mu.Unlock()
		return r, nil
	}
	b.mu.Unlock()
	if err := b.makeStateDir(); err != nil {
		return nil, err
	}
	dir := filepath.Join(b.o.stateDir, strconv.Itoa(os.Getpid())+"-"+randhex.String(8))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	// The lock is made under another name and named "lock" only once it
	// is held: Reconcile (of this process or another sharing the state
	// dir) takes a run whose "lock" it can lock for a dead one's, and a
	// run without one for a run being made, until it is old.
	tmp := filepath.Join(dir, "lock.new")
	lock, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if runLockHook != nil {
		runLockHook(dir)
	}
	if err := flock.TryLock(lock); err != nil {
		lock.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "lock")); err != nil {
		lock.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	for _, d := range runSubdirs {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			lock.Close()
			os.RemoveAll(dir)
			return nil, err
		}
	}
	return &run{dir: dir, lock: lock}, nil
}

// makeStateDir makes the state dir if it is missing and checks that it is
// this user's (checkStateDir).
func (b *Backend) makeStateDir() error {
	if err := os.MkdirAll(b.o.stateDir, 0o700); err != nil {
		return err
	}
	return checkStateDir(b.o.stateDir)
}

// errStateDirNotOwn: the state dir is not a directory of this user's.
var errStateDirNotOwn = errors.New("state dir not owned by this user")

// checkStateDir reports an error unless dir is a directory (not a
// symlink) owned by this process's uid. A state dir someone else owns
// (e.g. squatted in /tmp) could be swapped under us, and whatever is in it
// is theirs: no run is made in it, no keeper's socket is dialled there and
// no keeper listens there.
func checkStateDir(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() || st.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
		return fmt.Errorf("%w: %s is not a directory of uid %d (another user may have made it first; set XDG_RUNTIME_DIR, or remove it)", errStateDirNotOwn, dir, os.Getuid())
	}
	return nil
}

// removeRun recycles a finished run's directory in the background: the
// command is dead and its overlay read, so the caller need not wait for
// the unlink of a tree the command may have filled. The run stays locked
// until it is gone or reused, so Reconcile leaves it alone; Close waits
// for it. The caller must hold a count on b.wg (a tracked execution) so
// that this Add cannot race with Close's Wait.
func (b *Backend) removeRun(r *run) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.recycleRun(r)
	}()
}

// recycleRun empties the run of an init that has been reaped, for newRun
// to hand out again, or removes it when it cannot be emptied, the backend
// is closed or as many runs as the pool may hold inits are kept already.
// Making and removing a run's directories was a measurable part of every
// Exec: on ext4 each new inode is looked for past the recently freed ones.
// The init being reaped, its mount namespace and with it the overlay are
// gone (the kernel tears a namespace's mounts down before its last
// process can be waited for), so nothing writes the directories any more.
// Kept: the run directory, its lock (still held) and the work and root
// directories, emptied; the work directory is overlayfs's own, never
// visible to the command, and root only the host side of a mount point.
// The upper directory is made anew: it was the workspace's root in the
// overlay, whose mode, times and extended attributes the command could
// change, and a command must find exactly what the workspace holds.
func (b *Backend) recycleRun(r *run) {
	err := r.empty()
	if err == nil {
		b.mu.Lock()
		if !b.closed && len(b.freeRuns) < b.o.poolSize {
			b.freeRuns = append(b.freeRuns, r)
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
	b.removeRunDir(r)
}

// empty makes the run's subdirectories what newRun makes: the upper
// directory new, the others empty.
func (r *run) empty() error {
	upper := filepath.Join(r.dir, "upper")
	if err := removeAll(upper); err != nil {
		return err
	}
	if err := os.Mkdir(upper, 0o700); err != nil {
		return err
	}
	if err := emptyDir(filepath.Join(r.dir, "work")); err != nil {
		return err
	}
	for _, d := range []string{"root", "scratch"} {
		// Mount points, of the sandbox's mount namespace only.
		p := filepath.Join(r.dir, d)
		if ents, err := os.ReadDir(p); err != nil || len(ents) != 0 {
			return fmt.Errorf("run %s %s is not an empty directory (%v)", d, p, err)
		}
	}
	return nil
}

// emptyDir removes everything in dir, which must be a directory, not a
// symlink to one, and ends empty.
func emptyDir(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := removeAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		return fmt.Errorf("%s did not become empty (%v)", dir, err)
	}
	return nil
}

func (r *run) remove() error {
	err := removeAll(r.dir)
	r.lock.Close()
	return err
}

// removeAll is os.RemoveAll that also gets through directories the command
// made unwritable (chmod 0500), which stop it for a non-root owner.
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// prepare validates req and turns it into the init's config (without the
// run's paths). probe is the probe's own run (see bindsFor).
func (b *Backend) prepare(req *backend.Request, probe bool) (childConfig, error) {
	var c childConfig
	if err := backend.CheckCommand(req); err != nil {
		return c, err
	}
	ws, err := checkWorkspace(req.Workspace)
	if err != nil {
		return c, err
	}
	dir, err := cleanDir(req.Dir)
	if err != nil {
		return c, err
	}
	if err := checkDirExists(ws, dir); err != nil {
		return c, err
	}
	newNet, err := networkNamespace(req.Network)
	if err != nil {
		return c, err
	}
	switch req.Secrets.Mode {
	case "", secrets.DenyAll, secrets.Allowlist, secrets.AllowAll:
	default:
		return c, fmt.Errorf("%w: unknown secret mode %q", backend.ErrInvalidRequest, req.Secrets.Mode)
	}
	hidden, err := checkHidden(ws, req.Hidden)
	if err != nil {
		return c, err
	}
	readOnly, readWrite, err := b.bindsFor(ws, probe)
	if err != nil {
		return c, err
	}
	lim := req.Limits

	// HOME is set by exec, to the home the init mounted.
	env := map[string]string{
		"PATH": b.path,
		"LANG": "C.UTF-8",
		"TERM": "dumb",
		"USER": userName(),
	}
	for k, v := range req.Env {
		env[k] = v
	}
	eg, err := prepareEgress(req, env)
	if err != nil {
		return c, err
	}
	c = childConfig{
		Config: nsinit.Config{
			Egress:    eg,
			Workspace: ws,
			Dir:       filepath.Join(ws, filepath.FromSlash(dir)),
			Args:      req.Args,
			Shell:     req.Shell,
			NewNet:    newNet,
			ReadOnly:  readOnly,
			ReadWrite: readWrite,
			FileSize:  lim.FileSizeBytes,
		},
		envMap: env,
		hidden: hidden,
	}
	if b.scratch {
		c.ScratchBytes = scratchBytes(lim)
		c.ScratchInodes = scratchInodes(c.ScratchBytes)
	}
	if c.Caches, err = cacheBinds(req.Caches, ws); err != nil {
		return c, err
	}
	if req.TTY != nil {
		if req.TTY.Rows == 0 || req.TTY.Cols == 0 {
			return c, fmt.Errorf("%w: terminal size %dx%d", backend.ErrInvalidRequest, req.TTY.Rows, req.TTY.Cols)
		}
		c.TTY = &nsinit.TTYConfig{Rows: req.TTY.Rows, Cols: req.TTY.Cols}
		if _, ok := req.Env["TERM"]; !ok {
			env["TERM"] = "xterm-256color"
		}
	}
	if !req.Pending.Empty() {
		if err := backend.CheckPending(req.Pending); err != nil {
			return c, err
		}
		layers, err := b.pendingLayers(req.Pending)
		if err != nil {
			return c, err
		}
		c.Layers, c.pend = layers, req.Pending
	}
	b.rlimitFallbacks(&c, lim)
	return c, nil
}

// checkWorkspace resolves the workspace to the directory the overlay's
// lower layer will be, refusing one it cannot be.
func checkWorkspace(workspace string) (string, error) {
	if !filepath.IsAbs(workspace) {
		return "", fmt.Errorf("%w: workspace %q is not absolute", backend.ErrInvalidRequest, workspace)
	}
	ws, err := filepath.EvalSymlinks(workspace)
	if err != nil {
		return "", fmt.Errorf("%w: workspace: %v", backend.ErrInvalidRequest, err)
	}
	if st, err := os.Stat(ws); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%w: workspace %q is not a directory", backend.ErrInvalidRequest, workspace)
	}
	if ws == "/" || !overlayPathOK(ws) {
		return "", fmt.Errorf("%w: workspace %q cannot be an overlay lower directory", backend.ErrInvalidRequest, ws)
	}
	// .pulse is hidden by mounting over it, and a mount cannot cover a
	// symlink (it would cover the target). Fail closed.
	if st, err := os.Lstat(filepath.Join(ws, pathguard.ReservedDir)); err == nil && st.Mode()&fs.ModeSymlink != 0 {
		return "", fmt.Errorf("%w: workspace .pulse is a symlink, which the sandbox cannot hide", backend.ErrInvalidRequest)
	}
	return ws, nil
}

// cacheBinds resolves the request's caches to the bind mounts the init
// makes, refusing one whose host directory overlaps the workspace, and
// gives each the caches' ownership model (cacheshare).
func cacheBinds(caches []backend.Cache, ws string) ([]nsinit.CacheBind, error) {
	if err := backend.CheckCaches(caches, ws); err != nil {
		return nil, err
	}
	var binds []nsinit.CacheBind
	for _, bc := range caches {
		src, err := filepath.EvalSymlinks(bc.HostDir)
		if err != nil {
			return nil, fmt.Errorf("%w: cache %s: %v", backend.ErrInvalidRequest, bc.Name, err)
		}
		if policy.PathWithin(src, ws) || policy.PathWithin(ws, src) {
			// The command would write the workspace past the overlay.
			return nil, fmt.Errorf("%w: cache %s: host directory %s overlaps the workspace", backend.ErrInvalidRequest, bc.Name, src)
		}
		// The model every backend shares a cache by: what this command
		// makes there, a Docker command (another uid) may change, and
		// the reverse.
		if err := cacheshare.Share(src); err != nil {
			return nil, fmt.Errorf("namespace: cache %s: %w", bc.Name, err)
		}
		binds = append(binds, nsinit.CacheBind{Src: src, Dst: bc.Path})
	}
	return binds, nil
}

// bindsFor returns the extra binds (WithReadOnlyBind, WithReadWriteBind)
// of a command in workspace ws, refusing any that overlaps it (see
// bindOverlap). The probe's run leaves such a bind out instead: its
// workspace is a temporary directory of the probe's choosing, which a
// caller may bind (a bind of /tmp), and the binds of every real command
// are checked against its own workspace.
func (b *Backend) bindsFor(ws string, probe bool) (readOnly, readWrite []string, err error) {
	pick := func(kind string, dirs []string) ([]string, error) {
		kept := dirs[:0:0]
		for _, d := range dirs {
			err := bindOverlap(d, ws)
			switch {
			case err == nil:
				kept = append(kept, d)
			case !probe:
				return nil, fmt.Errorf("%w: %s bind %s: %v", backend.ErrInvalidRequest, kind, d, err)
			}
		}
		return kept, nil
	}
	if readOnly, err = pick("read-only", b.o.readOnly); err != nil {
		return nil, nil, err
	}
	if readWrite, err = pick("read-write", b.o.readWrite); err != nil {
		return nil, nil, err
	}
	return readOnly, readWrite, nil
}

// bindOverlap says why the bind of dir, shown at dir in the sandbox, would
// cover the workspace overlay mounted at ws (resolved), or nil. One at or
// above the workspace hides the overlay behind the host's tree, with the
// .pulse directory the overlay hides and, read-write, the real workspace
// to write past the captured upper layer; one below it shows a host
// directory of the workspace, or puts a mount in it, past the overlay. The
// host directory is resolved, as the mount will resolve it; one that does
// not exist is left to the init, whose mount fails.
func bindOverlap(dir, ws string) error {
	if policy.PathWithin(dir, ws) || policy.PathWithin(ws, dir) {
		return fmt.Errorf("its path in the sandbox is at, above or below the workspace mount point %s", ws)
	}
	src, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("resolving it: %v", err)
	}
	switch {
	case policy.PathWithin(src, ws):
		return fmt.Errorf("its host directory %s is the workspace %s or inside it", src, ws)
	case policy.PathWithin(ws, src):
		return fmt.Errorf("its host directory %s holds the workspace %s", src, ws)
	}
	return nil
}

// rlimitFallbacks sets the limits the init applies itself. Only limits
// the request asked for fall back to rlimits where no cgroup can enforce
// them: RLIMIT_NPROC counts every process of the caller's uid and
// RLIMIT_DATA address space, so a default set that way would fail a busy
// user's commands without bounding the right thing. The defaults
// (policy.WithIsolationDefaults) need a cgroup.
func (b *Backend) rlimitFallbacks(c *childConfig, lim policy.ResourceLimits) {
	def := lim.WithIsolationDefaults()
	c.PidsLimited = lim.Pids > 0 || def.Pids > 0 && b.cg.pids
	if lim.Pids > 0 && !b.cg.pids {
		c.NProc = lim.Pids
	}
	if lim.MemoryBytes > 0 && !b.cg.memory {
		c.Data = lim.MemoryBytes
	}
}

// sandboxHome is where the command's home (an empty tmpfs) is mounted: the
// caller's home path, so that tools keyed on it behave, but with nothing of
// the caller's in it.
func sandboxHome() string {
	h, err := os.UserHomeDir()
	if err != nil || !filepath.IsAbs(h) || filepath.Clean(h) == "/" {
		return "/home/pulse"
	}
	return filepath.Clean(h)
}

// userName is the caller's login name, for USER in the sandbox.
var userName = sync.OnceValue(func() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "pulse"
})

// checkDirExists refuses a working directory that is not a directory of
// the workspace, resolving it the way the sandbox will: inside the
// workspace only (os.Root refuses symlinks that leave it).
func checkDirExists(ws, dir string) error {
	if dir == "." {
		return nil
	}
	root, err := os.OpenRoot(ws)
	if err != nil {
		return fmt.Errorf("%w: workspace: %v", backend.ErrInvalidRequest, err)
	}
	defer root.Close()
	st, err := root.Stat(filepath.FromSlash(dir))
	if err != nil || !st.IsDir() {
		return fmt.Errorf("%w: dir %q is not a directory of the workspace", backend.ErrInvalidRequest, dir)
	}
	return nil
}

// initStatus is what the init reported on the status pipe.
type initStatus struct {
	err     string
	started bool
	pid     int
	exited  bool
	status  syscall.WaitStatus
	// ended: the init reported its namespace empty, and the resources
	// its children used.
	ended   bool
	endedRU [3]int64 // max RSS KiB, user µs, system µs
}

func parseStatus(b []byte) initStatus {
	var st initStatus
	for _, line := range strings.Split(string(b), "\n") {
		verb, arg, _ := strings.Cut(line, " ")
		switch verb {
		case "error":
			st.err = arg
		case "started":
			if n, err := strconv.Atoi(arg); err == nil {
				st.started, st.pid = true, n
			}
		case "exit":
			if n, err := strconv.ParseUint(arg, 10, 32); err == nil {
				st.exited, st.status = true, syscall.WaitStatus(n)
			}
		case "ended":
			f := strings.Fields(arg)
			var ru [3]int64
			ok := len(f) == 3
			for i := 0; ok && i < 3; i++ {
				n, err := strconv.ParseInt(f[i], 10, 64)
				ok = err == nil && n >= 0 && n < 1<<50 // KiB and µs: no product overflows
				ru[i] = n
			}
			if ok {
				st.ended, st.endedRU = true, ru
			}
		}
	}
	return st
}

// readStatus reads the init's status lines until it exits, calling each
// line as it arrives (the pids limit is tightened on "started").
func readStatus(r io.Reader, each func(line string)) []byte {
	var all []byte
	br := bufio.NewReader(io.LimitReader(r, 64<<10))
	for {
		line, err := br.ReadString('\n')
		all = append(all, line...)
		if l := strings.TrimSuffix(line, "\n"); l != "" {
			each(l)
		}
		if err != nil {
			return all
		}
	}
}
