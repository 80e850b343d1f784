//go:build linux

package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/policy"
)

// Backend runs commands under runsc. Its methods are safe for concurrent
// use.
type Backend struct {
	o   options
	log *slog.Logger

	mu       sync.Mutex
	root     string   // runsc's --root, this Backend's own (made by Probe)
	rootLock *os.File // flocked while root is in use
	probed   bool     // a probe sandbox ran
	// memCgroup: runsc puts each sandbox in a memory cgroup of the
	// command's memory limit (Probe found that it can here).
	memCgroup bool
	// cpuCgroup: the host has a cpu controller for runsc to put each
	// memory-limited sandbox in a cpu cgroup of limits.cpus too.
	cpuCgroup bool
	platform  string // resolved platform
	runsc     string // resolved binary
	closed    bool
	closing   chan struct{}
	running   sync.WaitGroup

	warmMu  sync.Mutex
	warms   map[cgLimits]*warm // by memory and cpus limits (warm_linux.go)
	warmErr error              // why no warm sandbox starts here: commands run cold
}

var _ backend.Backend = (*Backend)(nil)

// New makes a Backend; it starts nothing (Probe does).
func New(opts ...Option) (*Backend, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	defaults(&o)
	if !filepath.IsAbs(o.stateDir) {
		return nil, fmt.Errorf("gvisor: %w: state dir %q is not absolute", backend.ErrInvalidRequest, o.stateDir)
	}
	// Its paths go into overlayfs mount options, which split on ',' and
	// ':' (the workspace itself is bound to a path under it).
	if strings.ContainsAny(o.stateDir, ",:\\\n") {
		return nil, fmt.Errorf("gvisor: %w: state dir %q holds a character overlayfs options cannot carry", backend.ErrInvalidRequest, o.stateDir)
	}
	return &Backend{o: o, log: o.log, closing: make(chan struct{})}, nil
}

// Name returns "gvisor".
func (b *Backend) Name() string { return Name }

// Capabilities says what the backend enforces.
func (b *Backend) Capabilities() backend.Capabilities {
	b.mu.Lock()
	p, cg, cpu := b.platform, b.memCgroup || !b.probed, b.cpuCgroup || !b.probed
	b.mu.Unlock()
	coldWhy := ""
	if ok, err := b.Warm(); !ok {
		coldWhy = err.Error()
	}
	return capabilities(p, cg, cpu, coldWhy)
}

// Platform is the runsc platform commands run on, once Probe succeeded
// ("" before).
func (b *Backend) Platform() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.platform
}

// Probe finds runsc, picks its platform and starts one sandbox: the warm
// sandbox commands then run in, where a runtime program is found and it
// starts (so that a session pays one sandbox start, not a probe's and the
// warm one's), else a cold one that runs `cat /proc/version`. A success
// is remembered; a failure is probed again next time.
func (b *Backend) Probe(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return fmt.Errorf("gvisor: %w", backend.ErrClosed)
	}
	if b.probed {
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	if os.Geteuid() != 0 {
		return fmt.Errorf("gvisor: %w: runsc sandboxes and the workspace overlay need root here (run as root, or use the namespace backend)", backend.ErrUnavailable)
	}
	bin, err := findRunsc(b.o.runsc)
	if err != nil {
		return err
	}
	platform := b.o.platform
	if platform == "" {
		platform = defaultPlatform(ctx, bin)
	}
	b.mu.Lock()
	b.runsc, b.platform = bin, platform
	// Looked at, not tried: runsc fails a sandbox whose spec asks for a
	// controller the host lacks, so a cpus limit is listed (and a
	// sandbox given one) only where the controller is there.
	b.cpuCgroup = cpuController(cgroupRoot)
	b.mu.Unlock()
	if err := os.MkdirAll(b.o.stateDir, 0o700); err != nil {
		return fmt.Errorf("gvisor: %w: state dir: %w", backend.ErrUnavailable, err)
	}
	if err := b.makeRoot(); err != nil {
		return fmt.Errorf("gvisor: %w: runsc root: %w", backend.ErrUnavailable, err)
	}
	werr := b.probeWarm(ctx, bin, platform)
	if werr == nil {
		b.mu.Lock()
		b.probed = true
		b.mu.Unlock()
		return nil
	}
	ws, err := os.MkdirTemp(b.o.stateDir, "probe-ws-")
	if err != nil {
		return fmt.Errorf("gvisor: %w: %w", backend.ErrUnavailable, err)
	}
	defer os.RemoveAll(ws)
	// First with the memory cgroup, then, where runsc cannot make one
	// (no writable memory controller), without: the memory limit is then
	// not listed, and a policy that sets one is refused.
	var perr error
	for _, cg := range []bool{true, false} {
		b.mu.Lock()
		b.memCgroup = cg
		b.mu.Unlock()
		var out bytes.Buffer
		res, err := b.run(ctx, &backend.Request{ExecutionID: "probe", Workspace: ws, Shell: "cat /proc/version", Stdout: &out, Stderr: &out}, bin, platform, false, nil)
		switch {
		case err != nil:
			perr = fmt.Errorf("gvisor: %w: probe sandbox: %w", backend.ErrUnavailable, err)
		case res.ExitCode != 0:
			perr = fmt.Errorf("gvisor: %w: probe sandbox (runsc %s, platform %s) ended %s with status %d: %s",
				backend.ErrUnavailable, bin, platform, res.Termination, res.ExitCode, strings.TrimSpace(out.String()))
		default:
			b.mu.Lock()
			b.probed = true
			b.mu.Unlock()
			b.probeRuntime(werr)
			if !cg {
				b.log.Warn("runsc cannot put sandboxes in a memory cgroup here; the memory limit is not enforced", "first_error", perr)
			}
			return nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return perr
}

// probeWarm starts the warm sandbox for commands of default limits, in a
// memory cgroup where runsc can make one, else without; it is nil once
// that sandbox runs. The error says why it did not: no runtime program,
// cold mode, or the sandbox's own failure (the cold probe then says
// whether any sandbox starts here).
func (b *Backend) probeWarm(ctx context.Context, bin, platform string) error {
	if b.o.cold {
		return errors.New("cold mode asked for (WithCold)")
	}
	if _, err := runtimeBytes(b.o.runtime); err != nil {
		return err
	}
	var errs []error
	for _, cg := range []bool{true, false} {
		var lim cgLimits
		if cg {
			lim.mem = policy.ResourceLimits{}.WithDefaults().WithIsolationDefaults().MemoryBytes
		}
		w, err := b.startWarm(ctx, bin, platform, lim)
		if err == nil {
			b.mu.Lock()
			b.memCgroup = cg
			b.mu.Unlock()
			b.warmMu.Lock()
			if b.warms == nil {
				b.warms = map[cgLimits]*warm{}
			}
			b.warms[lim] = w
			b.warmMu.Unlock()
			if !cg {
				b.log.Warn("runsc cannot put sandboxes in a memory cgroup here; the memory limit is not enforced", "first_error", errs[0])
			}
			return nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// probeRuntime records why commands run cold once the cold probe passed
// where the warm one (werr) did not: the doctor says why.
func (b *Backend) probeRuntime(werr error) {
	if b.o.cold {
		return
	}
	if err := werr; err != nil {
		b.warmMu.Lock()
		if b.warmErr == nil {
			b.warmErr = err
			b.log.Warn("no warm gVisor sandbox here: each command starts a sandbox of its own", "error", err)
		}
		b.warmMu.Unlock()
	}
}

// findRunsc resolves the runsc binary.
func findRunsc(p string) (string, error) {
	if p == "" {
		p = os.Getenv("PULSE_RUNSC")
	}
	if p == "" {
		p = "runsc"
	}
	bin, err := exec.LookPath(p)
	if err != nil {
		return "", fmt.Errorf("gvisor: %w: no runsc (%w); install it (scripts/testenv.sh does: apt-get install runsc) or set PULSE_RUNSC", backend.ErrUnavailable, err)
	}
	return bin, nil
}

// defaultPlatform is systrap where this runsc knows it (releases from
// 2023 on), ptrace otherwise.
func defaultPlatform(ctx context.Context, bin string) string {
	out, _ := exec.CommandContext(ctx, bin, "help", "platforms").CombinedOutput()
	if bytes.Contains(out, []byte("systrap")) {
		return "systrap"
	}
	out, _ = exec.CommandContext(ctx, bin, "flags").CombinedOutput()
	if bytes.Contains(out, []byte("systrap")) {
		return "systrap"
	}
	return "ptrace"
}

// Exec runs req in a new runsc sandbox.
func (b *Backend) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	if req != nil && req.Stdin != nil {
		defer closeReader(req.Stdin)
	}
	if err := b.Probe(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	bin, platform := b.runsc, b.platform
	b.mu.Unlock()
	return b.run(ctx, req, bin, platform, true, nil)
}

var _ backend.TerminalStarter = (*Backend)(nil)

// StartsTerminals implements backend.TerminalStarter: commands of the
// warm sandbox run on a terminal of their own devpts instance there
// (internal/boxrt), cold ones on the terminal runsc makes for their
// sandbox (console_linux.go).
func (b *Backend) StartsTerminals() bool { return true }

// Start runs req as Exec does and returns once its command runs. In the
// warm sandbox, signals and terminal resizes go to it through the
// runtime, and DialPort reaches its loopback through it; cold, signals go
// to the sandbox's init through runsc kill, resizes to the terminal
// runsc made, and ports are refused (ErrUnsupported).
func (b *Backend) Start(ctx context.Context, req *backend.Request) (backend.Process, error) {
	if err := b.Probe(ctx); err != nil {
		if req != nil && req.Stdin != nil {
			closeReader(req.Stdin)
		}
		return nil, err
	}
	b.mu.Lock()
	bin, platform := b.runsc, b.platform
	b.mu.Unlock()
	return backend.Background(ctx, func(ctx context.Context, started func(backend.Control)) (*backend.Result, error) {
		if req != nil && req.Stdin != nil {
			defer closeReader(req.Stdin)
		}
		return b.run(ctx, req, bin, platform, true, started)
	})
}

// begin registers a running execution; it fails after Close.
func (b *Backend) begin() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("gvisor: %w", backend.ErrClosed)
	}
	b.running.Add(1)
	return nil
}

// Close ends every running execution and waits for them.
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
	b.warmMu.Lock()
	warms := b.warms
	b.warms = nil
	b.warmMu.Unlock()
	for _, w := range warms {
		w.stop()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.root == "" {
		return nil
	}
	err := removeRoot(context.Background(), b.runsc, b.root)
	b.rootLock.Close()
	return err
}

// makeRoot makes this Backend's runsc state directory, locked for its
// life so that Reconcile in another process leaves it alone.
func (b *Backend) makeRoot() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.root != "" {
		return nil
	}
	root, err := os.MkdirTemp(b.o.stateDir, rootPrefix)
	if err != nil {
		return err
	}
	lf, err := os.Create(filepath.Join(root, lockName))
	if err != nil {
		return err
	}
	if err := flock.TryLock(lf); err != nil {
		lf.Close()
		return err
	}
	b.root, b.rootLock = root, lf
	return nil
}

// removeRoot deletes what containers a runsc root still lists, unmounts
// what runsc mounted in it (the empty network namespace it keeps for
// --network=none) and removes it.
func removeRoot(ctx context.Context, bin, root string) error {
	if bin != "" {
		out, _ := exec.CommandContext(ctx, bin, "--root", root, "list", "-quiet").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.CommandContext(ctx, bin, "--root", root, "delete", "--force", id).Run()
		}
	}
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		_ = unix.Unmount(filepath.Join(root, e.Name()), unix.MNT_DETACH)
	}
	if err := os.RemoveAll(root); err != nil {
		return fmt.Errorf("gvisor: remove %s: %w", root, err)
	}
	return nil
}

// Reconcile removes what executions of crashed processes left in the
// state dir: their sandboxes, mounts and directories. An execution's
// directory is locked while it lives, so a live one (of any process) is
// left alone.
func (b *Backend) Reconcile(ctx context.Context) error {
	ents, err := os.ReadDir(b.o.stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gvisor: reconcile: %w", err)
	}
	bin, _ := findRunsc(b.o.runsc)
	var errs []error
	for _, e := range ents {
		isRoot := strings.HasPrefix(e.Name(), rootPrefix)
		isWarm := strings.HasPrefix(e.Name(), warmPrefix)
		if !strings.HasPrefix(e.Name(), execPrefix) && !isRoot && !isWarm || !e.IsDir() {
			continue
		}
		dir := filepath.Join(b.o.stateDir, e.Name())
		lf, err := os.Open(filepath.Join(dir, lockName))
		if err != nil {
			continue // not one of ours, or half made
		}
		if err := flock.TryLock(lf); err != nil {
			lf.Close()
			continue // live
		}
		if isRoot {
			if err := removeRoot(ctx, bin, dir); err != nil {
				errs = append(errs, err)
			}
			lf.Close()
			continue
		}
		if isWarm {
			warmTeardown(dir)
		} else if err := teardown(dir); err != nil {
			errs = append(errs, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
		lf.Close()
	}
	return errors.Join(errs...)
}

func (b *Backend) runscBin() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runsc
}

func (b *Backend) runscRoot() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.root
}

// rootPrefix starts the name of a Backend's runsc state directory.
const rootPrefix = "runsc-"

// teardown unmounts what an execution dir holds, deepest first.
func teardown(dir string) error {
	var errs []error
	for _, m := range []string{"merged", "lower", "ws", "scratch"} {
		p := filepath.Join(dir, m)
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("gvisor: unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func closeReader(r any) {
	if c, ok := r.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}

// waitDelay bounds how long output pipes are drained once the sandbox is
// gone: nothing of it can hold them, but a broken runsc must not hang
// Exec.
const waitDelay = 5 * time.Second
