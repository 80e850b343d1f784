package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// fileSink is the write end of a pipe whose read end is collected, as a
// CLI's stdout piped into another program is.
type fileSink struct {
	w    *os.File
	got  bytes.Buffer
	done chan struct{}
}

func newFileSink(t *testing.T) *fileSink {
	t.Helper()
	r, w := blockingPipe(t)
	s := &fileSink{w: w, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		io.Copy(&s.got, r)
		r.Close()
	}()
	t.Cleanup(func() { w.Close() })
	return s
}

// wait closes the write end and returns what the read end got.
func (s *fileSink) wait(t *testing.T) string {
	t.Helper()
	s.w.Close()
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		t.Fatal("the pipe's reader never saw its end")
	}
	return s.got.String()
}

// blockingPipe is a pipe in blocking mode, as a shell makes the one a
// CLI's stdout is (os.Pipe's are non-blocking, with deadlines). The caller
// closes both ends.
func blockingPipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	var p [2]int
	syscall.ForkLock.RLock()
	err := syscall.Pipe(p[:])
	if err == nil {
		syscall.CloseOnExec(p[0])
		syscall.CloseOnExec(p[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(p[0]), "pipe-r"), os.NewFile(uintptr(p[1]), "pipe-w")
}

func seqOutput(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintln(&b, i)
	}
	return b.String()
}

// outputBackends are the backends the output tests run on.
func outputBackends() map[string]func(*testing.T, string, ...Option) *Sandbox {
	return map[string]func(*testing.T, string, ...Option) *Sandbox{"host": newHost, "namespace": newIsolated}
}

// TestOutputToFileGetsEverything: output to a caller's file arrives whole
// and in order, stdout and stderr each in full, through pauses in which
// the command's pipe is empty: to a pipe (which the queue fills with
// splice) and to a file opened for appending (which takes no splice: the
// queue copies instead).
func TestOutputToFileGetsEverything(t *testing.T) {
	for name, open := range outputBackends() {
		t.Run(name, func(t *testing.T) {
			pol := policy.Default()
			pol.Limits.OutputBytes = 64 << 20
			sb := open(t, t.TempDir(), WithPolicy(pol))
			out, errs := newFileSink(t), newFileSink(t)
			appended := filepath.Join(t.TempDir(), "out")
			af, err := os.OpenFile(appended, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer af.Close()
			const script = "seq 1 1000; sleep 0.05; seq 1001 400000; seq 1 5000 >&2"
			res, err := sb.Execute(context.Background(), Command{Shell: script, Stdout: out.w, Stderr: errs.w})
			if err != nil || res.ExitCode != 0 || res.Truncated {
				t.Fatalf("res=%+v err=%v", res, err)
			}
			if got, want := out.wait(t), seqOutput(1, 400000); got != want {
				t.Errorf("stdout: %d bytes, want %d, equal prefix %d", len(got), len(want), commonPrefix(got, want))
			}
			if got, want := errs.wait(t), seqOutput(1, 5000); got != want {
				t.Errorf("stderr: %d bytes, want %d", len(got), len(want))
			}
			if res, err := sb.Execute(context.Background(), Command{Shell: script, Stdout: af}); err != nil || res.ExitCode != 0 {
				t.Fatalf("res=%+v err=%v", res, err)
			}
			if got, err := os.ReadFile(appended); err != nil || string(got) != seqOutput(1, 400000) {
				t.Errorf("appended file: %d bytes, %v", len(got), err)
			}
		})
	}
}

// TestOutputCapToFile: the output cap holds for a caller's file: exactly
// the first bytes up to the cap arrive, and the result says it was cut.
func TestOutputCapToFile(t *testing.T) {
	for name, open := range outputBackends() {
		t.Run(name, func(t *testing.T) {
			const limit = 100_003
			pol := policy.Default()
			pol.Limits.OutputBytes = limit
			sb := open(t, t.TempDir(), WithPolicy(pol))
			out := newFileSink(t)
			res, err := sb.Execute(context.Background(), Command{Shell: "seq 1 400000", Stdout: out.w})
			if err != nil || !res.Truncated {
				t.Fatalf("res=%+v err=%v", res, err)
			}
			if got, want := out.wait(t), seqOutput(1, 400000)[:limit]; got != want {
				t.Errorf("got %d bytes, want the first %d (equal prefix %d)", len(got), len(want), commonPrefix(got, want))
			}
		})
	}
}

// TestSecretsScrubbedIntoFile: with secrets configured, output to a
// caller's file is scrubbed like any other: never moved to it as it is.
func TestSecretsScrubbedIntoFile(t *testing.T) {
	for name, open := range outputBackends() {
		t.Run(name, func(t *testing.T) {
			const key = "sk-live-0123456789abcdefghij"
			sb := open(t, t.TempDir(), WithSecrets([]secrets.Secret{{Name: "KEY", Value: key}}))
			out := newFileSink(t)
			res, err := sb.Execute(context.Background(), Command{Shell: "seq 1 100000; printf 'sk-live-01234'; sleep 0.05; echo '56789abcdefghij'", Stdout: out.w})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("res=%+v err=%v", res, err)
			}
			got := out.wait(t)
			if strings.Contains(got, key) || !strings.HasSuffix(got, "[REDACTED:KEY]\n") {
				t.Fatalf("output not scrubbed: ends %q", got[max(0, len(got)-60):])
			}
		})
	}
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
