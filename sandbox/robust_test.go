package sandbox

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// blockingWriter never returns from Write until released.
type blockingWriter struct{ release chan struct{} }

func (b *blockingWriter) Write(p []byte) (int, error) {
	<-b.release
	return len(p), nil
}

// TestBlockedOutputWriterDoesNotHangExecuteOrClose: a caller's writer that
// never returns, or a caller's file never read (a pipe whose reader
// stopped, which the queue fills with splice), holds up neither Execute
// nor Close once the command's context has ended.
func TestBlockedOutputWriterDoesNotHangExecuteOrClose(t *testing.T) {
	pr, pw := blockingPipe(t)
	defer pr.Close()
	defer pw.Close()
	blocked := &blockingWriter{release: make(chan struct{})}
	defer close(blocked.release)
	for name, w := range map[string]io.Writer{"writer": blocked, "file": pw} {
		t.Run(name, func(t *testing.T) {
			sb := newHost(t, t.TempDir())
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := sb.Execute(ctx, Command{Shell: "yes", Stdout: w})
				done <- err
			}()
			// A watchdog, not a timing assertion: without the fix Execute
			// never returns at all.
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("Execute with an abandoned writer reported no error")
				}
			case <-time.After(60 * time.Second):
				t.Fatal("Execute hangs on a blocked output writer after its context ended")
			}
			closed := make(chan error, 1)
			go func() { closed <- sb.Close() }()
			select {
			case <-closed:
			case <-time.After(60 * time.Second):
				t.Fatal("Close hangs after a blocked output writer")
			}
		})
	}
}

func TestSlowOutputWriterGetsEverything(t *testing.T) {
	sb := newHost(t, t.TempDir())
	var mu sync.Mutex
	var got strings.Builder
	slow := writerFunc(func(p []byte) (int, error) {
		time.Sleep(time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return got.Write(p)
	})
	res, err := sb.Execute(context.Background(), Command{Shell: "seq 1 20000", Stdout: slow})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("res=%+v err=%v", res, err)
	}
	lines := strings.Split(strings.TrimSpace(got.String()), "\n")
	if len(lines) != 20000 || lines[19999] != "20000" {
		t.Fatalf("slow writer got %d lines, last %q", len(lines), lines[len(lines)-1])
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// There is no wall of pending transactions: a session of many commands
// keeps staging, one transaction per command that wrote, each command's
// writes kept (the stack is squashed past WithMaxStack instead).
func TestNoWallOfPendingTransactions(t *testing.T) {
	be := &ovBackend{ov: &backend.Overlay{Files: []backend.File{{Path: "f.txt", Mode: 0o644, Data: []byte("x")}}}}
	counting := &countingBackend{ovBackend: be}
	sb, err := New(context.Background(), t.TempDir(), WithBackend(counting))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	for i := range 40 {
		res, err := sb.Execute(context.Background(), Command{Args: []string{"x"}})
		if err != nil {
			t.Fatalf("command %d refused: %v", i, err)
		}
		if res.Transaction == "" {
			t.Fatalf("command %d ran but its writes were not staged: %+v", i, res)
		}
	}
	txs, _ := sb.Transactions(t.Context())
	if counting.execs != 40 || len(txs) != 40 {
		t.Fatalf("%d commands ran but %d transactions hold their writes", counting.execs, len(txs))
	}
}

type countingBackend struct {
	*ovBackend
	execs int
}

func (c *countingBackend) Exec(ctx context.Context, r *backend.Request) (*backend.Result, error) {
	c.execs++
	return c.ovBackend.Exec(ctx, r)
}
