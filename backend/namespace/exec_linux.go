package namespace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// copyWait bounds how long output copying may go on after the init is
// gone. Every process of the namespace dies with it, so the pipes reach
// EOF at once unless a descriptor was smuggled out of the sandbox.
const copyWait = 2 * time.Second

// exec runs req to its end. onStart, when set, is called once the init
// reports the command started, with the command's pid in the sandbox (0
// when the program could not be executed); Start uses it.
func (b *Backend) exec(ctx context.Context, req *backend.Request, onStart func(p *initProc, nsPid int)) (*backend.Result, error) {
	return b.execWith(ctx, req, onStart, false)
}

// execWith is exec; fresh (the probe's run) starts an init of its own
// rather than take one started ahead, and does not probe first.
func (b *Backend) execWith(ctx context.Context, req *backend.Request, onStart func(p *initProc, nsPid int), fresh bool) (*backend.Result, error) {
	start := time.Now()
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, backend.ErrClosed
	}
	cfg, err := b.prepare(req, fresh)
	if err != nil {
		return nil, err
	}
	defer func() {
		// Exec's contract: Stdin is closed whatever happens.
		if c, ok := req.Stdin.(io.Closer); ok {
			c.Close()
		}
	}()
	if !fresh {
		if err := b.probeForInitProg(ctx); err != nil {
			return nil, err
		}
	}
	if !overlayPathOK(b.o.stateDir) {
		return nil, fmt.Errorf("%w: namespace: state dir %q holds a character overlayfs options cannot carry (, : or \\); choose another with WithStateDir", backend.ErrUnavailable, b.o.stateDir)
	}

	x := &nsExec{b: b, req: req, cfg: cfg, lim: req.Limits.WithDefaults().WithIsolationDefaults(), onStart: onStart, fresh: fresh,
		after: backend.BackgroundAfter(ctx)}
	defer x.release()
	if err := x.acquire(); err != nil {
		return nil, err
	}
	if err := x.configure(); err != nil {
		return nil, err
	}
	x.launch(ctx)
	st, waitErr := x.wait()
	res, err := x.result(st, waitErr, time.Since(start))
	if err != nil {
		return nil, err
	}
	return x.readOverlay(res)
}

// nsExec is one command's way through a namespace sandbox, from the init
// it takes to the run directory it leaves:
//
//	acquire    an init started ahead (or a fresh one), tracked for Close
//	configure  its cgroup, the hidden paths' whiteouts, the config sent
//	           (replacing, once, an init that died while waiting)
//	launch     the timeout and ctx watch, output and stdin copying
//	wait       the init's status, its reap, the output drained
//	result     how the command ended; readOverlay, what it wrote
//	release    whatever phase it stopped in: the init's pipes, its cgroup
//	           and run directory (now, or once a background reap is done),
//	           its tracking, and the next init started ahead
//
// Starting and waiting are apart so that a command left running in the
// background goes through the same phases, waited for elsewhere.
type nsExec struct {
	b   *Backend
	req *backend.Request
	cfg childConfig
	lim policy.ResourceLimits

	// procMu guards p against kill while a dead init is replaced; only
	// the goroutine running the phases writes it.
	procMu sync.Mutex
	p      *initProc
	reason atomic.Value // backend.TerminationReason, set by whoever kills first
	cg     *runCgroup

	counted bool // takeWarm counted this Exec as running
	refill  bool // an init was had: start the next one ahead
	// after, when set, holds the refill back until it is closed (see
	// backend.WithBackgroundAfter).
	after   <-chan struct{}
	tracked *initProc // what track registered, for untrack
	sent    bool      // the init has its config: its run is released by release
	// reapLater: the init reported its namespace empty, so Exec returns
	// without waiting for the kernel to finish its exit; a background
	// goroutine reaps it, then removes the cgroup and the run.
	reapLater bool

	onStart func(p *initProc, nsPid int) // see exec
	fresh   bool                         // see execWith

	done chan struct{} // closed when the init is reaped: the watch ends
	out  *outputs
	// scratch is the root of the tmpfs holding the command's upper and
	// work directories (scratch_linux.go), from its start; scratchErr,
	// why it is not there.
	scratch    *os.File
	scratchErr error
	started    bool          // the init said the command started
	watched    chan struct{} // closed when watchScratch has returned
	copies     sync.WaitGroup
}

// kill ends the command for why, unless it was already ended for another
// reason.
func (x *nsExec) kill(why backend.TerminationReason) {
	x.reason.CompareAndSwap(nil, why)
	x.procMu.Lock()
	defer x.procMu.Unlock()
	// SIGKILL to pid 1 of the namespace: the kernel kills the rest.
	x.p.kill()
}

// acquire takes an init for the command and tracks it, so that Close
// kills it.
func (x *nsExec) acquire() error {
	b, newNet := x.b, x.cfg.NewNet
	if !x.fresh {
		b.waitAhead(newNet)
	}
	p := b.takeWarm(newNet, x.fresh)
	x.counted = true
	if p != nil && p.cg != nil && p.cg.key != b.cgroupKey(x.lim) {
		// Started ahead for other limits: its cgroups are not this
		// command's.
		p.discard()
		p = nil
	}
	if p == nil {
		// In this command's cgroups from the start, as an init started
		// ahead is (startAttached).
		var err error
		if p, err = b.startAttached(newNet, x.lim); err != nil {
			return fmt.Errorf("%w: namespace: %v", backend.ErrUnavailable, err)
		}
	}
	// The next Exec's init starts once this one is done, off the critical
	// path of this command.
	x.refill = true
	x.p = p
	if !b.track(p, x.kill) {
		p.discard()
		return backend.ErrClosed
	}
	x.tracked = p
	return nil
}

// configure makes the run's cgroup and hands the init its config. An init
// started ahead may have died meanwhile (EPIPE): it is replaced once with a
// fresh one. An init that cannot be configured is discarded.
func (x *nsExec) configure() error {
	b := x.b
	cg, cgErr := x.p.cg, error(nil)
	x.p.cg = nil // the run's now: release removes it
	if cg == nil {
		cg, cgErr = b.newCgroup(x.lim)
	}
	if cgErr != nil {
		// Fail closed: the probe said this machine enforces these limits,
		// so a command must not run without them.
		x.p.discard()
		return fmt.Errorf("%w: namespace: cgroup limits: %v", backend.ErrUnavailable, cgErr)
	}
	x.cg = cg
	if err := x.whiteouts(); err != nil {
		return err
	}
	if err := x.send(); err != nil {
		if errors.Is(err, errCgroupAttach) {
			x.p.discard()
			return fmt.Errorf("%w: namespace: %w", backend.ErrUnavailable, err)
		}
		b.o.logger.Info("namespace: an init started ahead is gone; starting another", slog.String("why", x.p.setupError()))
		fresh, ferr := b.startInit(x.cfg.NewNet)
		if ferr != nil {
			x.p.discard()
			return fmt.Errorf("%w: namespace: %v", backend.ErrUnavailable, ferr)
		}
		x.procMu.Lock()
		old := x.p
		x.p = fresh
		x.procMu.Unlock()
		old.discard()
		if err := x.whiteouts(); err != nil {
			return err
		}
		if err := x.send(); err != nil {
			if errors.Is(err, errCgroupAttach) {
				x.p.discard()
				return fmt.Errorf("%w: namespace: %w", backend.ErrUnavailable, err)
			}
			msg := x.p.setupError()
			x.p.discard()
			return fmt.Errorf("%w: namespace: sandbox setup: %s", backend.ErrUnavailable, msg)
		}
	}
	x.sent = true
	return nil
}

// whiteouts turns the hidden paths into whiteouts in the init's upper
// layer, before the init mounts the overlay; a replacement init gets its
// own.
func (x *nsExec) whiteouts() error {
	if err := writeWhiteouts(filepath.Join(x.p.run.dir, "upper"), x.cfg.Workspace, x.cfg.hidden); err != nil {
		x.p.discard()
		return fmt.Errorf("%w: namespace: hidden paths: %v", backend.ErrUnsupported, err)
	}
	return nil
}

// errCgroupAttach: the init could not be moved into its run's cgroups.
// The command must not start (it would run without its limits), and
// another init would fare no better, so configure does not retry.
var errCgroupAttach = errors.New("cgroup attach")

// send completes the config with what belongs to the init (its home, its
// run's paths), moves the init into the cgroup and writes the config.
func (x *nsExec) send() error {
	p, cfg := x.p, &x.cfg
	cfg.Home = p.home
	cfg.Env = cfg.Env[:0]
	for k, v := range cfg.envMap {
		cfg.Env = append(cfg.Env, k+"="+v)
	}
	if _, ok := cfg.envMap["HOME"]; !ok {
		cfg.Env = append(cfg.Env, "HOME="+p.home)
	}
	cfg.Root = filepath.Join(p.run.dir, "root")
	cfg.Upper = filepath.Join(p.run.dir, "upper")
	cfg.Work = filepath.Join(p.run.dir, "work")
	if x.b.scratch {
		cfg.Scratch = filepath.Join(p.run.dir, "scratch")
	}
	if x.cg != nil && x.cg.added != p.pid() {
		if err := x.cg.add(p.pid()); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				// The init started ahead is gone: configure replaces it.
				return err
			}
			// Before the config is written: the init has not started the
			// command, and will not, outside its limits.
			return fmt.Errorf("%w: %v", errCgroupAttach, err)
		}
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	_, err = p.cfgW.Write(data)
	return err
}

// launch starts what runs beside the command: the watch that kills it on
// timeout or ctx's end, and the copying of its output and input.
func (x *nsExec) launch(ctx context.Context) {
	x.done = make(chan struct{})
	go func() {
		timer := time.NewTimer(x.lim.Timeout)
		defer timer.Stop()
		select {
		case <-x.done:
		case <-timer.C:
			x.kill(backend.Timeout)
		case <-ctx.Done():
			x.kill(backend.Cancelled)
		}
	}()
	if x.reason.Load() != nil {
		x.kill(backend.Cancelled) // Close came while the init was being set up
	}

	p := x.p
	x.out = newOutputs(x.req.Stdout, x.req.Stderr, x.lim.OutputBytes, func() { x.kill(backend.OutputLimit) })
	x.copies.Add(2)
	go func() { defer x.copies.Done(); io.Copy(x.out.stdout, p.stdoutR) }()
	go func() { defer x.copies.Done(); io.Copy(x.out.stderr, p.stderrR) }()
	stdinW := p.stdinW
	if x.req.Stdin == nil {
		stdinW.Close()
	} else {
		// Abandoned, not waited for, if the reader never returns: the
		// contract allows it, and the deferred Close of req.Stdin and of
		// the pipe end it where they can.
		go func() { io.Copy(stdinW, x.req.Stdin); stdinW.Close() }()
	}
}

// wait reads the init's status until it exits, reaps it (unless it said
// its namespace is empty: then release reaps it in the background), and
// drains the output.
func (x *nsExec) wait() (initStatus, error) {
	b, p := x.b, x.p
	status := readStatus(p.stR, func(line string) {
		if rest, ok := strings.CutPrefix(line, "phase "); ok {
			b.initPhase(rest)
			return
		}
		if pid, ok := strings.CutPrefix(line, "started "); ok {
			// Without a scratch (an older kernel's tmpfs) the upper
			// directory is the run's.
			if x.cfg.Scratch != "" {
				if err := x.takeScratch(); err != nil {
					// What it writes could not be read back: it does
					// not run on.
					x.scratchErr = err
					x.kill(backend.Cancelled)
				}
			}
			if x.cg != nil && pid != "0" {
				if err := x.cg.tightenPids(x.lim.Pids, p.pid()); err != nil {
					b.o.logger.Warn("namespace: pids limit", slog.Any("err", err))
				}
			}
			if x.onStart != nil {
				n, _ := strconv.Atoi(pid)
				x.onStart(p, n)
			}
		}
	})
	b.phase("status-eof")
	st := parseStatus(status)
	// Ended means the command exited and every other process of the
	// namespace is dead and reaped: only the init is left, exiting.
	x.reapLater = st.ended && st.started && st.exited
	var waitErr error
	if !x.reapLater {
		waitErr = p.wait()
	}
	b.phase("init-reaped")
	close(x.done)
	if x.watched != nil {
		// Before the scratch is read, handed on or closed.
		<-x.watched
	}
	x.drain()
	b.phase("output-copied")
	return st, waitErr
}

// drain waits for the output copies to finish, up to copyWait twice, and
// then lets nothing more reach the caller's writers.
func (x *nsExec) drain() {
	copied := make(chan struct{})
	go func() { x.copies.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(copyWait):
		// A descriptor outlived the namespace, or the caller's writer is
		// stuck: stop copying and return; late output is dropped.
		x.p.stdoutR.Close()
		x.p.stderrR.Close()
		select {
		case <-copied:
		case <-time.After(copyWait):
		}
	}
	x.out.stop()
}

// result tells from the init's status and its exit how the command ended;
// an error when it never started.
func (x *nsExec) result(st initStatus, waitErr error, dur time.Duration) (*backend.Result, error) {
	if st.err != "" && !st.started {
		// The init failed before starting the command: nothing was started.
		return nil, fmt.Errorf("%w: namespace: sandbox setup: %s", backend.ErrUnavailable, st.err)
	}
	reaped, ru := x.p.reaped()
	if !reaped && !x.reapLater {
		return nil, fmt.Errorf("%w: namespace: sandbox init: %v", backend.ErrUnavailable, waitErr)
	}
	if x.scratchErr != nil {
		return nil, fmt.Errorf("%w: namespace: %w", backend.ErrUnavailable, x.scratchErr)
	}
	x.started = st.started
	why, killed := x.reason.Load().(backend.TerminationReason)
	if !st.started && !killed {
		return nil, fmt.Errorf("%w: namespace: sandbox init ended (%v) before starting the command", backend.ErrUnavailable, waitErr)
	}

	res := &backend.Result{
		Duration:  dur,
		PID:       st.pid,
		Truncated: x.out.truncated(),
	}
	switch {
	case st.exited && st.status.Exited():
		res.ExitCode = st.status.ExitStatus()
		res.Termination = backend.Exited
	default:
		// Killed by a signal, or the init was killed before it could say
		// how the command ended (timeout, cancel, output cap, OOM).
		res.ExitCode = -1
		res.Termination = backend.Signaled
		if killed {
			res.Termination = why
		}
		if x.cg != nil && x.cg.oomKilled() {
			res.Termination = backend.OOM
		}
	}
	if res.Termination != backend.Cancelled && x.scratchFull() {
		// The kernel refused writes past the bound: however the command
		// took that, it did not write all it meant to.
		res.Termination = backend.DiskLimit
	}
	res.TimedOut = res.Termination == backend.Timeout
	if x.reapLater {
		res.Metrics = backend.Metrics{
			MaxRSSBytes: st.endedRU[0] * 1024,
			UserCPU:     time.Duration(st.endedRU[1]) * time.Microsecond,
			SystemCPU:   time.Duration(st.endedRU[2]) * time.Microsecond,
		}
	} else if ru != nil {
		res.Metrics = backend.Metrics{
			MaxRSSBytes: ru.Maxrss * 1024,
			UserCPU:     time.Duration(ru.Utime.Nano()),
			SystemCPU:   time.Duration(ru.Stime.Nano()),
		}
	}
	return res, nil
}

// readOverlay reads what the command wrote from the upper layer into res.
func (x *nsExec) readOverlay(res *backend.Result) (*backend.Result, error) {
	if ran := x.lateScratch(); !ran {
		res.Overlay = &backend.Overlay{}
		return res, nil
	}
	upper := x.cfg.Upper
	if x.cfg.Scratch != "" {
		if x.scratch == nil {
			return res, fmt.Errorf("namespace: %w: %w", errNoScratch, backend.ErrOverlayLost)
		}
		upper = scratchPath(x.scratch) + "/upper"
		res.Metrics.DiskBytes = x.scratchUsed()
	}
	var keep *holder
	if x.req.StreamFiles {
		// The files it keeps stay in the scratch, which it holds open
		// until the overlay is released.
		keep = &holder{b: x.b, scratch: x.scratch}
		x.scratch = nil
	}
	ov, err := readOverlayKeep(upper, lowerView{dir: x.cfg.Workspace, pend: x.cfg.pend}, x.cfg.hidden, keep)
	if err != nil {
		keep.release()
		// The command ran; its writes could not be read back. Report it
		// loudly rather than returning a silently empty overlay.
		x.b.o.logger.Error("namespace: reading overlay", slog.Any("err", err))
		return res, fmt.Errorf("namespace: reading the overlay of a finished command: %w: %w", err, backend.ErrOverlayLost)
	}
	res.Overlay = ov
	x.b.phase("overlay-read")
	return res, nil
}

// release undoes what the phases did, in reverse, whichever one stopped.
func (x *nsExec) release() {
	b := x.b
	if x.scratch != nil {
		x.scratch.Close()
	}
	if x.sent {
		x.releaseRun()
	}
	if x.cg != nil && !x.reapLater {
		x.cg.remove()
	}
	if x.tracked != nil {
		b.untrack(x.tracked)
	}
	if x.refill {
		b.refill(x.cfg.NewNet, x.lim, x.after)
	}
	if x.counted {
		b.done(x.cfg.NewNet)
	}
}

// releaseRun closes the init's pipes and removes its run: now, or once
// the background reap of an init that reported its namespace empty is
// done (Close waits for it).
func (x *nsExec) releaseRun() {
	b, p, cg := x.b, x.p, x.cg
	closeAll(p.cfgW, p.stR, p.stdinW)
	closeOutputs(p.stdoutR, p.stderrR)
	p.dialer.close()
	if !x.reapLater {
		b.removeRun(p.run)
		return
	}
	// The caller holds a count on b.wg (a tracked execution), so this Add
	// cannot race with Close's Wait.
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		_ = p.wait()
		if cg != nil {
			cg.remove()
		}
		b.recycleRun(p.run)
	}()
}
