package server

import (
	"bytes"
	"context"
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

// BenchmarkStreamThroughput streams 32 MiB of output to a client, against
// the same command piped to a local reader: as text with the output
// repeated in the result (what a client of the Python server asks for),
// and as base64 with result_output "omit" (what the Go client asks for).
func BenchmarkStreamThroughput(b *testing.B) {
	const size = 32 << 20
	cmd := fmt.Sprintf("yes 0123456789abcdef | head -c %d", size)
	for _, bc := range []struct {
		name  string
		extra map[string]any
	}{
		{"text-full", nil},
		{"base64-omit", map[string]any{"encoding": "base64", "result_output": "omit"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
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
				c.submit(id, cmd, bc.extra)
				// Frames are only counted, not decoded: this measures the
				// server, and a client decodes at its own speed.
				n := 0
				for {
					_, data, err := c.ws.Read(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					if bytes.HasPrefix(data, []byte(`{"type":"result"`)) {
						break
					}
					n += len(data)
				}
				if n < size {
					b.Fatalf("streamed %d bytes, want at least %d", n, size)
				}
			}
			per := time.Since(start) / time.Duration(b.N)
			b.ReportMetric(float64(per)/float64(ref), "x-vs-pipe")
		})
	}
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
