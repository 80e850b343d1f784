package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/daemon"
)

func init() {
	register(command{
		name:    "daemon",
		summary: "the resident pulse that pulse exec, cow, mcp and review hand their work to",
		usage:   []string{"pulse daemon serve [--idle D] [--log]", "pulse daemon status [--json]", "pulse daemon stop"},
		help: `pulse exec, cow, mcp and review hand their command to a resident pulse of
this user, started by the first of them that finds none, which keeps what a
command needs ready for the next one: the workspace's sandbox (its copy-on-write
store, audit writer, policy and a box started ahead). Output goes straight to
the caller's terminal or pipe; exit code, Ctrl-C (130) and the environment
travel with the command, and what is printed is what a pulse process of its own
prints. An MCP session, the review page and pulse cow are served by the daemon
with the workspace's sandbox too, so they and the commands of the workspace
share one store, one audit writer and its locks, and the page shows at once what
a command or MCP client stages; the daemon counts a session or page as running
(it does not exit while one is open) and ends one when its client ends. Processes an MCP
session started end with it.
One daemon serves one directory and environment (a command from another
directory, or with another environment, gets its own), of one user (its socket
is in a directory only the user can open, and both ends check each other's
uid): $XDG_RUNTIME_DIR/pulse-daemon, else pulse-daemon-UID in the temporary
directory or ~/.cache/pulse/daemon. It exits after PULSE_KEEP_WARM unused
(default 5m); PULSE_KEEP_WARM=0 or PULSE_NO_DAEMON=1 runs every command in its
own process, as does any case where no daemon can run, silently. Should the
daemon end while it runs a command, pulse says so and exits 125: the command
may have run in part, and what it wrote is staged only if it got that far
(pulse cow list).
serve runs the daemon of this directory and environment in the foreground
(--log: a line on stderr for each request); status says whether one runs;
stop ends it (a command it runs is cancelled).
--json: status prints {running, pid, served, active, idle}.`,
		subcommands: []string{"serve", "status", "stop"},
		run:         runDaemon,
	})
}

// runDaemon implements `pulse daemon serve|status|stop`.
func runDaemon(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 {
		return usageError(env, newFlagSet(env, "daemon"), "no subcommand given")
	}
	sub := args[0]
	if isHelp(sub) {
		return commandHelp(env, "daemon")
	}
	if sub != "serve" && sub != "status" && sub != "stop" {
		return usageError(env, newFlagSet(env, "daemon"), fmt.Sprintf("unknown subcommand %q", sub))
	}
	fs := newFlagSet(env, "daemon "+sub)
	idle := fs.Duration("idle", 0, "serve: exit after this long without a request (default PULSE_KEEP_WARM, 5m)")
	logReq := fs.Bool("log", false, "serve: a line on stderr for each request")
	asJSON := fs.Bool("json", false, "status: print JSON")
	if code, done := parseNoArgs(env, fs, args[1:]); done {
		return code
	}
	if env.hold != nil {
		fmt.Fprintf(env.stderr, "pulse daemon: not inside the daemon\n")
		return exitUsage
	}
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse daemon %s: %v\n", sub, err)
		return exitFailure
	}
	dir, name := daemon.Dir(), daemon.Name(wd, os.Environ())
	switch sub {
	case "status":
		rep, err := daemon.Ask(dir, name, &daemon.Request{Op: daemon.OpStatus, Dir: wd, Env: os.Environ()})
		if errors.Is(err, daemon.ErrNotRunning) {
			if *asJSON {
				writeJSON(env.stdout, map[string]any{"running": false})
			} else {
				fmt.Fprintln(env.stdout, "no daemon runs for this directory and environment")
			}
			return exitOK
		}
		if err != nil || rep.Status == nil {
			fmt.Fprintf(env.stderr, "pulse daemon status: %v\n", err)
			return exitFailure
		}
		st := rep.Status
		if *asJSON {
			writeJSON(env.stdout, map[string]any{"running": true, "pid": st.Pid, "served": st.Served, "active": st.Running, "idle": st.Idle})
		} else {
			fmt.Fprintf(env.stdout, "daemon pid %d: %d command(s) served, %d running; exits after %s unused\n", st.Pid, st.Served, st.Running, st.Idle)
		}
		return exitOK
	case "stop":
		_, err := daemon.Ask(dir, name, &daemon.Request{Op: daemon.OpStop, Dir: wd, Env: os.Environ()})
		if err != nil && !errors.Is(err, daemon.ErrNotRunning) {
			fmt.Fprintf(env.stderr, "pulse daemon stop: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	if *idle <= 0 {
		keep, err := keepWarm(env.getenv)
		if err != nil {
			fmt.Fprintf(env.stderr, "pulse daemon serve: %v\n", err)
			return exitUsage
		}
		if keep == 0 {
			fmt.Fprintln(env.stderr, "pulse daemon serve: PULSE_KEEP_WARM=0: nothing is kept; not serving")
			return exitUsage
		}
		*idle = keep
	}
	logger := slog.New(slog.DiscardHandler)
	if *logReq {
		logger = slog.New(slog.NewTextHandler(env.stderr, nil))
	}
	hold := newSandboxHold(*idle)
	defer hold.close()
	srv := &daemon.Server{Dir: dir, Name: name, Idle: *idle, Logger: logger, Handle: serveCommand(hold)}
	if err := srv.Serve(ctx); err != nil {
		if errors.Is(err, daemon.ErrRunning) {
			return exitOK
		}
		fmt.Fprintf(env.stderr, "pulse daemon serve: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// serveCommand runs a request's pulse command as this process would
// run it from its own command line, with the request's streams and
// environment.
func serveCommand(hold *sandboxHold) daemon.Handler {
	return func(ctx context.Context, req *daemon.Request, stdio [3]*os.File) (code int) {
		env := &cliEnv{stdin: stdio[0], stdout: stdio[1], stderr: stdio[2], getenv: daemon.Getenv(req.Env),
			prog: req.Prog, hold: hold, env: req.Env}
		defer func() {
			// A command's panic is that command's internal error, not
			// the end of every command the daemon runs.
			if r := recover(); r != nil {
				fmt.Fprintf(stdio[2], "pulse: internal error: %v\n%s", r, debug.Stack())
				code = exitInternal
			}
		}()
		if len(req.Args) == 0 || !slices.Contains(daemon.Commands, req.Args[0]) {
			fmt.Fprintf(stdio[2], "pulse: the daemon does not run %q\n", req.Args[0])
			return exitUsage
		}
		if req.Args[0] == "exec" {
			// The box the next command takes is started once this one's
			// client has its exit (backend.WithBackgroundAfter), not
			// beside the command's end and the client's exit. Not for
			// an MCP session or a review page: the request is the whole
			// session, and its commands want the next box at once.
			ctx = backend.WithBackgroundAfter(ctx, daemon.Replied(ctx))
		}
		return run(ctx, env, req.Args)
	}
}

// viaDaemon runs `pulse ARGS` in the daemon of this directory and
// environment, when the command is one a daemon runs and one can. ok
// false: the caller runs the command itself (no daemon, none trusted,
// PULSE_NO_DAEMON, PULSE_KEEP_WARM=0); where no daemon ran, one is
// started for the next command.
func viaDaemon(args []string) (code int, ok bool) {
	if len(args) == 0 || !slices.Contains(daemon.Commands, args[0]) {
		return 0, false
	}
	if v := os.Getenv(noDaemonEnv); v != "" && v != "0" {
		return 0, false
	}
	if keep, err := keepWarm(os.Getenv); err != nil || keep == 0 {
		return 0, false
	}
	wd, err := os.Getwd()
	if err != nil {
		return 0, false
	}
	environ := os.Environ()
	dir := daemon.Dir()
	name := daemon.Name(wd, environ)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	req := &daemon.Request{Args: args, Prog: progName(os.Args[0]), Dir: wd, Env: environ}
	code, err = daemon.Run(dir, name, req, [3]*os.File{os.Stdin, os.Stdout, os.Stderr}, sigs)
	if err == nil {
		return code, true
	}
	if errors.Is(err, daemon.ErrLost) {
		fmt.Fprintf(forTerminal(os.Stderr), "pulse: %v: the command may have run in part and was not run again; "+
			"what it wrote is staged only if it got that far (pulse cow list shows the pending transactions)\n", err)
		if code == 0 {
			code = exitSandbox
		}
		return code, true
	}
	signal.Stop(sigs)
	select {
	case s := <-sigs:
		// Ended before anything ran.
		return 128 + int(s.(syscall.Signal)), true
	default:
	}
	if errors.Is(err, daemon.ErrNotRunning) {
		_ = daemon.Start("daemon", "serve")
	}
	return 0, false
}

// cancelableStdin returns a reader of r (a client's stdin passed to the
// daemon) that ends, with io.EOF, when ctx does or stop is called. A
// read of the descriptor itself would wait for the client's writer,
// which may outlive the session (a killed client's parent holds it), and
// the descriptor cannot be made non-blocking: its open file is the
// client's too.
func cancelableStdin(ctx context.Context, r io.Reader) (io.Reader, func()) {
	f, ok := r.(*os.File)
	if !ok {
		return r, func() {}
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return r, func() {}
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return r, func() {}
	}
	wakeR, wakeW := os.NewFile(uintptr(p[0]), "wake"), os.NewFile(uintptr(p[1]), "wake")
	cr := &pollReader{raw: raw, wake: wakeR}
	done := make(chan struct{})
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(done)
			_, _ = wakeW.Write([]byte{0})
		})
	}
	go func() {
		select {
		case <-ctx.Done():
			stop()
		case <-done:
		}
	}()
	return cr, func() {
		stop()
		// The reader's descriptors go once no Read can be in one.
		cr.mu.Lock()
		cr.closed = true
		cr.mu.Unlock()
		wakeR.Close()
		wakeW.Close()
	}
}

// pollReader reads a blocking descriptor once poll(2) says it can,
// waking up on the wake pipe instead.
type pollReader struct {
	raw    syscall.RawConn
	wake   *os.File
	mu     sync.Mutex // held by a Read; Close waits for it
	closed bool
}

func (r *pollReader) Read(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, io.EOF
	}
	var n int
	var rerr error
	// Control holds the descriptor: the daemon's Close of the client's
	// stdin cannot free its number for another file under this read.
	err := r.raw.Control(func(fd uintptr) {
		wfd := int32(r.wake.Fd())
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: wfd, Events: unix.POLLIN}}
			_, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				rerr = err
				return
			}
			if fds[1].Revents != 0 {
				rerr = io.EOF
				return
			}
			if fds[0].Revents == 0 {
				continue
			}
			for {
				n, err = unix.Read(int(fd), b)
				if !errors.Is(err, unix.EINTR) {
					break
				}
			}
			switch {
			case errors.Is(err, unix.EAGAIN):
				continue // another reader of the client's stdin took it
			case err != nil:
				n, rerr = 0, err
			case n == 0 && len(b) > 0:
				rerr = io.EOF
			}
			return
		}
	})
	if err != nil {
		return 0, err
	}
	return n, rerr
}
