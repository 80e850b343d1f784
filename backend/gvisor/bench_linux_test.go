//go:build linux

package gvisor

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/namespace"
)

// BenchmarkExecTrue measures Exec of `true` on gvisor against the
// namespace backend and against bare `runsc do true` (runsc's own
// cheapest sandbox, no workspace view, no capture), interleaved in the
// same run so that the ratios compare like with like on a shared
// machine. The namespace backend starts its next init ahead while the
// others run: its figure is what a caller running one command after
// another pays per command. gvisor runs each command in its warm sandbox
// (started by the untimed first command); bare runsc do is about what a
// cold command costs. It reports the medians of each and their ratios.
func BenchmarkExecTrue(b *testing.B) {
	gb := newBackend(b)
	nb, err := namespace.New(namespace.WithStateDir(filepath.Join(b.TempDir(), "ns")))
	if err != nil {
		b.Fatal(err)
	}
	defer nb.Close()
	ctx := context.Background()
	if err := nb.Probe(ctx); err != nil {
		b.Skipf("the namespace backend, the reference, cannot run here: %v", err)
	}
	ws := b.TempDir()
	req := func() *backend.Request { return &backend.Request{Workspace: ws, Args: []string{"true"}} }
	run := func(be backend.Backend) time.Duration {
		t0 := time.Now()
		res, err := be.Exec(ctx, req())
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%s: %v %+v", be.Name(), err, res)
		}
		return time.Since(t0)
	}
	root := b.TempDir()
	// runsc keeps an empty network namespace mounted in its root.
	b.Cleanup(func() { _ = removeRoot(context.Background(), gb.runsc, root) })
	runscDo := []string{gb.runsc, "--root", root, "--network=none", "--platform=" + gb.Platform(), "do", "true"}
	// One of each untimed: page cache, the namespace init started ahead.
	run(nb)
	run(gb)
	var gv, ns, do []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ns = append(ns, run(nb))
		gv = append(gv, run(gb))
		t0 := time.Now()
		if out, err := exec.Command(runscDo[0], runscDo[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("runsc do: %v: %s", err, out)
		}
		do = append(do, time.Since(t0))
	}
	// Medians: a shared machine's stalls land in a few iterations, and a
	// mean would charge them to whichever backend they fell on.
	gm, nm, dm := median(gv), median(ns), median(do)
	b.ReportMetric(float64(gm.Nanoseconds()), "ns-exec-p50/op")
	b.ReportMetric(float64(nm.Nanoseconds()), "ns-namespace-p50/op")
	b.ReportMetric(float64(gm)/float64(nm), "x-vs-namespace")
	b.ReportMetric(float64(gm)/float64(dm), "x-vs-runsc-do")
}

// median is the middle of ds (the mean of the two middle ones).
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
