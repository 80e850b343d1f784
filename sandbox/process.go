package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
)

// TTY is the size of a terminal (Command.TTY).
type TTY struct {
	Rows, Cols uint16
}

// Process is a command started in the background with Start. Its methods
// are safe for concurrent use.
type Process struct {
	s       *Sandbox
	id      string
	command string
	started time.Time
	bp      backend.Process
	stdin   *io.PipeWriter
	out     *outputLog

	killed sync.Once
	done   chan struct{}
	res    *Result
	err    error
}

// processTable is the sandbox's processes: the live ones, and the output
// logs of all it started, kept until Close.
type processTable struct {
	mu   sync.Mutex
	live map[*Process]struct{}
	logs []*outputLog
	// closing is closed when Close begins (watchers end on it).
	closing chan struct{}
}

// Start runs cmd like Execute — the same checks, audit events, pending
// stack, limits and policies, in the order Execute documents — but
// returns as soon as the command runs, with a handle to it. When the
// command ends, its writes are staged like an Execute's: they join the
// pending stack as the next transaction (Process.Wait's
// Result.Transaction). A refusal, or a backend that could not start it,
// is returned here and nothing runs.
//
// The process is bounded by the command's limits as any command is: it is
// killed when it outlives the timeout (Command.Limits, the policy's
// limits; DefaultTimeout when neither sets one). It is not bound to ctx,
// which only carries values and bounds the start; Kill, or Close of the
// sandbox, ends it. A Start that Close overtakes ends what it launched
// and returns ErrClosed.
//
// Input goes through Process.Stdin (Command.Stdin must be nil). Output
// goes to Command.Stdout and Command.Stderr when they are set, and always
// to the process's output log (Process.Output), scrubbed of secrets in
// both; Result.Stdout and Result.Stderr stay empty.
//
// A backend that cannot run a command in the background (it does not
// implement backend.Starter) is refused with ErrUnsupported.
func (s *Sandbox) Start(ctx context.Context, cmd Command) (*Process, error) {
	p, err := s.start(ctx, cmd)
	return p, s.scrubErr(err)
}

func (s *Sandbox) start(ctx context.Context, cmd Command) (_ *Process, err error) {
	starter, ok := s.backend.(backend.Starter)
	if !ok {
		s.record(ctx, audit.Event{ExecutionID: cmd.ExecutionID, Action: "shell", Target: cmd.String(), Decision: "deny",
			Backend: s.backend.Name(), Reason: "unsupported", Detail: "backend cannot run a process in the background"})
		return nil, fmt.Errorf("%w: backend %q cannot run a process in the background", ErrUnsupported, s.backend.Name())
	}
	if cmd.Stdin != nil {
		return nil, fmt.Errorf("%w: a started process takes its input through Process.Stdin, not Command.Stdin", ErrInvalidCommand)
	}
	if cmd.TTY != nil {
		if ts, ok := s.backend.(backend.TerminalStarter); !ok || !ts.StartsTerminals() {
			s.record(ctx, audit.Event{ExecutionID: cmd.ExecutionID, Action: "shell", Target: cmd.String(), Decision: "deny",
				Backend: s.backend.Name(), Reason: "unsupported", Detail: "backend makes no terminals"})
			return nil, fmt.Errorf("%w: backend %q makes no terminals", ErrUnsupported, s.backend.Name())
		}
		if cmd.TTY.Rows == 0 || cmd.TTY.Cols == 0 {
			return nil, fmt.Errorf("%w: terminal size %dx%d", ErrInvalidCommand, cmd.TTY.Rows, cmd.TTY.Cols)
		}
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	// The sandbox counts the process as running until it has ended and
	// its writes are recorded; Close kills live processes first.
	handedOff := false
	defer func() {
		if !handedOff {
			s.running.Done()
		}
	}()

	stdinR, stdinW := io.Pipe()
	callerOut, callerErr := cmd.Stdout, cmd.Stderr
	cmd.Stdin = stdinR
	x, err := s.newExecution(ctx, cmd)
	if err != nil {
		return nil, err
	}
	// The process outlives this call: what it runs under keeps ctx's
	// values but not its end.
	runCtx := context.WithoutCancel(ctx)
	closeCtx := ctx
	defer func() {
		if !handedOff {
			x.close(closeCtx)
			stdinR.Close()
		}
	}()
	if err := x.check(ctx); err != nil {
		_, err = x.fail(ctx, err)
		return nil, err
	}
	log, err := newOutputLog(2 * x.limits.OutputBytes)
	if err != nil {
		_, err = x.fail(ctx, err)
		return nil, err
	}
	s.procs.keepLog(log)
	x.cmd.Stdout, x.cmd.Stderr, x.tap = callerOut, callerErr, log
	closeCtx = runCtx
	if err := x.prepare(runCtx); err != nil {
		_, err = x.fail(runCtx, err)
		log.end()
		return nil, err
	}
	if cmd.TTY != nil {
		x.req.TTY = &backend.TTY{Rows: cmd.TTY.Rows, Cols: cmd.TTY.Cols}
	}
	x.launching(runCtx)
	bp, err := starter.Start(runCtx, x.req)
	if err != nil {
		_, err = x.finish(runCtx, nil, err)
		log.end()
		return nil, err
	}
	p := &Process{s: s, id: x.id, command: x.cmdStr, started: x.start, bp: bp, stdin: stdinW, out: log,
		done: make(chan struct{})}
	added := s.procs.add(p)
	handedOff = true
	go func() {
		defer s.running.Done()
		br, err := bp.Wait()
		res, err := x.finish(runCtx, br, err)
		x.close(runCtx)
		log.end()
		s.scrubResult(res)
		p.res, p.err = res, s.scrubErr(err)
		s.procs.remove(p)
		close(p.done)
	}()
	if !added {
		// Close began while the command was being launched and has
		// already listed the processes it kills: this one is not among
		// them, so it is ended here, before Close stops waiting for it.
		_ = p.Kill()
		return nil, fmt.Errorf("%w: the sandbox was closed while the process started", errClosed)
	}
	return p, nil
}

// ID is the process's execution id, as the audit log has it.
func (p *Process) ID() string { return p.id }

// Command is the command line, scrubbed of secrets.
func (p *Process) Command() string { return p.s.scrubber.Redact(p.command) }

// StartedAt is when the backend was handed the command.
func (p *Process) StartedAt() time.Time { return p.started }

// Done is closed once the process has ended and its writes are recorded.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process to end (or ctx to), and returns its Result
// as Execute would have, its writes staged. A process ended by Kill
// returns its Result with Termination Cancelled and a nil error.
func (p *Process) Wait(ctx context.Context) (*Result, error) {
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Signal sends sig to the command's main process, audited. It returns
// backend.ErrProcessDone once the process has ended, and an error
// wrapping ErrUnsupported where the backend cannot deliver signals.
func (p *Process) Signal(sig os.Signal) error {
	err := p.bp.Signal(sig)
	d, detail := "allow", "signal "+sig.String()
	if err != nil {
		d, detail = "deny", detail+": "+err.Error()
	}
	p.s.record(context.Background(), audit.Event{ExecutionID: p.id, Action: "signal", Target: p.command, Decision: d,
		Backend: p.s.backend.Name(), Detail: detail})
	return p.s.scrubErr(err)
}

// Kill ends the process and everything it started, and returns once
// none of it runs and its writes are recorded (they are staged as for any
// command that ended). Kill is idempotent; it is audited once.
func (p *Process) Kill() error {
	p.killed.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		p.s.record(context.Background(), audit.Event{ExecutionID: p.id, Action: "signal", Target: p.command,
			Decision: "allow", Backend: p.s.backend.Name(), Detail: "kill: the process and everything it started"})
	})
	err := p.bp.Kill()
	<-p.done
	return p.s.scrubErr(err)
}

// Resize sets the size of the process's terminal (Command.TTY); the
// command gets SIGWINCH. Without a terminal it returns an error wrapping
// ErrUnsupported; after the end, backend.ErrProcessDone.
func (p *Process) Resize(rows, cols uint16) error {
	return p.s.scrubErr(p.bp.Resize(rows, cols))
}

// Stdin is the process's standard input. Closing it gives the command
// EOF; writes fail (io.ErrClosedPipe) once the process has ended.
func (p *Process) Stdin() io.WriteCloser { return p.stdin }

// Output reads what the process printed, stdout and stderr interleaved
// in the order they arrived, from byte offset on. What is guaranteed:
// each stream's bytes are in order; across the two, chunks are in the
// order the backend read them from the command (one terminal, with
// Command.TTY: exactly the order printed; otherwise two pipes, each read
// by a copier of its own — host and namespace — or the engine's one
// multiplexed stream — Docker — so that output printed to one stream
// while the other's copier had not yet read what came before it can be
// logged first). When secrets are scrubbed, up to the scrubber's
// HoldBack bytes at the tail of one stream, which could begin a secret,
// wait for more of that stream (or its end) and are logged after what
// came later on the other; nothing waits for the caller's writers. It follows the
// process: a Read waits for more until the process has ended, then
// returns io.EOF after the last byte. A caller that reconnects with the
// count of bytes it has read so far as offset reads every byte exactly
// once. Output is scrubbed of secrets. The log is kept, in a temporary
// file no other process can open, until the sandbox closes; it holds at
// most twice the output_bytes limit (the output cap ends a process that
// prints more than that on one stream).
func (p *Process) Output(offset int64) io.ReadCloser { return p.out.reader(offset) }

// OutputSnapshot returns what the process has printed from byte offset
// on, as it stands now, without waiting for more: the bytes Output would
// read from offset until it caught up with the process, scrubbed the same
// way. ended reports that the process has ended and its log is complete,
// so that nothing will follow what was returned; otherwise a caller polls
// again from offset+len(out). It suits a caller that asks "what has it
// printed so far?" (a tool call, a status page) where Output suits one
// that follows. After the sandbox closed it returns an error.
func (p *Process) OutputSnapshot(offset int64) (out []byte, ended bool, err error) {
	return p.out.snapshot(offset)
}

// OutputSize is how many bytes of output the process's log holds now.
func (p *Process) OutputSize() int64 { return p.out.Size() }

// Processes lists the sandbox's live processes (started and not yet
// ended), oldest first.
func (s *Sandbox) Processes() []*Process {
	s.procs.mu.Lock()
	out := make([]*Process, 0, len(s.procs.live))
	for p := range s.procs.live {
		out = append(out, p)
	}
	s.procs.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].started.Before(out[j].started) })
	return out
}

// add lists p as live, unless Close has begun: Close kills the live
// processes it lists once closing is closed, so a process added after
// that would be left running (add reports false and the caller ends it).
func (t *processTable) add(p *Process) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing != nil {
		select {
		case <-t.closing:
			return false
		default:
		}
	}
	if t.live == nil {
		t.live = map[*Process]struct{}{}
	}
	t.live[p] = struct{}{}
	return true
}

func (t *processTable) remove(p *Process) {
	t.mu.Lock()
	delete(t.live, p)
	t.mu.Unlock()
}

func (t *processTable) keepLog(l *outputLog) {
	t.mu.Lock()
	t.logs = append(t.logs, l)
	t.mu.Unlock()
}

// closing is closed once the sandbox's Close has begun.
func (s *Sandbox) closing() <-chan struct{} {
	s.procs.mu.Lock()
	defer s.procs.mu.Unlock()
	if s.procs.closing == nil {
		s.procs.closing = make(chan struct{})
	}
	return s.procs.closing
}

// killProcesses ends every live process (Close calls it before it waits
// for running calls).
func (s *Sandbox) killProcesses() {
	s.closing()
	s.procs.mu.Lock()
	select {
	case <-s.procs.closing:
	default:
		close(s.procs.closing)
	}
	s.procs.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range s.Processes() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Kill(); err != nil && !errors.Is(err, backend.ErrProcessDone) {
				s.log.Warn("killing a process at close", "process", p.id, "err", err)
			}
		}()
	}
	wg.Wait()
}

// closeLogs drops the output logs (Close, once nothing runs).
func (s *Sandbox) closeLogs() {
	s.procs.mu.Lock()
	logs := s.procs.logs
	s.procs.logs = nil
	s.procs.mu.Unlock()
	for _, l := range logs {
		l.close()
	}
}
