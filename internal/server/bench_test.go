package server

import (
	"fmt"
	"os/exec"
	"testing"
	"time"
)

// BenchmarkSubmitTrue measures one whole execution of `true` through the
// server (WebSocket, store, host backend, result) against running
// `bash -c true` directly, in the same run.
func BenchmarkSubmitTrue(b *testing.B) {
	h := startServer(b, b.TempDir(), hostExecutor(b), WithMaxConcurrent(1))
	c := h.dial(tokenA)
	ref := measure(b, func() {
		if err := exec.Command("bash", "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
	})
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		id := fmt.Sprintf("bench-%d", i)
		c.submit(id, "true", nil)
		if res, _ := c.untilResult(id, nil); res.num("exit_code") != 0 {
			b.Fatalf("result %s", res.raw)
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(per)/float64(ref), "x-vs-bash")
}

// BenchmarkStreamThroughput streams 32 MiB of text output to a client, against
// the same command piped to a local reader.
func BenchmarkStreamThroughput(b *testing.B) {
	const size = 32 << 20
	cmd := fmt.Sprintf("yes 0123456789abcdef | head -c %d", size)
	h := startServer(b, b.TempDir(), hostExecutor(b), WithMaxOutputBytes(size), WithMaxConcurrent(1))
	c := h.dial(tokenA)
	ref := measure(b, func() {
		out, err := exec.Command("bash", "-c", cmd).Output()
		if err != nil || len(out) != size {
			b.Fatalf("reference: %d bytes, %v", len(out), err)
		}
	})
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		id := fmt.Sprintf("stream-%d", i)
		c.submit(id, cmd, nil)
		n := 0
		for {
			m := c.recv()
			if m.Type == TypeStream {
				n += len(m.str("data"))
			}
			if m.Type == TypeResult {
				break
			}
		}
		if n != size {
			b.Fatalf("streamed %d bytes, want %d", n, size)
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(per)/float64(ref), "x-vs-pipe")
}

// measure returns the mean duration of f over a few runs.
func measure(b *testing.B, f func()) time.Duration {
	b.Helper()
	const runs = 5
	start := time.Now()
	for range runs {
		f()
	}
	return time.Since(start) / runs
}
