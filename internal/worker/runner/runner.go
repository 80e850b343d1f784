package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
)

const (
	// ChunkSize is the size of one pipe read and so the largest Chunk
	// payload. It is 32 KiB less room for the frame's own fields, so that
	// a whole encoded WorkerFrame fits in 32 KiB: gRPC takes marshal and
	// unmarshal buffers from size tiers (..., 32 KiB, 1 MiB) and zeroes
	// each one it hands out, so a frame of 32 KiB plus a few bytes would
	// cost a 1 MiB clear on both sides (measured: ~4x slower streaming).
	ChunkSize = 32<<10 - chunkFrameOverhead
	// chunkFrameOverhead bounds the bytes a WorkerFrame{Chunk} adds to its
	// data: tags, the length varints and a 10-byte req_id varint.
	chunkFrameOverhead = 32
	// BufferCap bounds what a non-streaming exec buffers per stream. It
	// matches the harness's default output cap.
	BufferCap = 8 << 20
	// defaultWaitDelay bounds how long output is still drained after the
	// child has exited or been killed, so a grandchild that escaped the
	// group but kept a pipe open cannot wedge the exec.
	defaultWaitDelay = 2 * time.Second
)

var (
	// ErrTimeout reports that the exec's timeout expired and its process
	// group was killed.
	ErrTimeout = errors.New("runner: timeout")
	// ErrAborted reports that the context was cancelled (Abort or a lost
	// connection) and the process group was killed.
	ErrAborted = errors.New("runner: aborted")
	// ErrSink wraps the error of a Sink call that failed.
	ErrSink = errors.New("runner: sink failed")
	// ErrStart wraps a failure to create pipes or start the child.
	ErrStart = errors.New("runner: cannot start command")
)

// Spec is one exec as the relay asked for it.
type Spec struct {
	ReqID     uint64
	Command   string
	Stdin     []byte
	TimeoutS  uint32 // 0: no timeout
	Streaming bool
}

// Sink receives output as it is produced. data is only valid during the
// call. Calls for one stream are never concurrent, but stdout and stderr
// calls may be. An error means the output has nowhere to go.
type Sink interface {
	Chunk(stream sandboxv1.Stream, data []byte) error
}

// Runner runs one command to completion.
type Runner interface {
	// Run returns the child's exit code (-1 when it died by a signal), or
	// ErrTimeout, ErrAborted, ErrStart or ErrSink (wrapped). Cancelling ctx
	// kills the process group.
	Run(ctx context.Context, s Spec, sink Sink) (exitCode int32, err error)
}

// Option configures a Bash runner.
type Option func(*options) error

type options struct {
	shell     string
	env       []string
	dir       string
	waitDelay time.Duration
	logger    *slog.Logger
}

// WithShell sets the shell run as "<shell> -c <command>"; default "bash".
func WithShell(path string) Option {
	return func(o *options) error {
		if path == "" {
			return errors.New("runner: empty shell")
		}
		o.shell = path
		return nil
	}
}

// WithEnv sets the children's environment. The default is the worker's own
// environment; pass a filtered copy to keep the worker's secrets (its relay
// token) away from the commands.
func WithEnv(env []string) Option {
	return func(o *options) error {
		o.env = append([]string(nil), env...)
		return nil
	}
}

// WithDir sets the children's working directory; default the worker's.
func WithDir(dir string) Option {
	return func(o *options) error { o.dir = dir; return nil }
}

// WithWaitDelay bounds the output drain after the child exits or is killed.
func WithWaitDelay(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("runner: wait delay must be positive")
		}
		o.waitDelay = d
		return nil
	}
}

// WithLogger sets the logger; default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("runner: nil logger")
		}
		o.logger = l
		return nil
	}
}

// Bash runs each exec as a fresh "bash -c" child. It holds no state between
// execs and is safe for concurrent use.
type Bash struct {
	o options
}

var _ Runner = (*Bash)(nil)

// New returns a Bash runner.
func New(opts ...Option) (*Bash, error) {
	var o options
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.shell == "" {
		o.shell = "bash"
	}
	if o.waitDelay == 0 {
		o.waitDelay = defaultWaitDelay
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	return &Bash{o: o}, nil
}

// Run implements Runner.
func (b *Bash) Run(ctx context.Context, s Spec, sink Sink) (int32, error) {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if s.TimeoutS > 0 {
		var stop context.CancelFunc
		runCtx, stop = context.WithTimeoutCause(runCtx, time.Duration(s.TimeoutS)*time.Second, ErrTimeout)
		defer stop()
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		return -1, fmt.Errorf("%w: %w", ErrStart, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return -1, fmt.Errorf("%w: %w", ErrStart, err)
	}
	defer outR.Close()
	defer errR.Close()

	cmd := exec.Command(b.o.shell, "-c", s.Command)
	cmd.Env = b.o.env
	cmd.Dir = b.o.dir
	cmd.Stdout = outW
	cmd.Stderr = errW
	if len(s.Stdin) > 0 {
		cmd.Stdin = bytes.NewReader(s.Stdin)
	} // nil Stdin is /dev/null: EOF at once.
	// A process group of its own, so one kill reaches every grandchild of
	// a pipeline instead of orphaning them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = b.o.waitDelay

	if runCtx.Err() != nil {
		outW.Close()
		errW.Close()
		return -1, ErrAborted
	}
	startErr := cmd.Start()
	// The child holds its own copies; ours must go, or EOF never comes.
	outW.Close()
	errW.Close()
	if startErr != nil {
		return -1, fmt.Errorf("%w: %w", ErrStart, startErr)
	}
	pgid := cmd.Process.Pid

	var (
		killed  atomic.Bool
		sinkMu  sync.Mutex
		sinkErr error
	)
	exited := make(chan struct{})
	kill := func() {
		select {
		case <-exited:
			return // reaped: the pgid may already name someone else
		default:
		}
		if killed.CompareAndSwap(false, true) {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}
	failSink := func(err error) {
		sinkMu.Lock()
		if sinkErr == nil {
			sinkErr = err
		}
		sinkMu.Unlock()
		kill()
	}
	// emit hands data on unless the group has been killed: after an
	// abort or timeout the caller must see no more output.
	emit := func(stream sandboxv1.Stream, data []byte) {
		if killed.Load() {
			return
		}
		if err := sink.Chunk(stream, data); err != nil {
			failSink(err)
		}
	}

	var drains sync.WaitGroup
	var bufs [2]*capBuffer
	for i, p := range []struct {
		r      *os.File
		stream sandboxv1.Stream
	}{{outR, sandboxv1.Stream_STDOUT}, {errR, sandboxv1.Stream_STDERR}} {
		if !s.Streaming {
			bufs[i] = &capBuffer{max: BufferCap}
		}
		drains.Add(1)
		go func(r *os.File, stream sandboxv1.Stream, buf *capBuffer) {
			defer drains.Done()
			drain(r, stream, buf, emit)
		}(p.r, p.stream, bufs[i])
	}

	// Watch for cancellation while the child runs.
	go func() {
		select {
		case <-runCtx.Done():
			kill()
		case <-exited:
		}
	}()
	waitErr := cmd.Wait()
	close(exited)

	// The child is gone; its pipes normally reach EOF at once. A writer
	// that escaped the group may hold them open: stop reading after
	// waitDelay rather than hang.
	drained := make(chan struct{})
	go func() { drains.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(b.o.waitDelay):
		b.o.logger.Warn("output pipe still open after exit; closing it", "req_id", s.ReqID)
		outR.Close()
		errR.Close()
		<-drained
	}

	sinkMu.Lock()
	serr := sinkErr
	sinkMu.Unlock()
	if serr != nil {
		return -1, fmt.Errorf("%w: %w", ErrSink, serr)
	}
	if killed.Load() {
		if errors.Is(context.Cause(runCtx), ErrTimeout) && ctx.Err() == nil {
			return -1, ErrTimeout
		}
		return -1, ErrAborted
	}

	if !s.Streaming {
		for i, stream := range []sandboxv1.Stream{sandboxv1.Stream_STDOUT, sandboxv1.Stream_STDERR} {
			buf := bufs[i]
			if buf.dropped > 0 {
				b.o.logger.Warn("non-streaming output truncated",
					"req_id", s.ReqID, "stream", stream.String(), "kept", buf.b.Len(), "dropped", buf.dropped)
			}
			if err := emitBuffered(stream, buf.b.Bytes(), sink); err != nil {
				return -1, fmt.Errorf("%w: %w", ErrSink, err)
			}
		}
	}

	if waitErr != nil {
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) && !errors.Is(waitErr, exec.ErrWaitDelay) {
			return -1, fmt.Errorf("runner: wait: %w", waitErr)
		}
	}
	// ExitCode is -1 when the child died by a signal.
	return int32(cmd.ProcessState.ExitCode()), nil
}

// drain reads r in ChunkSize reads until EOF (or until r is closed under
// it). In streaming mode each read is emitted at once; otherwise it is
// appended to buf.
func drain(r io.Reader, stream sandboxv1.Stream, buf *capBuffer, emit func(sandboxv1.Stream, []byte)) {
	p := make([]byte, ChunkSize)
	for {
		n, err := r.Read(p)
		if n > 0 {
			if buf != nil {
				buf.write(p[:n])
			} else {
				emit(stream, p[:n])
			}
		}
		if err != nil {
			return
		}
	}
}

// emitBuffered sends a non-streaming stream's output after exit: one Chunk
// when it fits in ChunkSize, which is the common case, otherwise
// consecutive ChunkSize pieces. A single frame of up to 8 MiB would break
// the per-frame cap and gRPC's default 4 MiB receive limit on the relay.
func emitBuffered(stream sandboxv1.Stream, data []byte, sink Sink) error {
	if len(data) == 0 {
		return nil
	}
	for len(data) > 0 {
		n := min(len(data), ChunkSize)
		if err := sink.Chunk(stream, data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// capBuffer keeps the first max bytes written and counts the rest, so a
// chatty child is drained (never blocked) without unbounded memory.
type capBuffer struct {
	b       bytes.Buffer
	max     int
	dropped int64
}

func (c *capBuffer) write(p []byte) {
	room := c.max - c.b.Len()
	if room > len(p) {
		room = len(p)
	}
	if room > 0 {
		c.b.Write(p[:room])
	}
	c.dropped += int64(len(p) - room)
}
