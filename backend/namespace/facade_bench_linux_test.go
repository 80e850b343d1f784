package namespace_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/sandbox"
)

// The library path: sandbox.Execute (policy, audit events, scrubbers,
// transaction) on the namespace backend, against bwrap doing the same
// isolation step in the same loop. Every init the backend starts ahead is
// waited for inside the timed region of the Execute that started it.

var facadeBwrap = []string{"bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"}

func facadeBackend(b *testing.B) *namespace.Backend {
	b.Helper()
	if err := exec.Command(facadeBwrap[0], facadeBwrap[1:]...).Run(); err != nil {
		b.Skipf("needs bwrap for the reference: %v", err)
	}
	// Probed as sandbox.New's selection probes a backend (unprobed, its
	// first Exec would, to use a pulse-runtime found beside the
	// binary): the probe's own run stays out of the timed loop. The init
	// it leaves started ahead is ended, so that the first timed Execute
	// starts its own.
	nb, err := namespace.New(namespace.WithStateDir(filepath.Join(b.TempDir(), "ns")))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nb.Close() })
	if err := nb.Probe(context.Background()); err != nil {
		b.Skipf("namespace backend unavailable: %v", err)
	}
	namespace.DropWarm(nb)
	return nb
}

func facadeSandbox(b *testing.B, nb *namespace.Backend) *sandbox.Sandbox {
	b.Helper()
	sb, err := sandbox.New(context.Background(), b.TempDir(), sandbox.WithBackend(nb))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sb.Close() })
	return sb
}

func facadeTrue(b *testing.B, sb *sandbox.Sandbox) {
	res, err := sb.Execute(context.Background(), sandbox.Command{Args: []string{"true"}})
	if err != nil || res.ExitCode != 0 {
		b.Errorf("Execute: %v %+v", err, res)
	}
}

func runBwrap(b *testing.B) {
	if err := exec.Command(facadeBwrap[0], facadeBwrap[1:]...).Run(); err != nil {
		b.Errorf("bwrap: %v", err)
	}
}

// BenchmarkSandboxExecuteTrue runs Execute of `true` back to back, each
// followed by one bwrap of `true`; x-vs-bwrap is the ratio of their sums.
// cpu-x-vs-bwrap is the ratio of the CPU each side cost, this process's
// own and its reaped children's (getrusage): on pulse's side the
// facade's and backend's goroutines, the init started ahead for the next
// Execute and the command; on bwrap's, bwrap, its sandbox and the start
// of its process.
func BenchmarkSandboxExecuteTrue(b *testing.B) {
	nb := facadeBackend(b)
	sb := facadeSandbox(b, nb)
	var mine, ref, mineCPU, refCPU time.Duration
	for b.Loop() {
		c0 := cpuUsed()
		t0 := time.Now()
		facadeTrue(b, sb)
		namespace.WaitWarm(nb)
		t1 := time.Now()
		c1 := cpuUsed()
		runBwrap(b)
		mine += t1.Sub(t0)
		ref += time.Since(t1)
		c2 := cpuUsed()
		mineCPU += c1 - c0
		refCPU += c2 - c1
	}
	if ref > 0 {
		b.ReportMetric(float64(mine)/float64(ref), "x-vs-bwrap")
		b.ReportMetric(float64(mine.Nanoseconds())/float64(b.N), "execute-ns/op")
	}
	if refCPU > 0 {
		b.ReportMetric(float64(mineCPU)/float64(refCPU), "cpu-x-vs-bwrap")
		b.ReportMetric(float64(mineCPU.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// cpuUsed is the user and system CPU of this process and of its children
// that have been waited for.
func cpuUsed() time.Duration {
	var d time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			d += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return d
}

// BenchmarkSandboxExecuteTrueParallel16 runs 16 Executes of `true` at once,
// each in a sandbox of its own workspace on one backend, against 16 bwraps
// at once; x-vs-bwrap is the ratio of the batches' wall times. There is no
// untimed warm-up: the pool of inits started ahead grows during the first
// batch, timed.
func BenchmarkSandboxExecuteTrueParallel16(b *testing.B) {
	const n = 16
	nb := facadeBackend(b)
	sbs := make([]*sandbox.Sandbox, n)
	for i := range sbs {
		sbs[i] = facadeSandbox(b, nb)
	}
	batch := func(f func(i int)) time.Duration {
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); f(i) }()
		}
		wg.Wait()
		namespace.WaitWarm(nb)
		return time.Since(t0)
	}
	var mine, ref time.Duration
	for b.Loop() {
		mine += batch(func(i int) { facadeTrue(b, sbs[i]) })
		ref += batch(func(int) { runBwrap(b) })
	}
	if ref > 0 {
		b.ReportMetric(float64(mine)/float64(ref), "x-vs-bwrap")
		b.ReportMetric(float64(mine.Nanoseconds())/float64(b.N), "batch16-ns/op")
	}
}
