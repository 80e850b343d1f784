package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/internal/worker/runner"
	"google.golang.org/protobuf/proto"
)

// The unit tier runs no processes and no gRPC: a fake Stream made of
// channels and a fake Runner whose behaviour each test scripts. Processes
// are covered by the runner package, gRPC by the worker contract tests.

type fakeStream struct {
	in  chan *sandboxv1.ServerFrame
	out chan *sandboxv1.WorkerFrame
}

func newFakeStream() *fakeStream {
	return &fakeStream{in: make(chan *sandboxv1.ServerFrame, 1024), out: make(chan *sandboxv1.WorkerFrame, 1<<14)}
}

func (f *fakeStream) Send(w *sandboxv1.WorkerFrame) error {
	// Clone: Stream.Send may not keep the frame, and chunk data is reused.
	f.out <- proto.Clone(w).(*sandboxv1.WorkerFrame)
	return nil
}

func (f *fakeStream) Recv() (*sandboxv1.ServerFrame, error) {
	fr, ok := <-f.in
	if !ok {
		return nil, io.EOF
	}
	return fr, nil
}

// fakeRunner records every spec it runs and delegates to fn.
type fakeRunner struct {
	mu      sync.Mutex
	calls   []runner.Spec
	started chan uint64
	fn      func(ctx context.Context, s runner.Spec, sink runner.Sink) (int32, error)
}

func newFakeRunner(fn func(ctx context.Context, s runner.Spec, sink runner.Sink) (int32, error)) *fakeRunner {
	return &fakeRunner{started: make(chan uint64, 1024), fn: fn}
}

func (r *fakeRunner) Run(ctx context.Context, s runner.Spec, sink runner.Sink) (int32, error) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
	r.started <- s.ReqID
	return r.fn(ctx, s, sink)
}

func (r *fakeRunner) count(id uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if c.ReqID == id {
			n++
		}
	}
	return n
}

// echoRunner writes the command to stdout and exits 0, or blocks until
// ctx is done when the command is "block".
func echoRunner(gate <-chan struct{}) func(context.Context, runner.Spec, runner.Sink) (int32, error) {
	return func(ctx context.Context, s runner.Spec, sink runner.Sink) (int32, error) {
		if s.Command == "block" {
			select {
			case <-ctx.Done():
				return -1, runner.ErrAborted
			case <-gate:
			}
		}
		if err := sink.Chunk(sandboxv1.Stream_STDOUT, []byte(s.Command)); err != nil {
			return -1, fmt.Errorf("%w: %w", runner.ErrSink, err)
		}
		return 0, nil
	}
}

type harness struct {
	t    *testing.T
	s    *Session
	r    *fakeRunner
	st   *fakeStream
	done chan error
}

func start(t *testing.T, cfg Config, r *fakeRunner) *harness {
	t.Helper()
	s, err := New(cfg, r)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, s: s, r: r}
	h.attach()
	return h
}

// attach starts a new connection on the same Session.
func (h *harness) attach() {
	h.st = newFakeStream()
	h.done = make(chan error, 1)
	st := h.st
	go func() { h.done <- h.s.Serve(context.Background(), st) }()
	if f := h.next(); f.GetHello() == nil {
		h.t.Fatalf("first frame %v is not Hello", f)
	}
}

// disconnect ends the connection and waits for Serve to return.
func (h *harness) disconnect() {
	close(h.st.in)
	select {
	case err := <-h.done:
		if !errors.Is(err, io.EOF) {
			h.t.Errorf("Serve returned %v, want io.EOF", err)
		}
	case <-time.After(10 * time.Second):
		h.t.Fatal("Serve did not return after disconnect")
	}
}

func (h *harness) exec(id uint64, command string) {
	h.st.in <- &sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Exec{Exec: &sandboxv1.Exec{ReqId: id, Command: command, Streaming: true}}}
}

func (h *harness) abort(id uint64) {
	h.st.in <- &sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Abort{Abort: &sandboxv1.Abort{ReqId: id}}}
}

// next returns the next frame that is not a heartbeat.
func (h *harness) next() *sandboxv1.WorkerFrame {
	h.t.Helper()
	for {
		select {
		case f := <-h.st.out:
			if f.GetHeartbeat() != nil {
				continue
			}
			return f
		case <-time.After(10 * time.Second):
			h.t.Fatal("no frame within 10s")
			return nil
		}
	}
}

// terminal reads frames until the terminal frame of some exec.
func (h *harness) terminal() *sandboxv1.WorkerFrame {
	h.t.Helper()
	for {
		f := h.next()
		if f.GetEnd() != nil || f.GetExecError() != nil {
			return f
		}
	}
}

func reqID(f *sandboxv1.WorkerFrame) uint64 {
	switch {
	case f.GetEnd() != nil:
		return f.GetEnd().GetReqId()
	case f.GetExecError() != nil:
		return f.GetExecError().GetReqId()
	case f.GetChunk() != nil:
		return f.GetChunk().GetReqId()
	}
	return 0
}

func (h *harness) waitStarted(id uint64) {
	h.t.Helper()
	select {
	case got := <-h.r.started:
		if got != id {
			h.t.Fatalf("runner started %d, want %d", got, id)
		}
	case <-time.After(10 * time.Second):
		h.t.Fatalf("exec %d did not start", id)
	}
}

func TestHelloContents(t *testing.T) {
	cfg := Config{SandboxID: "sbx-1", Capacity: 3, Capabilities: []string{"bash", "git"}, Arch: "riscv64", Image: "img:1", Trust: "untrusted", Labels: map[string]string{"zone": "a"}}
	s, err := New(cfg, newFakeRunner(echoRunner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	st := newFakeStream()
	done := make(chan error, 1)
	go func() { done <- s.Serve(t.Context(), st) }()
	want := &sandboxv1.Hello{SandboxId: "sbx-1", CapacityMax: 3, Capabilities: []string{"bash", "git"}, Arch: "riscv64", Image: "img:1", Trust: "untrusted", Labels: map[string]string{"zone": "a"}}
	if got := (<-st.out).GetHello(); !proto.Equal(got, want) {
		t.Errorf("hello = %v, want %v", got, want)
	}
	close(st.in)
	<-done

	d, _ := New(Config{}, newFakeRunner(echoRunner(nil)))
	if h := d.Hello(); h.GetCapacityMax() != DefaultCapacity || h.GetArch() == "" {
		t.Errorf("default hello = %v: want capacity %d and the runtime arch", h, DefaultCapacity)
	}
}

func TestExecStreamsThenEnds(t *testing.T) {
	h := start(t, Config{}, newFakeRunner(echoRunner(nil)))
	h.exec(1, "hello")
	c := h.next().GetChunk()
	if c.GetReqId() != 1 || string(c.GetData()) != "hello" || c.GetStream() != sandboxv1.Stream_STDOUT {
		t.Errorf("chunk = %v", c)
	}
	if e := h.next().GetEnd(); e.GetReqId() != 1 || e.GetExitCode() != 0 {
		t.Errorf("end = %v", e)
	}
	h.disconnect()
}

func TestTerminalFrameMapping(t *testing.T) {
	cases := []struct {
		name string
		code int32
		err  error
		want *sandboxv1.WorkerFrame
	}{
		{"exit 7", 7, nil, &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_End{End: &sandboxv1.End{ReqId: 5, ExitCode: 7}}}},
		{"killed by a signal", -1, nil, &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_End{End: &sandboxv1.End{ReqId: 5, ExitCode: -1}}}},
		{"timeout", -1, runner.ErrTimeout, execError(5, "timeout:9")},
		{"spawn failure", -1, fmt.Errorf("%w: no bash", runner.ErrStart), execError(5, "runner: cannot start command: no bash")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, Config{}, newFakeRunner(func(context.Context, runner.Spec, runner.Sink) (int32, error) { return tc.code, tc.err }))
			h.st.in <- &sandboxv1.ServerFrame{Frame: &sandboxv1.ServerFrame_Exec{Exec: &sandboxv1.Exec{ReqId: 5, Command: "x", TimeoutS: 9}}}
			if got := h.terminal(); !proto.Equal(got, tc.want) {
				t.Errorf("terminal = %v, want %v", got, tc.want)
			}
			h.disconnect()
		})
	}
}

func TestRedeliveryReemitsWithoutRunning(t *testing.T) {
	h := start(t, Config{}, newFakeRunner(echoRunner(nil)))
	h.exec(4, "echo x")
	first := h.terminal()
	h.exec(4, "echo x")
	again := h.next() // no chunk: straight to the cached terminal
	if !proto.Equal(first, again) {
		t.Errorf("re-emitted %v, want %v", again, first)
	}
	if n := h.r.count(4); n != 1 {
		t.Errorf("runner ran req 4 %d times, want 1", n)
	}
	h.disconnect()
}

func TestFingerprintMismatchAfterCompletionRunsFresh(t *testing.T) {
	h := start(t, Config{}, newFakeRunner(echoRunner(nil)))
	h.exec(4, "first")
	h.terminal()
	h.exec(4, "second")
	if c := h.next().GetChunk(); string(c.GetData()) != "second" {
		t.Errorf("chunk = %v, want the new command's output", c)
	}
	h.terminal()
	if n := h.r.count(4); n != 2 {
		t.Errorf("runner ran req 4 %d times, want 2", n)
	}
	// The cache now holds the second command: it is what a redelivery gets.
	h.exec(4, "second")
	if f := h.next(); f.GetEnd() == nil {
		t.Errorf("redelivery of the new command got %v, want the cached End", f)
	}
	h.disconnect()
}

func TestFingerprintMismatchWhileRunningIsRefused(t *testing.T) {
	gate := make(chan struct{})
	h := start(t, Config{}, newFakeRunner(echoRunner(gate)))
	h.exec(4, "block")
	h.waitStarted(4)
	h.exec(4, "other")
	if e := h.next().GetExecError(); e.GetReqId() != 4 || e.GetMessage() != MsgDuplicate {
		t.Errorf("got %v, want ExecError %q", e, MsgDuplicate)
	}
	close(gate)
	if f := h.terminal(); f.GetEnd().GetReqId() != 4 {
		t.Errorf("original ended with %v", f)
	}
	if n := h.r.count(4); n != 1 {
		t.Errorf("runner ran req 4 %d times, want 1", n)
	}
	h.disconnect()
}

func TestDuplicateWhileRunningIsAnsweredOnce(t *testing.T) {
	gate := make(chan struct{})
	h := start(t, Config{Capacity: 1, QueueSize: 1}, newFakeRunner(echoRunner(gate)))
	h.exec(4, "block")
	h.waitStarted(4)
	h.exec(4, "block") // byte-identical redelivery while running
	h.exec(5, "after")
	// Frames are handled in order: the busy answer to 6 proves the
	// redelivery was handled while 4 was still running.
	h.exec(6, "overflow")
	if e := h.next().GetExecError(); e.GetReqId() != 6 || e.GetMessage() != MsgBusy {
		t.Fatalf("got %v, want busy for req 6", e)
	}
	close(gate)
	var terminals []uint64
	for len(terminals) == 0 || terminals[len(terminals)-1] != 5 {
		terminals = append(terminals, reqID(h.terminal()))
	}
	if len(terminals) != 2 || terminals[0] != 4 {
		t.Errorf("terminal frames for %v, want [4 5]", terminals)
	}
	h.disconnect()
	if n := h.r.count(4); n != 1 {
		t.Errorf("runner ran req 4 %d times, want 1", n)
	}
}

func TestQueueOverflowAnswersBusyAtOnce(t *testing.T) {
	gate := make(chan struct{})
	h := start(t, Config{Capacity: 1, QueueSize: 1}, newFakeRunner(echoRunner(gate)))
	h.exec(1, "block")
	h.waitStarted(1)
	h.exec(2, "queued")
	h.exec(3, "overflow")
	if e := h.next().GetExecError(); e.GetReqId() != 3 || e.GetMessage() != MsgBusy {
		t.Errorf("got %v, want ExecError %q for req 3", e, MsgBusy)
	}
	close(gate)
	got := map[uint64]bool{}
	for len(got) < 2 {
		got[reqID(h.terminal())] = true
	}
	if !got[1] || !got[2] {
		t.Errorf("terminals for %v, want 1 and 2", got)
	}
	h.disconnect()
	if n := h.r.count(3); n != 0 {
		t.Errorf("overflowed exec ran %d times", n)
	}
}

func TestAbortOfQueuedExecNeverStartsIt(t *testing.T) {
	gate := make(chan struct{})
	h := start(t, Config{Capacity: 1, QueueSize: 1}, newFakeRunner(echoRunner(gate)))
	h.exec(1, "block")
	h.waitStarted(1)
	h.exec(2, "queued")
	h.abort(2)
	// The busy answer to 3 proves the abort was handled before 1 ends.
	h.exec(3, "overflow")
	if e := h.next().GetExecError(); e.GetReqId() != 3 || e.GetMessage() != MsgBusy {
		t.Fatalf("got %v, want busy for req 3", e)
	}
	close(gate)
	ends := map[uint64]int32{}
	for len(ends) < 2 {
		f := h.terminal()
		ends[reqID(f)] = f.GetEnd().GetExitCode()
	}
	if ends[2] != -1 {
		t.Errorf("aborted queued exec ended with %d, want -1", ends[2])
	}
	h.disconnect()
	if n := h.r.count(2); n != 0 {
		t.Errorf("aborted queued exec was started %d times", n)
	}
}

func TestAbortOfRunningExecEndsMinusOne(t *testing.T) {
	h := start(t, Config{}, newFakeRunner(echoRunner(make(chan struct{}))))
	h.exec(1, "block")
	h.waitStarted(1)
	h.abort(1)
	if e := h.terminal().GetEnd(); e.GetReqId() != 1 || e.GetExitCode() != -1 {
		t.Errorf("got %v, want End{1, -1}", e)
	}
	h.disconnect()
}

func TestAbortOfUnknownIsNoop(t *testing.T) {
	h := start(t, Config{}, newFakeRunner(echoRunner(nil)))
	h.abort(99)
	h.exec(1, "x")
	h.next() // chunk
	if f := h.next(); f.GetEnd().GetReqId() != 1 {
		t.Errorf("got %v, want End for req 1 and nothing for 99", f)
	}
	h.disconnect()
}

func TestDisconnectKillsInflightAndLeavesNoCacheEntry(t *testing.T) {
	var cancelled sync.WaitGroup
	cancelled.Add(1)
	first := true
	r := newFakeRunner(func(ctx context.Context, s runner.Spec, sink runner.Sink) (int32, error) {
		if first {
			first = false
			<-ctx.Done()
			cancelled.Done()
			return -1, runner.ErrAborted
		}
		return 0, nil
	})
	h := start(t, Config{}, r)
	h.exec(7, "slow")
	h.waitStarted(7)
	h.disconnect() // returns only after the exec's goroutine is done
	cancelled.Wait()
	select {
	case f := <-h.st.out:
		t.Errorf("frame %v sent after disconnect", f)
	default:
	}
	h.attach()
	h.exec(7, "slow")
	if f := h.terminal(); f.GetEnd().GetExitCode() != 0 {
		t.Errorf("redelivery after a killed exec got %v, want a fresh run", f)
	}
	if n := r.count(7); n != 2 {
		t.Errorf("req 7 ran %d times, want 2", n)
	}
	h.disconnect()
}

func TestCacheSurvivesReconnect(t *testing.T) {
	h := start(t, Config{}, newFakeRunner(echoRunner(nil)))
	h.exec(4, "echo x")
	want := h.terminal()
	h.disconnect()
	h.attach()
	h.exec(4, "echo x")
	if got := h.next(); !proto.Equal(got, want) {
		t.Errorf("after reconnect got %v, want cached %v", got, want)
	}
	if n := h.r.count(4); n != 1 {
		t.Errorf("req 4 ran %d times, want 1", n)
	}
	h.disconnect()
}

func TestCacheEvictsAt256(t *testing.T) {
	h := start(t, Config{Capacity: 1}, newFakeRunner(echoRunner(nil)))
	for id := range uint64(DefaultCacheSize + 1) {
		h.exec(id, "x")
		h.terminal()
	}
	h.exec(DefaultCacheSize, "x") // newest: cached
	if f := h.next(); f.GetEnd() == nil {
		t.Errorf("newest exec not answered from cache: %v", f)
	}
	h.exec(0, "x") // oldest: evicted, runs again
	h.terminal()
	h.disconnect()
	if n := h.r.count(0); n != 2 {
		t.Errorf("req 0 ran %d times, want 2 (evicted)", n)
	}
	if n := h.r.count(DefaultCacheSize); n != 1 {
		t.Errorf("req %d ran %d times, want 1 (cached)", DefaultCacheSize, n)
	}
}

func TestLRUOrder(t *testing.T) {
	c := newLRU(2)
	end := &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_End{End: &sandboxv1.End{}}}
	c.put(1, fingerprint{1}, end)
	c.put(2, fingerprint{2}, end)
	c.get(1) // 1 becomes most recent; 2 is next to go
	c.put(3, fingerprint{3}, end)
	if _, ok := c.get(2); ok {
		t.Error("2 should have been evicted")
	}
	if e, ok := c.get(1); !ok || e.fp != (fingerprint{1}) {
		t.Error("1 should have been kept")
	}
	if c.len() != 2 {
		t.Errorf("len = %d, want 2", c.len())
	}
}

func TestFingerprintSeparatesCommandFromStdin(t *testing.T) {
	if fingerprintOf("ab", []byte("c"), nil) == fingerprintOf("a", []byte("bc"), nil) {
		t.Error("command/stdin boundary is not part of the fingerprint")
	}
	// Two separately built inputs, so the comparison is not of one value
	// with itself.
	cmd, in := string([]byte{'a'}), []byte{'b'}
	if fingerprintOf("a", []byte("b"), nil) != fingerprintOf(cmd, in, nil) {
		t.Error("fingerprint is not deterministic")
	}
}

func TestHeartbeats(t *testing.T) {
	s, err := New(Config{Heartbeat: 5 * time.Millisecond}, newFakeRunner(echoRunner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	st := newFakeStream()
	done := make(chan error, 1)
	go func() { done <- s.Serve(t.Context(), st) }()
	<-st.out // hello
	select {
	case f := <-st.out:
		if f.GetHeartbeat() == nil {
			t.Errorf("got %v, want a heartbeat", f)
		}
	case <-time.After(10 * time.Second):
		t.Error("no heartbeat")
	}
	close(st.in)
	<-done
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(Config{}, nil); !errors.Is(err, ErrNilRunner) {
		t.Errorf("nil runner: err = %v", err)
	}
	if _, err := New(Config{Capacity: -1}, newFakeRunner(echoRunner(nil))); err == nil {
		t.Error("negative capacity accepted")
	}
}
