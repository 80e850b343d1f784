package runner

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"google.golang.org/protobuf/proto"
)

type chunk struct {
	stream sandboxv1.Stream
	data   []byte
}

// recSink records every chunk; fail makes Chunk return an error.
type recSink struct {
	mu     sync.Mutex
	chunks []chunk
	got    chan struct{} // one send per chunk, never blocks
	fail   error
}

func newRecSink() *recSink { return &recSink{got: make(chan struct{}, 1<<16)} }

func (s *recSink) Chunk(stream sandboxv1.Stream, data []byte) error {
	s.mu.Lock()
	s.chunks = append(s.chunks, chunk{stream, bytes.Clone(data)})
	fail := s.fail
	s.mu.Unlock()
	select {
	case s.got <- struct{}{}:
	default:
	}
	return fail
}

func (s *recSink) joined(stream sandboxv1.Stream) (data []byte, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.chunks {
		if c.stream == stream {
			data = append(data, c.data...)
			n++
		}
	}
	return data, n
}

func needBash(t *testing.T) *Bash {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash on PATH")
	}
	r, err := New()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestStreamsLandOnTheirEnumAndExitCode(t *testing.T) {
	r := needBash(t)
	sink := newRecSink()
	code, err := r.Run(t.Context(), Spec{Command: "echo hi; echo oops >&2; exit 7", Streaming: true}, sink)
	if err != nil {
		t.Fatal(err)
	}
	if code != 7 {
		t.Errorf("exit code = %d, want 7", code)
	}
	if out, _ := sink.joined(sandboxv1.Stream_STDOUT); string(out) != "hi\n" {
		t.Errorf("stdout = %q", out)
	}
	if errOut, _ := sink.joined(sandboxv1.Stream_STDERR); string(errOut) != "oops\n" {
		t.Errorf("stderr = %q", errOut)
	}
}

func TestStdinIsWrittenThenClosed(t *testing.T) {
	r := needBash(t)
	dst := filepath.Join(t.TempDir(), "f")
	payload := []byte("binary \x00\xff payload\n")
	stdin := []byte(base64.StdEncoding.EncodeToString(payload))
	code, err := r.Run(t.Context(), Spec{Command: "base64 -d > '" + dst + "'", Stdin: stdin, TimeoutS: 20, Streaming: true}, newRecSink())
	if err != nil || code != 0 {
		t.Fatalf("code=%d err=%v", code, err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Errorf("file = %q, want %q", got, payload)
	}
}

func TestNoStdinStillSeesEOF(t *testing.T) {
	r := needBash(t)
	sink := newRecSink()
	// cat blocks forever unless stdin reaches EOF; the timeout turns a
	// regression into a failure instead of a hang.
	code, err := r.Run(t.Context(), Spec{Command: "cat; echo done", TimeoutS: 20, Streaming: true}, sink)
	if err != nil || code != 0 {
		t.Fatalf("code=%d err=%v", code, err)
	}
	if out, _ := sink.joined(sandboxv1.Stream_STDOUT); string(out) != "done\n" {
		t.Errorf("stdout = %q", out)
	}
}

func TestLargeOutputArrivesInCappedChunks(t *testing.T) {
	r := needBash(t)
	sink := newRecSink()
	code, err := r.Run(t.Context(), Spec{Command: "head -c 40960 /dev/zero", Streaming: true}, sink)
	if err != nil || code != 0 {
		t.Fatalf("code=%d err=%v", code, err)
	}
	out, n := sink.joined(sandboxv1.Stream_STDOUT)
	if len(out) != 40960 {
		t.Errorf("got %d bytes, want 40960", len(out))
	}
	if n < 2 {
		t.Errorf("got %d chunks, want at least 2", n)
	}
	for _, c := range sink.chunks {
		if len(c.data) > ChunkSize {
			t.Errorf("chunk of %d bytes exceeds %d", len(c.data), ChunkSize)
		}
	}
}

func TestTimeout(t *testing.T) {
	r := needBash(t)
	code, err := r.Run(t.Context(), Spec{Command: "sleep 30", TimeoutS: 1, Streaming: true}, newRecSink())
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if code != -1 {
		t.Errorf("code = %d, want -1", code)
	}
}

// TestAbortKillsGrandchild is the test that fails without Setpgid: the
// command's subshell keeps appending to a sentinel file, and only killing
// the whole process group stops it.
func TestAbortKillsGrandchild(t *testing.T) {
	r := needBash(t)
	sentinel := filepath.Join(t.TempDir(), "sentinel")
	ctx, cancel := context.WithCancel(t.Context())
	sink := newRecSink()
	cmd := fmt.Sprintf("( while true; do echo x >> '%s'; sleep 0.02; done ) & echo started; wait", sentinel)
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, Spec{Command: cmd, Streaming: true}, sink)
		done <- err
	}()
	<-sink.got // "started": the subshell exists
	waitFor(t, func() bool { return fileSize(sentinel) > 0 })
	cancel()
	if err := <-done; !errors.Is(err, ErrAborted) {
		t.Fatalf("err = %v, want ErrAborted", err)
	}
	// Once Run has returned the group is dead; give a survivor ample
	// chances to write, then check the file stopped growing.
	before := fileSize(sentinel)
	for range 10 {
		time.Sleep(30 * time.Millisecond)
		if after := fileSize(sentinel); after != before {
			t.Fatalf("sentinel grew from %d to %d after abort: grandchild survived", before, after)
		}
	}
}

func TestNonStreamingEmitsOneChunkPerStreamAtExit(t *testing.T) {
	r := needBash(t)
	sink := newRecSink()
	code, err := r.Run(t.Context(), Spec{Command: "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.01; done", Streaming: false}, sink)
	if err != nil || code != 0 {
		t.Fatalf("code=%d err=%v", code, err)
	}
	out, nOut := sink.joined(sandboxv1.Stream_STDOUT)
	errOut, nErr := sink.joined(sandboxv1.Stream_STDERR)
	if nOut != 1 || nErr != 1 {
		t.Errorf("chunks: stdout %d, stderr %d; want 1 each", nOut, nErr)
	}
	if string(out) != "out1\nout2\nout3\n" || string(errOut) != "err1\nerr2\nerr3\n" {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}
}

func TestNonStreamingTruncatesAtCap(t *testing.T) {
	if testing.Short() {
		t.Skip("short: pushes 9 MiB through a pipe")
	}
	r := needBash(t)
	sink := newRecSink()
	code, err := r.Run(t.Context(), Spec{Command: fmt.Sprintf("head -c %d /dev/zero", BufferCap+1<<20)}, sink)
	if err != nil || code != 0 {
		t.Fatalf("code=%d err=%v", code, err)
	}
	out, _ := sink.joined(sandboxv1.Stream_STDOUT)
	if len(out) != BufferCap {
		t.Errorf("kept %d bytes, want %d", len(out), BufferCap)
	}
}

func TestSinkErrorKillsAndIsReported(t *testing.T) {
	r := needBash(t)
	sink := newRecSink()
	sink.fail = errors.New("stream gone")
	_, err := r.Run(t.Context(), Spec{Command: "while true; do echo y; sleep 0.01; done", TimeoutS: 20, Streaming: true}, sink)
	if !errors.Is(err, ErrSink) || !strings.Contains(err.Error(), "stream gone") {
		t.Fatalf("err = %v, want ErrSink wrapping the sink error", err)
	}
}

func TestStartFailure(t *testing.T) {
	r, err := New(WithShell(filepath.Join(t.TempDir(), "no-such-shell")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(t.Context(), Spec{Command: "true"}, newRecSink()); !errors.Is(err, ErrStart) {
		t.Fatalf("err = %v, want ErrStart", err)
	}
}

func TestCancelledBeforeStartNeverSpawns(t *testing.T) {
	r := needBash(t)
	marker := filepath.Join(t.TempDir(), "ran")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := r.Run(ctx, Spec{Command: "touch '" + marker + "'"}, newRecSink()); !errors.Is(err, ErrAborted) {
		t.Fatalf("err = %v, want ErrAborted", err)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("command ran although its context was cancelled")
	}
}

func TestEnvIsReplaced(t *testing.T) {
	needBash(t)
	r, err := New(WithEnv([]string{"PATH=" + os.Getenv("PATH"), "ONLY=1"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SANDBOX_TOKEN", "secret")
	sink := newRecSink()
	if _, err := r.Run(t.Context(), Spec{Command: `echo "$ONLY:${SANDBOX_TOKEN:-unset}"`, Streaming: true}, sink); err != nil {
		t.Fatal(err)
	}
	if out, _ := sink.joined(sandboxv1.Stream_STDOUT); string(out) != "1:unset\n" {
		t.Errorf("stdout = %q", out)
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, time.Minute, func() error { // a failure's bound, not a timing check
		if !cond() {
			return errors.New("condition not met")
		}
		return nil
	})
}

// TestFullChunkFrameFitsIn32KiB pins the reason for ChunkSize: the
// largest Chunk frame, with the largest req_id, encodes into 32 KiB.
func TestFullChunkFrameFitsIn32KiB(t *testing.T) {
	f := &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Chunk{Chunk: &sandboxv1.Chunk{
		ReqId: ^uint64(0), Stream: sandboxv1.Stream_STDERR, Data: make([]byte, ChunkSize),
	}}}
	if n := proto.Size(f); n > 32<<10 {
		t.Errorf("full chunk frame is %d bytes, want at most %d", n, 32<<10)
	}
}

func TestUnreadStdinIsNotAnError(t *testing.T) {
	r := needBash(t)
	code, err := r.Run(t.Context(), Spec{Command: "exit 3", Stdin: bytes.Repeat([]byte("z"), 1<<20), TimeoutS: 20}, newRecSink())
	if err != nil || code != 3 {
		t.Fatalf("code=%d err=%v, want 3 and no error", code, err)
	}
}

// TestEscapedWriterDoesNotWedge: a background process keeps stdout open
// after bash exits; Run still returns once the wait delay has passed.
func TestEscapedWriterDoesNotWedge(t *testing.T) {
	needBash(t)
	r, err := New(WithWaitDelay(100 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	sink := newRecSink()
	code, err := r.Run(t.Context(), Spec{Command: "sleep 30 & echo $!", TimeoutS: 20, Streaming: true}, sink)
	out, _ := sink.joined(sandboxv1.Stream_STDOUT)
	if pid, perr := strconv.Atoi(strings.TrimSpace(string(out))); perr == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if err != nil || code != 0 {
		t.Fatalf("code=%d err=%v", code, err)
	}
	if len(out) == 0 {
		t.Error("output before exit was lost")
	}
}

// TestBackgroundDiesWithCommand: what the command leaves running in the
// background is killed once its main process exits, as the host backend
// promises (without it, the sleep would live on for 30 s).
func TestBackgroundDiesWithCommand(t *testing.T) {
	r := needBash(t)
	sink := newRecSink()
	code, err := r.Run(t.Context(), Spec{Command: "sleep 30 >/dev/null 2>&1 & echo $!", TimeoutS: 20, Streaming: true}, sink)
	if err != nil || code != 0 {
		t.Fatalf("code=%d err=%v", code, err)
	}
	out, _ := sink.joined(sandboxv1.Stream_STDOUT)
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("stdout = %q, want the background pid", out)
	}
	// Dead means gone or a zombie waiting for whoever inherited it.
	waitFor(t, func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		_, rest, _ := strings.Cut(string(stat), ") ")
		return strings.HasPrefix(rest, "Z")
	})
}
