//go:build linux

package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/syncio"
)

// supported says Exec works on this system.
const supported = true

// gateScript holds a shell on fd 3 until the parent has applied the
// rlimits to it, then closes fd 3 so the command never sees it.
const gateScript = `read -r _pulse_gate <&3; exec 3<&-; unset _pulse_gate
`

// Exec runs req on the host, in the workspace itself.
//
// The command gets its own process group; on timeout, cancellation,
// Close or an output cap, the whole group gets SIGKILL. When the command's
// main process ends by itself, the group is killed too, so that no
// background process it left behind outlives Exec. The group is killed
// while the main process is still an unreaped zombie, so its id cannot
// have been reused by then.
//
// RLIMIT_FSIZE is applied with prlimit(2) to the started child, which is
// held on a pipe (fd 3, read by a one-line shell prologue) until the limit
// is in place: a limit set after start would race with the command's first
// writes, and a re-exec shim would cost a second exec on every command and
// a hook in every binary that embeds the backend. The limit is inherited by
// everything the command starts. RLIMIT_NPROC is not used: it counts every
// process of the user, not of the command, so a small value fails at once
// for a busy user and a large one bounds nothing.
func (b *Backend) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	return b.exec(ctx, req, nil)
}

// exec is Exec; onStart, when set, is called with the command's pid (and
// its terminal, nil without Request.TTY) once it runs (Start uses it).
func (b *Backend) exec(ctx context.Context, req *backend.Request, onStart func(pid int, term *pty)) (*backend.Result, error) {
	if err := b.begin(); err != nil {
		return nil, err
	}
	defer b.running.Done()
	var closeStdin func()
	if req != nil {
		// Whatever happens below, the caller's stdin is closed once on
		// return.
		closeStdin = sync.OnceFunc(func() { closeReader(req.Stdin) })
		defer closeStdin()
	}
	if err := b.Probe(ctx); err != nil {
		return nil, err
	}
	p, err := b.prepare(req)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("host: nothing started: %w", err)
	}
	return b.run(ctx, req, p, closeStdin, onStart)
}

// run starts the planned process and supervises it to its end.
func (b *Backend) run(ctx context.Context, req *backend.Request, p *plan, closeStdin func(), onStart func(pid int, term *pty)) (*backend.Result, error) {
	x, err := b.command(req, p, closeStdin)
	if err != nil {
		return nil, err
	}
	defer x.endTree()
	if err := x.start(); err != nil {
		return nil, err
	}
	if onStart != nil {
		onStart(x.pid, x.term)
	}
	reason := x.supervise(ctx)
	return x.reap(reason), nil
}

// hostExec is one command on the host, through its phases:
//
//	command    the exec.Cmd, its output caps and its stdin and gate pipes
//	start      into a cgroup of its own where there is one, held at the
//	           gate until RLIMIT_FSIZE is set; stdin fed from then on
//	supervise  until it ends by itself, times out, is cancelled or hits
//	           the output cap; then its group and its cgroup are killed
//	reap       the status and usage, the Result
//	endTree    the cgroup removed, whichever phase it stopped in
//
// start returns once the command runs and supervise and reap need nothing
// of the caller's call, so that a command left running in the background
// goes through the same phases, waited for elsewhere.
type hostExec struct {
	b          *Backend
	log        *slog.Logger
	req        *backend.Request
	p          *plan
	closeStdin func()

	cmd            *exec.Cmd
	stdout, stderr *capWriter
	capHit         chan struct{} // closed on the first byte over the output cap
	stdinR, stdinW *os.File      // nil without stdin
	gateR, gateW   *os.File      // nil without a file size limit
	tree           *tree         // nil without a cgroup
	term           *pty          // nil without Request.TTY (tty_linux.go)
	reaped         bool          // started under a subreaper (reaper_linux.go)

	pid       int
	started   time.Time
	duration  time.Duration // from start until the group was killed
	ended     chan struct{} // the main process has exited (not yet reaped)
	stdinDone chan struct{}
}

// command builds the process of plan p: a session of its own, output
// through caps, stdin through a pipe of its own, and the gate that holds
// it until its rlimit is set.
func (b *Backend) command(req *backend.Request, p *plan, closeStdin func()) (*hostExec, error) {
	x := &hostExec{b: b, log: b.log.With("execution_id", req.ExecutionID), req: req, p: p, closeStdin: closeStdin,
		capHit: make(chan struct{}), ended: make(chan struct{})}
	cmd := &exec.Cmd{Path: p.path, Args: p.argv, Dir: p.dir, Env: p.env}
	// Setsid: a session of its own leads a process group of its own (the
	// one killGroup kills) and has no controlling terminal, so the command
	// cannot open the caller's through /dev/tty and type into it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = b.waitDelay
	x.cmd = cmd

	var capOnce sync.Once
	onCap := func() { capOnce.Do(func() { close(x.capHit) }) }
	x.stdout, x.stderr = outputs(req.Stdout, req.Stderr, p.limits.OutputBytes, onCap)
	if req.TTY != nil {
		// The terminal is the command's stdin, stdout and stderr, and
		// the controlling terminal of its session (stdin, fd 0, in the
		// child); all it shows arrives on Stdout.
		t, err := openPTY(req.TTY)
		if err != nil {
			return nil, err
		}
		x.term = t
		cmd.Stdin, cmd.Stdout, cmd.Stderr = t.slave, t.slave, t.slave
		cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, 0
	}
	// A stream nobody reads goes to /dev/null with no pipe and no copier:
	// there is nothing to cap when nothing is delivered.
	if req.Stdout != nil && x.term == nil {
		cmd.Stdout = x.stdout
	}
	if req.Stderr != nil && x.term == nil {
		cmd.Stderr = x.stderr
	}

	// Stdin goes through a pipe this backend owns rather than through
	// os/exec's copier, so that Exec can return as soon as the command has
	// ended even when the caller's reader still blocks.
	if req.Stdin != nil && x.term == nil {
		var err error
		if x.stdinR, x.stdinW, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("host: %w: stdin pipe: %w", backend.ErrUnavailable, err)
		}
		cmd.Stdin = x.stdinR
	}
	if p.limits.FileSizeBytes > 0 {
		var err error
		if x.gateR, x.gateW, err = os.Pipe(); err != nil {
			closeFiles(x.stdinR, x.stdinW)
			x.closeTerm()
			return nil, fmt.Errorf("host: %w: gate pipe: %w", backend.ErrUnavailable, err)
		}
		cmd.ExtraFiles = []*os.File{x.gateR}
		cmd.Path = b.shell
		if req.Shell != "" {
			cmd.Args = []string{filepath.Base(b.shell), "-c", gateScript + req.Shell}
		} else {
			// $0 carries the resolved program, "$@" its arguments.
			cmd.Args = append([]string{filepath.Base(b.shell), "-c", gateScript + `exec "$0" "$@"`, p.path}, p.argv[1:]...)
		}
	}
	return x, nil
}

// start starts the command, lets it through the gate once its rlimit is
// set, and starts feeding its stdin. On an error nothing of it runs.
func (x *hostExec) start() error {
	if err := closeInheritedOnExec(); err != nil {
		closeFiles(x.stdinR, x.stdinW, x.gateR, x.gateW)
		x.closeTerm()
		return fmt.Errorf("host: %w: %w", backend.ErrUnavailable, err)
	}
	if err := x.startInTree(); err != nil {
		closeFiles(x.stdinR, x.stdinW, x.gateR, x.gateW)
		x.closeTerm()
		class := backend.ErrUnavailable
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOEXEC) {
			class = backend.ErrInvalidRequest
		}
		return fmt.Errorf("host: %w: start %s: %w", class, x.p.path, err)
	}
	x.pid = x.cmd.Process.Pid
	closeFiles(x.stdinR, x.gateR)
	if x.term != nil {
		x.term.dropSlave()
		x.term.startCopy(x.stdout)
	}
	x.log.Debug("started", "pid", x.pid, "path", x.p.path, "dir", x.p.dir)

	go func() {
		waitExited(x.pid)
		close(x.ended)
	}()
	if err := x.openGate(); err != nil {
		return err
	}
	x.feedStdin()
	return nil
}

// startInTree starts the command inside a cgroup of its own, so that
// whatever it starts, setsid or not, is killed with it (tree_linux.go).
// Where there is none, or the kernel refuses to start into it, only its
// process group holds it.
func (x *hostExec) startInTree() error {
	cmd, log := x.cmd, x.log
	if x.b.treeBase != "" {
		if tr, err := newTree(x.b.treeBase); err != nil {
			log.Warn("no cgroup for the command; only its process group is killed", "error", err)
		} else {
			x.tree = tr
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, tr.fd
		}
	}
	// Where no cgroup holds them, a child subreaper does (reaper_linux.go).
	if x.tree == nil && reaperAvailable() {
		x.reaped = true
		underReaper(cmd)
	}
	x.started = time.Now()
	err := cmd.Start()
	if err != nil && x.tree != nil {
		// clone3 refused (an old kernel, a filter): start it plainly and
		// move it in; what it forks before the move is not tracked.
		log.Warn("starting into the cgroup failed; moving the command in after start", "error", err)
		sys := *cmd.SysProcAttr
		sys.UseCgroupFD, sys.CgroupFD = false, 0
		cmd = &exec.Cmd{Path: cmd.Path, Args: cmd.Args, Dir: cmd.Dir, Env: cmd.Env, Stdin: cmd.Stdin, Stdout: cmd.Stdout,
			Stderr: cmd.Stderr, ExtraFiles: cmd.ExtraFiles, SysProcAttr: &sys, WaitDelay: cmd.WaitDelay}
		x.cmd = cmd
		if err = cmd.Start(); err == nil {
			if aerr := x.tree.add(cmd.Process.Pid); aerr != nil {
				log.Warn("moving the command into its cgroup", "error", aerr)
			}
		}
	}
	return err
}

// openGate sets RLIMIT_FSIZE on the started command and lets it go on.
// When the limit cannot be set, the command, still held at the gate, is
// killed: nothing of it ran.
func (x *hostExec) openGate() error {
	if x.gateW == nil {
		return nil
	}
	lim := syscall.Rlimit{Cur: uint64(x.p.limits.FileSizeBytes), Max: uint64(x.p.limits.FileSizeBytes)}
	if err := prlimit(x.pid, syscall.RLIMIT_FSIZE, &lim); err != nil {
		x.gateW.Close()
		killGroup(x.pid)
		<-x.ended
		_ = x.cmd.Wait()
		closeFiles(x.stdinW)
		x.closeTerm()
		return fmt.Errorf("host: %w: set RLIMIT_FSIZE: %w", backend.ErrUnavailable, err)
	}
	x.gateW.Close()
	return nil
}

func (x *hostExec) feedStdin() {
	x.stdinDone = make(chan struct{})
	if x.term != nil && x.req.Stdin != nil {
		go func() {
			defer close(x.stdinDone)
			x.term.feed(x.req.Stdin)
		}()
		return
	}
	if x.stdinW == nil {
		close(x.stdinDone)
		return
	}
	go func() {
		defer close(x.stdinDone)
		// An error here means the command closed its stdin or ended;
		// either way there is nothing left to deliver.
		_, _ = io.Copy(x.stdinW, x.req.Stdin)
		x.stdinW.Close()
	}()
}

// supervise waits for the command to end by itself or be ended (timeout,
// ctx, Close, the output cap: the reason, "" for none), then kills its
// group and its cgroup and stops feeding its stdin.
func (x *hostExec) supervise(ctx context.Context) backend.TerminationReason {
	timer := time.NewTimer(x.p.limits.Timeout)
	defer timer.Stop()
	var reason backend.TerminationReason
	select {
	case <-x.ended:
	case <-timer.C:
		reason = backend.Timeout
	case <-ctx.Done():
		reason = backend.Cancelled
	case <-x.b.closing:
		reason = backend.Cancelled
	case <-x.capHit:
		reason = backend.OutputLimit
	}
	// Kill the group whatever ended the command: on a normal exit this
	// takes down background processes it left behind; then the cgroup,
	// which holds those that left the group too; or first the subreaper,
	// which kills those reparented to it.
	if x.reaped {
		stopReaper(x.pid, x.ended)
	}
	killGroup(x.pid)
	<-x.ended
	if x.tree != nil {
		if err := killTree(x.tree.dir); err != nil {
			x.log.Warn("killing the command's cgroup", "error", err)
		}
	}
	x.duration = time.Since(x.started)
	if reason != "" {
		x.log.Info("killed process group", "pid", x.pid, "reason", string(reason))
	}

	// The command is gone: stop feeding stdin. Closing the write end
	// fails a copier blocked on a full pipe; closing the caller's reader
	// (if it can be closed) unblocks one stuck in Read. A reader that
	// cannot be closed and never returns is abandoned, as the contract
	// allows.
	select {
	case <-x.stdinDone:
	default:
		closeFiles(x.stdinW)
		x.closeStdin()
	}
	return reason
}

// reap collects the dead command's status, once its output is drained (up
// to the wait delay), into its Result.
func (x *hostExec) reap(reason backend.TerminationReason) *backend.Result {
	log, pid, duration := x.log, x.pid, x.duration
	waitErr := x.cmd.Wait()
	if x.term != nil {
		// Everything holding the terminal is dead: what it still shows
		// is read to EIO, a bounded time.
		x.term.drain(x.b.waitDelay)
	}
	if errors.Is(waitErr, exec.ErrWaitDelay) {
		log.Warn("output pipes still open after the process group was killed; a process escaped the group", "pid", pid, "wait_delay", x.b.waitDelay)
	}
	st := x.cmd.ProcessState
	res := &backend.Result{
		ExitCode:  st.ExitCode(),
		Duration:  duration,
		PID:       pid,
		Truncated: x.stdout.truncated() || x.stderr.truncated(),
	}
	ws, _ := st.Sys().(syscall.WaitStatus)
	switch {
	case reason != "":
		res.Termination = reason
	case ws.Signaled():
		res.Termination = backend.Signaled
	default:
		res.Termination = backend.Exited
	}
	if reason != "" && ws.Exited() {
		// The command ended by itself just as it was being killed; the
		// reason stands, but its real status is kept.
		log.Debug("process exited while being killed", "pid", pid, "exit_code", ws.ExitStatus())
	}
	res.TimedOut = res.Termination == backend.Timeout
	if ru, ok := st.SysUsage().(*syscall.Rusage); ok && ru != nil {
		res.Metrics = backend.Metrics{
			MaxRSSBytes: ru.Maxrss * 1024, // Linux reports kilobytes
			UserCPU:     time.Duration(ru.Utime.Nano()),
			SystemCPU:   time.Duration(ru.Stime.Nano()),
		}
	}
	if e := x.stdout.err(); e != nil {
		log.Warn("stdout writer failed; the rest of stdout was dropped", "error", e)
	}
	if e := x.stderr.err(); e != nil {
		log.Warn("stderr writer failed; the rest of stderr was dropped", "error", e)
	}
	log.Debug("ended", "pid", pid, "termination", string(res.Termination), "exit_code", res.ExitCode, "duration", duration)
	return res
}

// endTree removes the command's cgroup, if it got one.
func (x *hostExec) endTree() {
	if x.tree == nil {
		return
	}
	if err := x.tree.end(); err != nil {
		x.log.Warn("ending the command's cgroup", "error", err)
	}
}

// closeInheritedOnExec marks every descriptor above stderr of this
// process close-on-exec. os/exec passes a child every descriptor that
// lacks the flag, and the only ones that do are those this process itself
// inherited so (a shell's `exec 8>>file`, `exec 9</`): through them a
// command could write or walk what its caller never meant to hand it. Go
// creates its own descriptors close-on-exec and ExtraFiles are dup'ed
// into the child, so the process loses nothing it uses; its later
// children no longer inherit such descriptors either.
func closeInheritedOnExec() error {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing inherited descriptors: %w", err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
	return nil
}

// killGroup sends SIGKILL to the process group led by pid. ESRCH (the
// group is already empty) is not an error worth reporting.
func killGroup(pid int) { _ = syscall.Kill(-pid, syscall.SIGKILL) }

// waitExited blocks until pid has exited, without reaping it (WNOWAIT), so
// that pid, and with it the process group id, stays reserved until
// cmd.Wait reaps it after the group was killed.
func waitExited(pid int) {
	const pPID = 1
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|0x01000000 /* WNOWAIT */, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}

func prlimit(pid, resource int, lim *syscall.Rlimit) error {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(resource),
		uintptr(unsafe.Pointer(lim)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// outputs wraps the caller's writers in caps. When both are the same
// writer, the two copiers share a lock so that the writer is never called
// from both at once.
func outputs(out, errw io.Writer, limit int64, onCap func()) (*capWriter, *capWriter) {
	if out != nil && sameWriter(out, errw) {
		lw := &syncio.Writer{W: out}
		out, errw = lw, lw
	}
	return &capWriter{w: out, left: limit, onCap: onCap}, &capWriter{w: errw, left: limit, onCap: onCap}
}

func sameWriter(a, b io.Writer) bool {
	if a == nil || b == nil {
		return false
	}
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	if ta != tb || !ta.Comparable() {
		return false
	}
	return a == b
}

// capWriter passes at most left bytes to w and drops the rest, reporting
// the first overflow through onCap. It never returns an error, so that the
// copier keeps draining the pipe and the command is never blocked on a
// full pipe by a failed or capped writer.
type capWriter struct {
	mu    sync.Mutex
	w     io.Writer
	left  int64
	over  bool
	werr  error
	onCap func()
}

func (c *capWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	q := p
	if int64(len(q)) > c.left {
		q = q[:c.left]
		if !c.over {
			c.over = true
			c.onCap()
		}
	}
	c.left -= int64(len(q))
	if len(q) > 0 && c.w != nil && c.werr == nil {
		m, err := c.w.Write(q)
		if err == nil && m < len(q) {
			err = io.ErrShortWrite
		}
		c.werr = err
	}
	return n, nil
}

func (c *capWriter) truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.over
}

func (c *capWriter) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.werr
}
