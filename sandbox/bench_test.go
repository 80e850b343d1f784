package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/policy"
)

// BenchmarkExecuteTrueHost measures the whole facade (lifecycle, policy,
// enforcement check, audit events, streaming scrubbers, the in-place
// scan) around the host backend running `true`, against a bare os/exec
// of `bash -c true`, alternating the two so both see the same load. The
// x-vs-bash metric is the ratio; the goal is under 1.2.
func BenchmarkExecuteTrueHost(b *testing.B) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		b.Skip("needs bash for the reference: ", err)
	}
	ws := b.TempDir()
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackendName("host"), WithUnsafeHostExecution(UnsafeNetwork, UnsafeSecrets))
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	env := []string{"PATH=" + host.DefaultPath, "LANG=C.UTF-8"}
	var facade, ref time.Duration
	for b.Loop() {
		t0 := time.Now()
		res, err := sb.Execute(ctx, Command{Shell: "true"})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("Execute: %v %+v", err, res)
		}
		t1 := time.Now()
		cmd := exec.Command(bash, "-c", "true")
		cmd.Dir, cmd.Env = ws, env
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		facade += t1.Sub(t0)
		ref += time.Since(t1)
	}
	if ref > 0 {
		b.ReportMetric(float64(facade)/float64(ref), "x-vs-bash")
		b.ReportMetric(float64(facade.Nanoseconds())/float64(b.N), "facade-ns/op")
	}
}

// BenchmarkHiddenPaths measures the per-command expansion of read rules
// ("*.pem" needs the whole tree) on a workspace of 10,000 files in 100
// directories, against a bare filepath.WalkDir of the same tree in the
// same loop. x-vs-walkdir is the ratio: what evaluating the policy and
// checking links adds to reading the tree at all.
func BenchmarkHiddenPaths(b *testing.B) {
	ws, _ := filepath.EvalSymlinks(b.TempDir())
	for d := range 100 {
		dir := filepath.Join(ws, fmt.Sprintf("pkg%03d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			name := fmt.Sprintf("f%03d.go", f)
			if f == 0 {
				name = "key.pem"
			}
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	p := policy.Default()
	p.Rules = []policy.Rule{{Action: policy.Read, Target: ".env*", Decision: policy.Deny},
		{Action: policy.Read, Target: "*.pem", Decision: policy.Deny}}
	sb, err := New(context.Background(), ws, WithBackend(&ovBackend{}), WithPolicy(p))
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Close()
	var mine, ref time.Duration
	for b.Loop() {
		t0 := time.Now()
		hidden, err := sb.hiddenPaths()
		if err != nil || len(hidden) != 100 {
			b.Fatalf("hidden %d paths, %v", len(hidden), err)
		}
		t1 := time.Now()
		n := 0
		filepath.WalkDir(ws, func(string, fs.DirEntry, error) error { n++; return nil })
		mine += t1.Sub(t0)
		ref += time.Since(t1)
	}
	if ref > 0 {
		b.ReportMetric(float64(mine)/float64(ref), "x-vs-walkdir")
		b.ReportMetric(float64(mine.Nanoseconds())/float64(b.N), "expand-ns/op")
	}
}

// countWriter counts what reaches it: the destination of both sides of
// the throughput benchmark.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// BenchmarkExecuteStdout256MiB streams 256 MiB of stdout (`head -c` of
// /dev/zero) through Execute to a caller's writer — backend pipes, output
// cap, the secret scrubber, the caller's queue — against the same head
// writing into a direct pipe that os/exec copies to the same kind of
// writer, alternately. x-vs-pipe is the ratio; the goal is at most 1.5.
func BenchmarkExecuteStdout256MiB(b *testing.B) {
	const size = 256 << 20
	p := policy.Default()
	p.Limits.OutputBytes = 2 * size
	run := func(b *testing.B, sb *Sandbox) {
		head, err := exec.LookPath("head")
		if err != nil {
			b.Skip("needs head: ", err)
		}
		ctx := context.Background()
		args := []string{"head", "-c", fmt.Sprint(size), "/dev/zero"}
		var mine, ref time.Duration
		for b.Loop() {
			var out, direct countWriter
			t0 := time.Now()
			res, err := sb.Execute(ctx, Command{Args: args, Stdout: &out})
			if err != nil || res.ExitCode != 0 || out.n != size {
				b.Fatalf("Execute: %v %+v, %d bytes", err, res, out.n)
			}
			t1 := time.Now()
			cmd := exec.Command(head, args[1:]...)
			cmd.Stdout = &direct
			if err := cmd.Run(); err != nil || direct.n != size {
				b.Fatalf("reference: %v, %d bytes", err, direct.n)
			}
			mine += t1.Sub(t0)
			ref += time.Since(t1)
		}
		if ref > 0 {
			b.ReportMetric(float64(mine)/float64(ref), "x-vs-pipe")
			b.ReportMetric(float64(size)*float64(b.N)/mine.Seconds()/(1<<20), "MiB/s")
		}
	}
	b.Run("host", func(b *testing.B) {
		sb, err := New(context.Background(), b.TempDir(), withGetenv(noEnv), WithPolicy(p), WithBackendName("host"), WithUnsafeHostExecution(UnsafeNetwork, UnsafeSecrets))
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		run(b, sb)
	})
	b.Run("namespace", func(b *testing.B) {
		nb, err := namespace.New(namespace.WithStateDir(filepath.Join(b.TempDir(), "ns")))
		if err != nil {
			b.Fatal(err)
		}
		defer nb.Close()
		if err := nb.Probe(context.Background()); err != nil {
			b.Skipf("namespace backend unavailable: %v", err)
		}
		sb, err := New(context.Background(), b.TempDir(), withGetenv(noEnv), WithPolicy(p), WithBackend(nb))
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		run(b, sb)
	})
}
