package namespace

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"
	"github.com/pulse-agent/pulse/policy"
)

// initProc is a started sandbox init, waiting for its config. Everything
// that does not depend on the request (namespaces, the run directory, the
// stdio pipes) exists before the request does, so that one init per
// network mode can be started ahead of time: the Go runtime's start-up is
// most of the cost of an Exec.
type initProc struct {
	cmd    *exec.Cmd // nil for an init adopted from a keeper (kept)
	kept   *keptInit // the keeper's hold on an adopted init (keeper_linux.go)
	run    *run
	newNet bool
	home   string // where the init mounted the command's home

	cfgW   *os.File // config to the init; kept open while it runs, as a parent-death signal
	stR    *os.File // status lines from the init
	stdinW *os.File
	// The command's output, read without the netpoller's wake-ups
	// (backend.OutputPipe).
	stdoutR *backend.OutputPipe
	stderrR *backend.OutputPipe
	dialer  *initDialer // asks the init for connections inside (expose_linux.go)
	// cg holds the init already, when StartAhead made it for the limits
	// it was told; the Exec that takes the init takes it too.
	cg *runCgroup
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

func closeOutputs(ps ...*backend.OutputPipe) {
	for _, p := range ps {
		if p != nil {
			p.Close()
		}
	}
}

// startInit starts an init in fresh namespaces; it blocks reading its
// config until exec sends one.
func (b *Backend) startInit(newNet bool) (p *initProc, err error) {
	return b.startInitThen(newNet, nil, nil)
}

// startInitThen is startInit starting the init in the cgroups cg, if not
// nil, where it can be born in them (runCgroup.startBorn), and calling
// started, if not nil, as soon as the init has a pid: before the static
// config, which waits for the /etc walk (etcMasks). started must not
// write p's fields other than cg.
func (b *Backend) startInitThen(newNet bool, cg *runCgroup, started func(p *initProc)) (p *initProc, err error) {
	r, err := b.newRun()
	if err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	// The clean-up holds the init in ip: a failing return sets the named
	// result p to nil before deferred calls run.
	ip := &initProc{run: r, newNet: newNet}
	p = ip
	var childEnds []*os.File
	defer func() {
		closeAll(childEnds...)
		if err != nil {
			closeAll(ip.cfgW, ip.stR, ip.stdinW)
			closeOutputs(ip.stdoutR, ip.stderrR)
			ip.dialer.close()
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
	output := func(name string) (rd *backend.OutputPipe, wr *os.File) {
		if err != nil {
			return nil, nil
		}
		rd, wr, err = backend.NewOutputPipe(name)
		return rd, wr
	}
	stdoutR, stdoutW := output("stdout")
	stderrR, stderrW := output("stderr")
	p.cfgW, p.stR, p.stdinW, p.stdoutR, p.stderrR = cfgW, stR, stdinW, stdoutR, stderrR
	childEnds = []*os.File{cfgR, stW, stdinR, stdoutW, stderrW}
	if err != nil {
		return nil, err
	}
	dialC, dialer, err := newDialPair()
	if err != nil {
		return nil, err
	}
	p.dialer = dialer
	childEnds = append(childEnds, dialC)

	// The init is this binary again, or the small init program installed
	// beside it (initprog_linux.go), told which build it must be.
	cmd := exec.Command("/proc/self/exe")
	mark := nsinit.Version
	extra := []*os.File{cfgR, stW, dialC} // nsinit.ConfigFd, StatusFd, DialFd
	if prog, check := b.initProg(); prog != nil {
		cmd = exec.Command("/proc/self/fd/" + strconv.Itoa(nsinit.ProgFd))
		if check {
			mark += " " + nsinit.Identity()
		}
		extra = append(extra, prog.file) // nsinit.ProgFd
	}
	cmd.Args = initArgs
	// The init's own environment; the command's is built from the
	// request. A race-built binary would otherwise sleep a second at every
	// exit, and one processor keeps the init's threads (which count as
	// pids) few.
	cmd.Env = []string{nsinit.Env + "=" + mark, "GORACE=atexit_sleep_ms=0", "GOMAXPROCS=1"}
	if b.o.phaseHook != nil {
		cmd.Env = append(cmd.Env, nsinit.TraceEnv+"=1")
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
	cmd.ExtraFiles = extra
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
	if cg != nil {
		err = cg.startBorn(func() (int, error) {
			if err := cmd.Start(); err != nil {
				return 0, err
			}
			return cmd.Process.Pid, nil
		})
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return nil, fmt.Errorf("start sandbox init: %w", err)
	}
	b.phase("clone-exec")
	p.cmd = cmd
	p.home = sandboxHome()
	if started != nil {
		started(p)
	}
	static, err := json.Marshal(nsinit.Config{
		Root:     filepath.Join(r.dir, "root"),
		Home:     p.home,
		Mask:     b.masks(),
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

// pid is the init's pid in this process's pid namespace.
func (p *initProc) pid() int {
	if p.kept != nil {
		return p.kept.pid
	}
	return p.cmd.Process.Pid
}

// kill sends the init SIGKILL; its namespace's other processes die with
// it.
func (p *initProc) kill() {
	if p.kept != nil {
		p.kept.kill()
		return
	}
	_ = p.cmd.Process.Kill()
}

// wait waits for the init to exit and reaps it (the keeper reaps an
// adopted one when asked, so that its pid stays its own until then).
func (p *initProc) wait() error {
	if p.kept != nil {
		return p.kept.wait()
	}
	return p.cmd.Wait()
}

// reaped reports whether wait reaped the init, and its resource usage
// where known.
func (p *initProc) reaped() (bool, *syscall.Rusage) {
	if p.kept != nil {
		return p.kept.reaped, p.kept.usage
	}
	ps := p.cmd.ProcessState
	if ps == nil {
		return false, nil
	}
	ru, _ := ps.SysUsage().(*syscall.Rusage)
	return true, ru
}

// masks is etcMasks, or a fresh walk of /etc for a keeper's backend.
func (b *Backend) masks() []string {
	if b.o.freshMasks {
		return walkEtcMasks()
	}
	return etcMasks()
}

// setupError kills the init and returns what it said before dying, for
// an error message.
func (p *initProc) setupError() string {
	p.kill()
	b, _ := io.ReadAll(io.LimitReader(p.stR, 64<<10))
	if st := parseStatus(b); st.err != "" {
		return st.err
	}
	return "the sandbox init exited before it could be configured"
}

// discard ends an init that will not run a command and removes its run.
func (p *initProc) discard() {
	p.cfgW.Close() // the init sees EOF and exits
	p.kill()
	_ = p.wait()
	closeAll(p.stR, p.stdinW)
	closeOutputs(p.stdoutR, p.stderrR)
	p.dialer.close()
	if p.cg != nil {
		p.cg.remove()
	}
	p.run.remove()
}

// takeWarm returns the oldest init started ahead for this network mode,
// if any (none when fresh), and counts the Exec that will use it as
// running (done undoes that).
func (b *Backend) takeWarm(newNet, fresh bool) *initProc {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight[newNet]++
	b.peak[newNet] = max(b.peak[newNet], b.inflight[newNet])
	ps := b.warm[newNet]
	if fresh || len(ps) == 0 {
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
// one processor from the commands being run. Each is put in the cgroups
// of lim, the limits of the Exec that asks for the refill (the next Exec's
// limits are most likely the same): moving a process into a cgroup waits
// for an RCU grace period (see runCgroup.add), milliseconds that then
// overlap the init's start instead of the next Exec's critical path. An
// Exec with other limits ends such an init and starts its own (acquire).
// A non-nil after holds the first start back until it is closed, or the
// backend is (backend.WithBackgroundAfter); meanwhile the mode counts as
// filling, so a second refill starts nothing, and an Exec that comes
// first starts its own init (it would not wait for this one either).
func (b *Backend) refill(newNet bool, lim policy.ResourceLimits, after <-chan struct{}) {
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
		if after != nil {
			select {
			case <-after:
			case <-b.quit:
			}
		}
		for {
			p, err := b.startAttached(newNet, lim)
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

// startAttached starts an init in the cgroups lim needs (p.cg; none when
// they cannot be made, which leaves them to the Exec): born in them where
// it can be (runCgroup.startBorn), moved into the others once it has a
// pid, so that the move's wait for the kernel (see runCgroup.add) and the
// static config's for the /etc walk overlap the init's start instead of
// adding up. A failed move leaves p.cg not added: the Exec tries again,
// and does not run the command if that fails too (configure).
func (b *Backend) startAttached(newNet bool, lim policy.ResourceLimits) (*initProc, error) {
	cg, err := b.newCgroup(lim)
	if err != nil {
		b.o.logger.Debug("namespace: cgroups for an init started ahead", slog.Any("err", err))
		cg = nil
	}
	var started bool
	attached := make(chan struct{})
	p, err := b.startInitThen(newNet, cg, func(p *initProc) {
		started = true
		if cg == nil {
			close(attached)
			return
		}
		p.cg = cg
		go func() {
			defer close(attached)
			_ = cg.add(p.pid())
		}()
	})
	if started {
		<-attached
	}
	if err != nil && cg != nil {
		// startInit killed and reaped the init, if it started: its
		// cgroups are empty.
		cg.remove()
	}
	return p, err
}

// StartAhead starts, in the background, the init that the next Exec
// under network policy n and limits lim will use, unless one is ready or
// being started for that network mode already, and puts it in the
// cgroups lim needs. It does so under WithoutPrestart too: that is its
// use, for a caller that runs one command and knows it is coming (a CLI
// process, once its Probe has run), so that the init's start-up and its
// move into its cgroups (which waits for the kernel: see add) overlap the
// caller's remaining set-up instead of following it. The init is the same
// as an Exec would start. An Exec that finds it still starting waits for
// it rather than starting another; one whose limits need other cgroups
// ends it and starts a fresh one; Close ends it unused. A policy the
// backend would refuse starts nothing.
func (b *Backend) StartAhead(n policy.NetworkPolicy, lim policy.ResourceLimits) {
	newNet, err := networkNamespace(n)
	if err != nil {
		return
	}
	lim = lim.WithDefaults().WithIsolationDefaults() // as Exec has them
	b.mu.Lock()
	if b.closed || len(b.warm[newNet]) > 0 || b.filling[newNet] {
		b.mu.Unlock()
		return
	}
	b.filling[newNet] = true
	ready := make(chan struct{})
	b.ahead[newNet] = ready
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		var p *initProc
		var err error
		var keeper string
		if b.o.keeperIdle > 0 {
			p, keeper = b.adopt(newNet, lim)
		}
		if p == nil {
			p, err = b.startAttached(newNet, lim)
		}
		if keeper != "" {
			// After this process's own init: the keeper's start is not
			// this command's to wait for.
			b.startKeeper(keeper, keeperRequest{NewNet: newNet, Limits: lim})
		}
		b.mu.Lock()
		if err == nil && !b.closed {
			b.warm[newNet] = append(b.warm[newNet], p)
			p = nil
		}
		b.filling[newNet] = false
		delete(b.ahead, newNet)
		close(ready)
		b.mu.Unlock()
		if err != nil {
			b.o.logger.Warn("namespace: starting an init ahead", slog.Any("err", err))
		}
		if p != nil {
			p.discard()
		}
	}()
}

// waitAhead waits for the init StartAhead is starting for this network
// mode, if it is: it is further along than a new one would be.
func (b *Backend) waitAhead(newNet bool) {
	b.mu.Lock()
	ready := b.ahead[newNet]
	b.mu.Unlock()
	if ready != nil {
		<-ready
	}
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
