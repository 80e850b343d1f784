package remote

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/server"
)

// benchPair is a remote backend talking to an in-process pulse-server on
// 127.0.0.1 whose local executor is a host backend, and a second host
// backend used directly as the reference.
func benchPair(b *testing.B, extra ...server.Option) (*Backend, *host.Backend) {
	b.Helper()
	ts := startServer(b, extra...)
	rb := newBackend(b, ts.url)
	hb, err := host.New()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hb.Close() })
	return rb, hb
}

// BenchmarkExecTrue runs `true` through the remote path (connect, submit,
// result, over loopback, executed by the host backend inside the server)
// and through the host backend directly, alternating the two in one loop
// so both see the same load, and reports the ratio.
func BenchmarkExecTrue(b *testing.B) {
	rb, hb := benchPair(b)
	ws := b.TempDir()
	ctx := context.Background()
	var remote, direct time.Duration
	for b.Loop() {
		t0 := time.Now()
		res, err := rb.Exec(ctx, &backend.Request{Workspace: ws, Shell: "true", Network: allowAll, Secrets: denySecrets})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("remote Exec: %v %+v", err, res)
		}
		t1 := time.Now()
		res, err = hb.Exec(ctx, &backend.Request{Workspace: ws, Shell: "true", Network: allowAll, Secrets: denySecrets})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("host Exec: %v %+v", err, res)
		}
		remote += t1.Sub(t0)
		direct += time.Since(t1)
	}
	if direct > 0 {
		b.ReportMetric(float64(remote)/float64(direct), "x-vs-host")
		b.ReportMetric(float64(remote.Nanoseconds())/float64(b.N), "remote-ns/exec")
		b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N), "host-ns/exec")
	}
}

// counter counts what it is given and keeps nothing.
type counter struct{ n atomic.Int64 }

func (c *counter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// BenchmarkThroughput64MiB streams 64 MiB of stdout through the remote
// path (base64 frames over loopback, the server's history and store) and
// through the host backend directly, and reports the ratio of times.
func BenchmarkThroughput64MiB(b *testing.B) {
	const size = 64 << 20
	rb, hb := benchPair(b, server.WithMaxOutputBytes(2*size))
	ws := b.TempDir()
	ctx := context.Background()
	req := func(w *counter) *backend.Request {
		return &backend.Request{Workspace: ws, Shell: "head -c 67108864 /dev/zero", Network: allowAll, Secrets: denySecrets,
			Stdout: w, Limits: policyLimits(2 * size)}
	}
	var remote, direct time.Duration
	b.SetBytes(size)
	for b.Loop() {
		var rw, hw counter
		t0 := time.Now()
		res, err := rb.Exec(ctx, req(&rw))
		if err != nil || res.ExitCode != 0 || rw.n.Load() != size {
			b.Fatalf("remote Exec: %v %+v, %d bytes", err, res, rw.n.Load())
		}
		t1 := time.Now()
		res, err = hb.Exec(ctx, req(&hw))
		if err != nil || res.ExitCode != 0 || hw.n.Load() != size {
			b.Fatalf("host Exec: %v %+v, %d bytes", err, res, hw.n.Load())
		}
		remote += t1.Sub(t0)
		direct += time.Since(t1)
	}
	if direct > 0 {
		b.ReportMetric(float64(remote)/float64(direct), "x-vs-host")
		b.ReportMetric(float64(size*b.N)/remote.Seconds()/(1<<20), "remote-MiB/s")
		b.ReportMetric(float64(size*b.N)/direct.Seconds()/(1<<20), "host-MiB/s")
	}
}
