//go:build linux

package gvisor

import (
	"context"
	"os/exec"
	"path/filepath"
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
// cold command costs.
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
	var gv, ns, do time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ns += run(nb)
		gv += run(gb)
		t0 := time.Now()
		if out, err := exec.Command(runscDo[0], runscDo[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("runsc do: %v: %s", err, out)
		}
		do += time.Since(t0)
	}
	b.ReportMetric(float64(gv.Nanoseconds())/float64(b.N), "ns-exec/op")
	b.ReportMetric(float64(ns.Nanoseconds())/float64(b.N), "ns-namespace/op")
	b.ReportMetric(float64(gv)/float64(ns), "x-vs-namespace")
	b.ReportMetric(float64(gv)/float64(do), "x-vs-runsc-do")
}
