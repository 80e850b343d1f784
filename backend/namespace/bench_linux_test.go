package namespace

import (
	"context"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
)

// The references run in the same benchmark as the backend, interleaved, so
// that the ratios compare like with like on a shared machine.
var (
	refBash  = []string{"bash", "-c", "true"}
	refBwrap = []string{"bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"}
)

func runRef(b *testing.B, argv []string) time.Duration {
	t0 := time.Now()
	if err := exec.Command(argv[0], argv[1:]...).Run(); err != nil {
		b.Fatalf("%v: %v", argv, err)
	}
	return time.Since(t0)
}

func haveBwrap(b *testing.B) bool {
	if _, err := exec.LookPath("bwrap"); err != nil {
		b.Log("bwrap not installed: no x-vs-bwrap ratio")
		return false
	}
	if err := exec.Command(refBwrap[0], refBwrap[1:]...).Run(); err != nil {
		b.Logf("bwrap cannot run here (%v): no x-vs-bwrap ratio", err)
		return false
	}
	return true
}

// BenchmarkExecTrue measures Exec of `true` (deny-all network, overlay,
// seccomp and all) against bare `bash -c true` and against
// `bwrap --unshare-all --ro-bind / / true`, back to back. Warm: after each
// Exec the backend starts the init the next one will use; that start is
// part of the measured time (the loop waits for it inside the timed
// region), so the ratio is what a caller running one command after
// another pays per command. The references are timed only once it is
// done, so that they do not share the CPU with it. Cold is the same
// without starting ahead: the whole cost on the caller's clock.
func BenchmarkExecTrue(b *testing.B) {
	b.Run("warm", func(b *testing.B) { benchExecTrue(b) })
	b.Run("cold", func(b *testing.B) { benchExecTrue(b, WithoutPrestart()) })
}

func benchExecTrue(b *testing.B, opts ...Option) {
	nb := newBackend(b, opts...)
	nb.waitWarm()
	ws := b.TempDir()
	bw := haveBwrap(b)
	var nsDur, bashDur, bwrapDur time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		res, err := nb.Exec(context.Background(), &backend.Request{Workspace: ws, Args: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%v %+v", err, res)
		}
		// The init this Exec started ahead is its cost too.
		nb.waitWarm()
		nsDur += time.Since(t0)
		bashDur += runRef(b, refBash)
		if bw {
			bwrapDur += runRef(b, refBwrap)
		}
	}
	b.ReportMetric(float64(nsDur.Nanoseconds())/float64(b.N), "ns-exec/op")
	b.ReportMetric(float64(nsDur)/float64(bashDur), "x-vs-bash")
	if bw {
		b.ReportMetric(float64(nsDur)/float64(bwrapDur), "x-vs-bwrap")
	}
}

// BenchmarkExecTrueParallel16 runs 16 Execs of `true` at once and compares
// the wall time of the batch with 16 bare `bash -c true` and 16 bwrap runs
// at once. Mount namespace setup takes global kernel locks; this measures
// how much that serialises. The inits a batch starts ahead for the next
// one are part of its measured time.
func BenchmarkExecTrueParallel16(b *testing.B) {
	const n = 16
	nb := newBackend(b)
	bw := haveBwrap(b)
	wss := make([]string, n)
	for i := range wss {
		wss[i] = b.TempDir()
	}
	batch := func(f func(i int)) time.Duration {
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); f(i) }()
		}
		wg.Wait()
		nb.waitWarm() // a no-op for the references
		return time.Since(t0)
	}
	one := func(i int) {
		res, err := nb.Exec(context.Background(), &backend.Request{Workspace: wss[i], Args: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			b.Errorf("%v %+v", err, res)
		}
	}
	// No untimed warm-up: the pool of inits started ahead grows to the
	// bursts it sees during the first timed batch, and every init a batch
	// uses was started, and timed, in the batch or serial run before it.
	var nsDur, serialDur, bashDur, bwrapDur time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		nsDur += batch(one)
		t0 := time.Now()
		for j := 0; j < n; j++ {
			one(j)
		}
		nb.waitWarm()
		serialDur += time.Since(t0)
		bashDur += batch(func(int) { runRef(b, refBash) })
		if bw {
			bwrapDur += batch(func(int) { runRef(b, refBwrap) })
		}
	}
	b.ReportMetric(float64(nsDur.Nanoseconds())/float64(b.N), "ns-batch16/op")
	// 16 at once against the same 16 one after another, read like every
	// x-vs metric (below 1 is faster): at best 1/cores, more where the
	// kernel serialises.
	b.ReportMetric(float64(nsDur)/float64(serialDur), "x-vs-serial")
	b.ReportMetric(float64(nsDur)/float64(bashDur), "x-vs-bash")
	if bw {
		b.ReportMetric(float64(nsDur)/float64(bwrapDur), "x-vs-bwrap")
	}
}
