package namespace

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// initProc is a started sandbox init, waiting for its config. Everything
// that does not depend on the request (namespaces, the run directory, the
// stdio pipes) exists before the request does, so that one init per
// network mode can be started ahead of time: the Go runtime's start-up is
// most of the cost of an Exec.
type initProc struct {
	cmd    *exec.Cmd
	run    *run
	newNet bool
	home   string // where the init mounted the command's home

	cfgW    *os.File // config to the init; kept open while it runs, as a parent-death signal
	stR     *os.File // status lines from the init
	stdinW  *os.File
	stdoutR *os.File
	stderrR *os.File
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// startInit starts an init in fresh namespaces; it blocks reading its
// config until exec sends one.
func (b *Backend) startInit(newNet bool) (p *initProc, err error) {
	r, err := b.newRun()
	if err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	p = &initProc{run: r, newNet: newNet}
	var childEnds []*os.File
	defer func() {
		closeAll(childEnds...)
		if err != nil {
			closeAll(p.cfgW, p.stR, p.stdinW, p.stdoutR, p.stderrR)
			r.remove()
		}
	}()
	pipe := func() (rd, wr *os.File) {
		if err != nil {
			return nil, nil
		}
		rd, wr, err = os.Pipe()
		return rd, wr
	}
	cfgR, cfgW := pipe()
	stR, stW := pipe()
	stdinR, stdinW := pipe()
	stdoutR, stdoutW := pipe()
	stderrR, stderrW := pipe()
	p.cfgW, p.stR, p.stdinW, p.stdoutR, p.stderrR = cfgW, stR, stdinW, stdoutR, stderrR
	childEnds = []*os.File{cfgR, stW, stdinR, stdoutW, stderrW}
	if err != nil {
		return nil, err
	}

	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"pulse-namespace-init"}
	// The init's own environment; the command's is built from the
	// request. A race-built binary would otherwise sleep a second at every
	// exit, and one processor keeps the init's threads (which count as
	// pids) few.
	cmd.Env = []string{initEnv + "=" + initVersion, "GORACE=atexit_sleep_ms=0", "GOMAXPROCS=1"}
	if b.o.phaseHook != nil {
		cmd.Env = append(cmd.Env, traceEnv+"=1")
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
	cmd.ExtraFiles = []*os.File{cfgR, stW}
	flags := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP)
	if newNet {
		flags |= unix.CLONE_NEWNET
	}
	// No Pdeathsig: it fires when the forking *thread* ends, which Go
	// does not promise not to do. The init watches its config pipe
	// instead and exits when this process is gone.
	// Setsid: the sandbox gets a session of its own, with no controlling
	// terminal, so that nothing in it can open the caller's terminal
	// (/dev/tty) and push input into it (TIOCSTI, the CVE-2017-5226
	// class; bwrap --new-session).
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid:                     true,
		Cloneflags:                 flags,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	prog, err := compiledSeccomp()
	if err != nil {
		return nil, err
	}
	b.phase("prepare")
	if err = cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sandbox init: %w", err)
	}
	b.phase("clone-exec")
	p.cmd = cmd
	p.home = sandboxHome()
	static, err := json.Marshal(childConfig{
		Root:     filepath.Join(r.dir, "root"),
		Home:     p.home,
		Mask:     etcMasks(),
		Hostname: b.o.hostname,
		NewNet:   newNet,
		LastCap:  hostLastCap(),
		Seccomp:  prog,
	})
	if err == nil {
		_, err = cfgW.Write(static)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("sending the init its static config: %w", err)
	}
	return p, nil
}

// setupError kills the init and returns what it said before dying, for
// an error message.
func (p *initProc) setupError() string {
	_ = p.cmd.Process.Kill()
	b, _ := io.ReadAll(io.LimitReader(p.stR, 64<<10))
	if st := parseStatus(b); st.err != "" {
		return st.err
	}
	return "the sandbox init exited before it could be configured"
}

// discard ends an init that will not run a command and removes its run.
func (p *initProc) discard() {
	p.cfgW.Close() // the init sees EOF and exits
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	closeAll(p.stR, p.stdinW, p.stdoutR, p.stderrR)
	p.run.remove()
}

// takeWarm returns the oldest init started ahead for this network mode,
// if any, and counts the Exec that will use it as running (done undoes
// that).
func (b *Backend) takeWarm(newNet bool) *initProc {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight[newNet]++
	b.peak[newNet] = max(b.peak[newNet], b.inflight[newNet])
	ps := b.warm[newNet]
	if len(ps) == 0 {
		return nil
	}
	p := ps[0]
	ps[0] = nil
	b.warm[newNet] = ps[1:]
	return p
}

// done ends what takeWarm counted.
func (b *Backend) done(newNet bool) {
	b.mu.Lock()
	b.inflight[newNet]--
	b.mu.Unlock()
}

// poolTarget is how many idle inits of a network mode to keep: as many as
// the most Execs of that mode seen at once, within the pool size. Called
// with b.mu held.
func (b *Backend) poolTarget(newNet bool) int {
	return min(max(b.peak[newNet], 1), b.o.poolSize)
}

// refill starts, in the background, inits for the next Execs of this
// network mode until the pool holds poolTarget of them. One goroutine per
// mode starts them one after another: a burst's refill takes no more than
// one processor from the commands being run.
func (b *Backend) refill(newNet bool) {
	if b.o.noPrestart {
		return
	}
	b.mu.Lock()
	if b.closed || len(b.warm[newNet]) >= b.poolTarget(newNet) || b.filling[newNet] {
		b.mu.Unlock()
		return
	}
	b.filling[newNet] = true
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		for {
			p, err := b.startInit(newNet)
			b.mu.Lock()
			if err == nil && !b.closed && len(b.warm[newNet]) < b.poolTarget(newNet) {
				b.warm[newNet] = append(b.warm[newNet], p)
				p = nil
			}
			more := err == nil && !b.closed && len(b.warm[newNet]) < b.poolTarget(newNet)
			if !more {
				b.filling[newNet] = false
			}
			b.mu.Unlock()
			if err != nil {
				b.o.logger.Warn("namespace: starting an init ahead", slog.Any("err", err))
			}
			if p != nil {
				p.discard()
			}
			if !more {
				return
			}
		}
	}()
}

func (b *Backend) track(p *initProc, kill func(backend.TerminationReason)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.running[p] = kill
	b.wg.Add(1)
	return true
}

func (b *Backend) untrack(p *initProc) {
	b.mu.Lock()
	delete(b.running, p)
	b.mu.Unlock()
	b.wg.Done()
}

// copyWait bounds how long output copying may go on after the init is
// gone. Every process of the namespace dies with it, so the pipes reach
// EOF at once unless a descriptor was smuggled out of the sandbox.
const copyWait = 2 * time.Second

func (b *Backend) exec(ctx context.Context, req *backend.Request) (res *backend.Result, err error) {
	start := time.Now()
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, backend.ErrClosed
	}
	cfg, err := b.prepare(req)
	if err != nil {
		return nil, err
	}
	defer func() {
		// Exec's contract: Stdin is closed whatever happens.
		if c, ok := req.Stdin.(io.Closer); ok {
			c.Close()
		}
	}()
	lim := req.Limits.WithDefaults().WithIsolationDefaults()
	if !overlayPathOK(b.o.stateDir) {
		return nil, fmt.Errorf("%w: namespace: state dir %q holds a character overlayfs options cannot carry (, : or \\); choose another with WithStateDir", backend.ErrUnavailable, b.o.stateDir)
	}

	p := b.takeWarm(cfg.NewNet)
	defer b.done(cfg.NewNet)
	if p == nil {
		if p, err = b.startInit(cfg.NewNet); err != nil {
			return nil, fmt.Errorf("%w: namespace: %v", backend.ErrUnavailable, err)
		}
	}
	// The next Exec's init starts once this one is done, off the critical
	// path of this command.
	defer b.refill(cfg.NewNet)

	var (
		reason atomic.Value // backend.TerminationReason, set by whoever kills first
		procMu sync.Mutex
		cur    = p
	)
	kill := func(why backend.TerminationReason) {
		reason.CompareAndSwap(nil, why)
		procMu.Lock()
		defer procMu.Unlock()
		// SIGKILL to pid 1 of the namespace: the kernel kills the rest.
		_ = cur.cmd.Process.Kill()
	}
	if !b.track(p, kill) {
		p.discard()
		return nil, backend.ErrClosed
	}
	defer b.untrack(p)

	cg, cgErr := b.newCgroup(p.run, lim)
	if cgErr != nil {
		b.o.logger.Warn("namespace: cgroup limits not applied", slog.Any("err", cgErr))
	}
	// reapLater: the init reported its namespace empty, so Exec returns
	// without waiting for the kernel to finish its exit; a background
	// goroutine reaps it, then removes the cgroup and the run.
	reapLater := false
	defer func() {
		if cg != nil && !reapLater {
			cg.remove()
		}
	}()

	// Send the config; an init started ahead may have died meanwhile
	// (EPIPE): replace it once with a fresh one.
	send := func(p *initProc) error {
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
		if cg != nil {
			if err := cg.add(p.cmd.Process.Pid); err != nil {
				b.o.logger.Warn("namespace: cgroup attach", slog.Any("err", err))
			}
		}
		data, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		_, err = p.cfgW.Write(data)
		return err
	}
	// Hidden paths become whiteouts in the upper layer before the init
	// mounts the overlay; a replacement init below gets its own.
	if err := writeWhiteouts(filepath.Join(p.run.dir, "upper"), cfg.Workspace, cfg.hidden); err != nil {
		p.discard()
		return nil, fmt.Errorf("%w: namespace: hidden paths: %v", backend.ErrUnsupported, err)
	}
	if err := send(p); err != nil {
		b.o.logger.Info("namespace: an init started ahead is gone; starting another", slog.String("why", p.setupError()))
		fresh, ferr := b.startInit(cfg.NewNet)
		if ferr != nil {
			p.discard()
			return nil, fmt.Errorf("%w: namespace: %v", backend.ErrUnavailable, ferr)
		}
		procMu.Lock()
		old := p
		p, cur = fresh, fresh
		procMu.Unlock()
		old.discard()
		if err := writeWhiteouts(filepath.Join(p.run.dir, "upper"), cfg.Workspace, cfg.hidden); err != nil {
			p.discard()
			return nil, fmt.Errorf("%w: namespace: hidden paths: %v", backend.ErrUnsupported, err)
		}
		if err := send(p); err != nil {
			msg := p.setupError()
			p.discard()
			return nil, fmt.Errorf("%w: namespace: sandbox setup: %s", backend.ErrUnavailable, msg)
		}
	}
	defer func() {
		closeAll(p.cfgW, p.stR, p.stdinW, p.stdoutR, p.stderrR)
		if !reapLater {
			b.removeRun(p.run)
			return
		}
		// The caller holds a count on b.wg (a tracked execution), so
		// this Add cannot race with Close's Wait.
		b.wg.Add(1)
		go func(p *initProc) {
			defer b.wg.Done()
			_ = p.cmd.Wait()
			if cg != nil {
				cg.remove()
			}
			if err := p.run.remove(); err != nil {
				b.o.logger.Warn("namespace: removing run directory", slog.String("dir", p.run.dir), slog.Any("err", err))
			}
		}(p)
	}()

	done := make(chan struct{})
	go func() {
		timer := time.NewTimer(lim.Timeout)
		defer timer.Stop()
		select {
		case <-done:
		case <-timer.C:
			kill(backend.Timeout)
		case <-ctx.Done():
			kill(backend.Cancelled)
		}
	}()
	if reason.Load() != nil {
		kill(backend.Cancelled) // Close came while the init was being set up
	}

	out := newOutputs(req.Stdout, req.Stderr, lim.OutputBytes, func() { kill(backend.OutputLimit) })
	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); io.Copy(out.stdout, p.stdoutR) }()
	go func() { defer copies.Done(); io.Copy(out.stderr, p.stderrR) }()
	stdinW := p.stdinW
	if req.Stdin == nil {
		stdinW.Close()
	} else {
		// Abandoned, not waited for, if the reader never returns: the
		// contract allows it, and the deferred Close of req.Stdin and of
		// the pipe end it where they can.
		go func() { io.Copy(stdinW, req.Stdin); stdinW.Close() }()
	}

	status := readStatus(p.stR, func(line string) {
		if rest, ok := strings.CutPrefix(line, "phase "); ok {
			b.initPhase(rest)
			return
		}
		if pid, ok := strings.CutPrefix(line, "started "); ok && cg != nil && pid != "0" {
			if err := cg.tightenPids(lim.Pids, p.cmd.Process.Pid); err != nil {
				b.o.logger.Warn("namespace: pids limit", slog.Any("err", err))
			}
		}
	})
	b.phase("status-eof")
	st := parseStatus(status)
	// Ended means the command exited and every other process of the
	// namespace is dead and reaped: only the init is left, exiting. It
	// is reaped in the background (Close waits for it).
	reapLater = st.ended && st.started && st.exited
	var waitErr error
	if !reapLater {
		waitErr = p.cmd.Wait()
	}
	b.phase("init-reaped")
	close(done)
	copied := make(chan struct{})
	go func() { copies.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(copyWait):
		// A descriptor outlived the namespace, or the caller's writer is
		// stuck: stop copying and return; late output is dropped.
		p.stdoutR.Close()
		p.stderrR.Close()
		select {
		case <-copied:
		case <-time.After(copyWait):
		}
	}
	out.stop()
	b.phase("output-copied")
	dur := time.Since(start)

	if st.err != "" && !st.started {
		// The init failed before starting the command: nothing was started.
		return nil, fmt.Errorf("%w: namespace: sandbox setup: %s", backend.ErrUnavailable, st.err)
	}
	ps := p.cmd.ProcessState
	if ps == nil && !reapLater {
		return nil, fmt.Errorf("%w: namespace: sandbox init: %v", backend.ErrUnavailable, waitErr)
	}
	why, killed := reason.Load().(backend.TerminationReason)
	if !st.started && !killed {
		return nil, fmt.Errorf("%w: namespace: sandbox init ended (%v) before starting the command", backend.ErrUnavailable, ps)
	}

	res = &backend.Result{
		Duration:  dur,
		PID:       st.pid,
		Truncated: out.truncated(),
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
		if cg != nil && cg.oomKilled() {
			res.Termination = backend.OOM
		}
	}
	res.TimedOut = res.Termination == backend.Timeout
	if reapLater {
		res.Metrics = backend.Metrics{
			MaxRSSBytes: st.endedRU[0] * 1024,
			UserCPU:     time.Duration(st.endedRU[1]) * time.Microsecond,
			SystemCPU:   time.Duration(st.endedRU[2]) * time.Microsecond,
		}
	} else if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && ru != nil {
		res.Metrics = backend.Metrics{
			MaxRSSBytes: ru.Maxrss * 1024,
			UserCPU:     time.Duration(ru.Utime.Nano()),
			SystemCPU:   time.Duration(ru.Stime.Nano()),
		}
	}
	var keep *holder
	if req.StreamFiles {
		keep = &holder{b: b}
	}
	ov, err := readOverlayKeep(cfg.Upper, lowerView{dir: cfg.Workspace, pend: cfg.pend}, cfg.hidden, keep)
	if err != nil {
		keep.release()
		// The command ran; its writes could not be read back. Report it
		// loudly rather than returning a silently empty overlay.
		b.o.logger.Error("namespace: reading overlay", slog.Any("err", err))
		return res, fmt.Errorf("namespace: reading the overlay of a finished command: %w", err)
	}
	res.Overlay = ov
	b.phase("overlay-read")
	return res, nil
}

// waitWarm waits until no init is being started ahead; benchmarks use it
// so that the references they time do not share the CPU with it.
func (b *Backend) waitWarm() {
	for {
		b.mu.Lock()
		busy := b.filling[true] || b.filling[false]
		b.mu.Unlock()
		if !busy {
			return
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// phase reports a step of the backend's side to the start-up trace hook.
func (b *Backend) phase(name string) {
	if b.o.phaseHook == nil {
		return
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	b.o.phaseHook(name, ts.Nano())
}

// initPhase passes on a "phase <name> <ns>" line of the init.
func (b *Backend) initPhase(rest string) {
	if b.o.phaseHook == nil {
		return
	}
	name, ns, _ := strings.Cut(rest, " ")
	if n, err := strconv.ParseInt(ns, 10, 64); err == nil {
		b.o.phaseHook("init:"+name, n)
	}
}
