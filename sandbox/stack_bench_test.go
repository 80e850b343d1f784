package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/cowfs"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// BenchmarkExecuteOnStackNamespace runs `true` through the facade on the
// namespace backend on top of a pending stack of 200 transactions holding
// 10,000 staged files, against the same command in a workspace with an
// empty stack, alternating the two so both see the same load. The
// x-vs-empty-stack metric is the ratio of the total times; the goal is at
// most 1.2. median-x-vs-empty-stack is the ratio of the two sides' median
// times, which a shared machine's bursts of load move less, and
// cpu-x-vs-empty-stack the ratio of the CPU time (this process's and its
// children's: the sandbox's init and the command) the two sides used,
// which a loaded machine moves least. Both sides run one command before
// the timing starts; the stacked side's first command, which builds the
// 200 layers and reads the 200 transactions (filling what every later
// command on the unchanged stack reuses: the layer directories, the
// stack as last read at its generation, the converted Pending), is
// reported on its own as first-on-stack-ms. Nothing else is prepared.
func BenchmarkExecuteOnStackNamespace(b *testing.B) {
	ctx := context.Background()
	open := func(ws string) *Sandbox {
		nb, err := namespace.New(namespace.WithStateDir(filepath.Join(b.TempDir(), "ns")))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { nb.Close() })
		testenv.MustHaveNamespace(b, nb.Probe)
		sb, err := New(ctx, ws, withGetenv(noEnv), WithBackend(nb), WithMaxStack(1000))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { sb.Close() })
		return sb
	}
	stacked := b.TempDir()
	f, err := cowfs.Open(ctx, stacked)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 200 {
		tx, err := f.Begin(ctx, fmt.Sprintf("step %d", i))
		if err != nil {
			b.Fatal(err)
		}
		ops := make([]cowfs.Op, 0, 50)
		for j := range 50 {
			ops = append(ops, cowfs.WriteOp(fmt.Sprintf("pkg%d/f%d.go", i%20, i*50+j), []byte(fmt.Sprintf("package p // %d\n", j)), 0o644))
		}
		if _, err := tx.Stage(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	f.Close()
	onStack, empty := open(stacked), open(b.TempDir())
	var stackCPU, refCPU time.Duration
	run := func(sb *Sandbox) time.Duration {
		c0 := cpuUsed()
		t0 := time.Now()
		res, err := sb.Execute(ctx, Command{Shell: "true"})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("Execute: %v %+v", err, res)
		}
		d := time.Since(t0)
		if c := cpuUsed() - c0; sb == onStack {
			stackCPU += c
		} else {
			refCPU += c
		}
		return d
	}
	first := run(onStack)
	run(empty)
	stackCPU, refCPU = 0, 0
	if st, err := onStack.Stack(ctx); err != nil || len(st) != 200 {
		b.Fatalf("stack of %d: %v", len(st), err)
	}
	var stack, ref time.Duration
	var stacks, refs []time.Duration
	for b.Loop() {
		d := run(onStack)
		stack += d
		stacks = append(stacks, d)
		d = run(empty)
		ref += d
		refs = append(refs, d)
	}
	if ref > 0 {
		b.ReportMetric(float64(stack)/float64(ref), "x-vs-empty-stack")
		b.ReportMetric(float64(testenv.Median(stacks))/float64(testenv.Median(refs)), "median-x-vs-empty-stack")
		if refCPU > 0 {
			b.ReportMetric(float64(stackCPU)/float64(refCPU), "cpu-x-vs-empty-stack")
		}
		b.ReportMetric(float64(stack.Nanoseconds())/float64(b.N), "stack-ns/op")
		b.ReportMetric(float64(first.Milliseconds()), "first-on-stack-ms")
	}
}

// cpuUsed is the CPU time this process and its reaped children have used.
func cpuUsed() time.Duration {
	var self, kids syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &self) != nil || syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids) != nil {
		return 0
	}
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + kids.Utime.Nano() + kids.Stime.Nano())
}
