package worker_test

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
)

const streamBytes = 256 << 20

// BenchmarkStream256M pushes head -c 256M /dev/zero through the worker and
// gRPC to the test relay, and in the same run the same command piped
// straight into this process; it reports the ratio of the two times.
func BenchmarkStream256M(b *testing.B) {
	f := setup(b, nil)
	command := fmt.Sprintf("head -c %d /dev/zero", streamBytes)
	var viaWorker, local time.Duration
	b.SetBytes(streamBytes)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		t0 := time.Now()
		n := localPipe(b, command)
		local += time.Since(t0)
		if n != streamBytes {
			b.Fatalf("local pipe read %d bytes", n)
		}
		b.StartTimer()

		t1 := time.Now()
		call, err := f.conn.Exec(&sandboxv1.Exec{ReqId: uint64(1000 + i), Command: command, Streaming: true})
		if err != nil {
			b.Fatal(err)
		}
		got := drainCall(b, call.Next)
		viaWorker += time.Since(t1)
		if got != streamBytes {
			b.Fatalf("worker streamed %d bytes", got)
		}
	}
	b.ReportMetric(float64(viaWorker)/float64(local), "x-vs-local-pipe")
}

// BenchmarkRoundTripTrue measures one exec of "true" through the relay
// and worker against bash -c true run directly.
func BenchmarkRoundTripTrue(b *testing.B) {
	f := setup(b, nil)
	var viaWorker, local time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		t0 := time.Now()
		if err := exec.Command("bash", "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
		local += time.Since(t0)
		b.StartTimer()

		t1 := time.Now()
		res := f.run(b, &sandboxv1.Exec{ReqId: uint64(1000 + i), Command: "true"})
		viaWorker += time.Since(t1)
		wantEnd(b, res, 0)
	}
	b.ReportMetric(float64(viaWorker)/float64(local), "x-vs-bash-c")
}

func localPipe(b *testing.B, command string) int64 {
	cmd := exec.Command("bash", "-c", command)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 32<<10)
	n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{out}, buf)
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatal(err)
	}
	return n
}

func drainCall(b *testing.B, next func(context.Context) (*sandboxv1.WorkerFrame, error)) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n int64
	for {
		fr, err := next(ctx)
		if err != nil {
			b.Fatal(err)
		}
		switch {
		case fr.GetChunk() != nil:
			n += int64(len(fr.GetChunk().GetData()))
		case fr.GetEnd() != nil:
			if fr.GetEnd().GetExitCode() != 0 {
				b.Fatalf("exit %d", fr.GetEnd().GetExitCode())
			}
			return n
		default:
			b.Fatalf("unexpected frame %v", fr)
		}
	}
}
