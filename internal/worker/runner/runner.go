package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/policy"
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
	// Box, when set, asks for the command of Box run in a box of its own
	// (Boxes) in place of Command. Bash refuses it with ErrNoBox.
	Box *sandboxv1.Box
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

// Bash runs each exec as a fresh "<shell> -c" child on the host backend
// (backend/host), which owns everything about the process: its session
// and process group, its cgroup where the machine has a writable v2
// hierarchy, stdin, the kill of the whole tree when it ends or is ended.
// Bash adds what the relay's protocol asks for: a Spec for a Request,
// output as Sink chunks, and the errors Run promises. It holds no state
// between execs and is safe for concurrent use.
type Bash struct {
	o    options
	host *host.Backend
	dir  string
	env  map[string]string // nil: the worker's own, read at each Run
	// shellErr is why the shell was not found; every Run fails with it.
	shellErr error
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
	b := &Bash{o: o}
	// The host backend takes an absolute shell; a bare name is looked up
	// in the worker's PATH, as exec.Command would.
	shell := o.shell
	if !filepath.IsAbs(shell) {
		if shell, b.shellErr = exec.LookPath(o.shell); b.shellErr == nil {
			shell, b.shellErr = filepath.Abs(shell)
		}
	}
	hostOpts := []host.Option{host.WithWaitDelay(o.waitDelay), host.WithLogger(o.logger)}
	if b.shellErr == nil {
		hostOpts = append(hostOpts, host.WithShell(shell))
	}
	hb, err := host.New(hostOpts...)
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	b.host = hb
	if b.dir = o.dir; b.dir == "" {
		if b.dir, err = os.Getwd(); err != nil {
			return nil, fmt.Errorf("runner: working directory: %w", err)
		}
	}
	if b.dir, err = filepath.Abs(b.dir); err != nil {
		return nil, fmt.Errorf("runner: working directory: %w", err)
	}
	if o.env != nil {
		b.env = envMap(o.env)
	}
	return b, nil
}

// envMap turns KEY=VALUE entries into the host backend's map, the last of
// a repeated key winning, as os/exec does.
func envMap(list []string) map[string]string {
	m := make(map[string]string, len(list))
	for _, kv := range list {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	return m
}

// Run implements Runner: it builds the request (the timeout is the
// runner's own context, so that output is cut off the moment it fires),
// runs it on the host backend and turns its end into Run's result.
func (b *Bash) Run(ctx context.Context, s Spec, sink Sink) (int32, error) {
	if s.Box != nil {
		return -1, fmt.Errorf("%w: %w", ErrStart, ErrNoBox)
	}
	if b.shellErr != nil {
		return -1, fmt.Errorf("%w: %w", ErrStart, b.shellErr)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if s.TimeoutS > 0 {
		var stop context.CancelFunc
		runCtx, stop = context.WithTimeoutCause(runCtx, time.Duration(s.TimeoutS)*time.Second, ErrTimeout)
		defer stop()
	}
	d := &delivery{ctx: runCtx, fail: cancel, sink: sink, streaming: s.Streaming}
	res, err := b.host.Exec(runCtx, b.request(s, d))
	return outcome(ctx, runCtx, b.o.logger, s, d, res, err)
}

// request is the host backend request for s: the command in the
// configured directory and environment, no limit of the backend's own
// (the runner's context times it out; output is bounded by delivery, not
// killed at a cap).
func (b *Bash) request(s Spec, d *delivery) *backend.Request {
	env := b.env
	if env == nil {
		env = envMap(os.Environ())
	}
	req := &backend.Request{
		ExecutionID: strconv.FormatUint(s.ReqID, 10),
		Workspace:   b.dir,
		Shell:       s.Command,
		Env:         env,
		Stdout:      d.writer(sandboxv1.Stream_STDOUT),
		Stderr:      d.writer(sandboxv1.Stream_STDERR),
		Limits:      policy.ResourceLimits{Timeout: time.Duration(math.MaxInt64), OutputBytes: math.MaxInt64},
	}
	if len(s.Stdin) > 0 {
		req.Stdin = bytes.NewReader(s.Stdin)
	} // nil Stdin is /dev/null: EOF at once.
	return req
}

// outcome turns the backend's end of the command into Run's: a
// failed sink first, then a command that never started, then one the
// runner's context ended (timeout or abort); otherwise the buffered
// output is emitted and the exit code returned.
func outcome(ctx, runCtx context.Context, log *slog.Logger, s Spec, d *delivery, res *backend.Result, err error) (int32, error) {
	if serr := d.sinkErr(); serr != nil {
		return -1, fmt.Errorf("%w: %w", ErrSink, serr)
	}
	if err != nil {
		if runCtx.Err() != nil {
			return -1, ErrAborted
		}
		return -1, fmt.Errorf("%w: %w", ErrStart, err)
	}
	if res.Termination == backend.Cancelled {
		if errors.Is(context.Cause(runCtx), ErrTimeout) && ctx.Err() == nil {
			return -1, ErrTimeout
		}
		return -1, ErrAborted
	}
	if !s.Streaming {
		for i, stream := range []sandboxv1.Stream{sandboxv1.Stream_STDOUT, sandboxv1.Stream_STDERR} {
			buf := &d.bufs[i]
			if buf.dropped > 0 {
				log.Warn("non-streaming output truncated",
					"req_id", s.ReqID, "stream", stream.String(), "kept", buf.b.Len(), "dropped", buf.dropped)
			}
			if err := emitBuffered(stream, buf.b.Bytes(), d.sink); err != nil {
				return -1, fmt.Errorf("%w: %w", ErrSink, err)
			}
		}
	}
	// ExitCode is -1 when the child died by a signal.
	return int32(res.ExitCode), nil
}

// delivery hands the host backend's output to the sink: in streaming mode
// each write at once, in pieces of at most ChunkSize; otherwise into a
// buffer per stream (BufferCap) that outcome emits after exit. Once the
// runner's context has ended (abort, timeout, a failed sink) nothing more
// reaches the sink.
type delivery struct {
	ctx       context.Context
	fail      context.CancelCauseFunc
	sink      Sink
	streaming bool
	bufs      [2]capBuffer // stdout, stderr; each written by one copier only

	mu  sync.Mutex
	err error
}

func (d *delivery) writer(stream sandboxv1.Stream) io.Writer {
	w := &streamWriter{d: d, stream: stream}
	if !d.streaming {
		w.buf = &d.bufs[0]
		if stream == sandboxv1.Stream_STDERR {
			w.buf = &d.bufs[1]
		}
		w.buf.max = BufferCap
	}
	return w
}

// failSink records the sink's first error and ends the command.
func (d *delivery) failSink(err error) {
	d.mu.Lock()
	if d.err == nil {
		d.err = err
	}
	d.mu.Unlock()
	d.fail(err)
}

func (d *delivery) sinkErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// streamWriter is one stream's end of a delivery. It never fails, so that
// the backend keeps draining the pipe until the command is killed.
type streamWriter struct {
	d      *delivery
	stream sandboxv1.Stream
	buf    *capBuffer // nil when streaming
}

func (w *streamWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.buf != nil {
		w.buf.write(p)
		return n, nil
	}
	for len(p) > 0 && w.d.ctx.Err() == nil {
		k := min(len(p), ChunkSize)
		if err := w.d.sink.Chunk(w.stream, p[:k]); err != nil {
			w.d.failSink(err)
			break
		}
		p = p[k:]
	}
	return n, nil
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
