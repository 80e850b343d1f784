package docker

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// Each benchmark measures the docker CLI doing the same work in the same
// run and reports ours/CLI as x-vs-<reference>; below 1 is faster.

func dockerCLI(b *testing.B) string {
	b.Helper()
	p, err := exec.LookPath("docker")
	if err != nil {
		b.Skip("needs the docker CLI as the benchmark reference")
	}
	return p
}

func warmBox(b *testing.B, be *Backend, ws string) string {
	b.Helper()
	execShell(b, be, ws, "true")
	bx, err := be.box(context.Background(), boxKey{workspace: ws, network: policy.NetworkDenyAll})
	if err != nil {
		b.Fatal(err)
	}
	return bx.id
}

// BenchmarkDockerWarmExec: Execute of `true` in a warm sandbox against
// `docker exec CONTAINER true` on the same container.
func BenchmarkDockerWarmExec(b *testing.B) {
	be := newDocker(b)
	ws := b.TempDir()
	writeFiles(b, ws, map[string]string{"go.mod": "module x\n", "main.go": "package main\n"})
	id := warmBox(b, be, ws)
	req := func() *backend.Request {
		return &backend.Request{Workspace: ws, Args: []string{"true"}, Network: policy.DenyAllNetwork()}
	}
	cli := dockerCLI(b)
	var ours, ref time.Duration
	b.ResetTimer()
	// Ours and the reference alternate, so that load from elsewhere on
	// the machine weighs on both alike.
	for range b.N {
		start := time.Now()
		res, err := be.Exec(context.Background(), req())
		ours += time.Since(start)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("Exec: %v %+v", err, res)
		}
		b.StopTimer()
		start = time.Now()
		if out, err := exec.Command(cli, "exec", id, "true").CombinedOutput(); err != nil {
			b.Fatalf("docker exec: %v %s", err, out)
		}
		ref += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(ours)/float64(ref), "x-vs-docker-exec")
}

// BenchmarkDockerStdout256MiB: 256 MiB of stdout from a command in a warm
// sandbox, read by the caller, against `docker exec` of the same command
// into the same container with its stdout read from the CLI's pipe
// (x-vs-docker-exec). Both sides stream through the engine's attach; ours
// also counts every byte against the output cap and scrubs it.
func BenchmarkDockerStdout256MiB(b *testing.B) {
	const size = 256 << 20
	be := newDocker(b)
	ws := b.TempDir()
	id := warmBox(b, be, ws)
	cli := dockerCLI(b)
	cmd := fmt.Sprintf("head -c %d /dev/zero", size)
	var ours, ref time.Duration
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		var got countWriter
		start := time.Now()
		res, err := be.Exec(context.Background(), &backend.Request{Workspace: ws, Shell: cmd,
			Network: policy.DenyAllNetwork(), Stdout: &got, Limits: policy.ResourceLimits{OutputBytes: 2 * size}})
		ours += time.Since(start)
		if err != nil || res.ExitCode != 0 || got.n != size {
			b.Fatalf("Exec: %v %+v, %d bytes of %d", err, res, got.n, size)
		}
		b.StopTimer()
		c := exec.Command(cli, "exec", id, "sh", "-c", cmd)
		var want countWriter
		c.Stdout = &want
		start = time.Now()
		if err := c.Run(); err != nil || want.n != size {
			b.Fatalf("docker exec: %v, %d bytes of %d", err, want.n, size)
		}
		ref += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(ours)/float64(ref), "x-vs-docker-exec")
}

// countWriter counts what it is given and keeps nothing.
type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// BenchmarkDockerWarmExec2000Files: BenchmarkDockerWarmExec on a
// workspace of 2,000 files in 40 directories, where each command's copy
// (and its chown to the command's uid) costs the most.
func BenchmarkDockerWarmExec2000Files(b *testing.B) {
	be := newDocker(b)
	ws := b.TempDir()
	files := map[string]string{}
	for i := range 2000 {
		files[fmt.Sprintf("d%02d/f%04d.go", i%40, i)] = "package d\n"
	}
	writeFiles(b, ws, files)
	id := warmBox(b, be, ws)
	cli := dockerCLI(b)
	var ours, ref time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		res, err := be.Exec(context.Background(), &backend.Request{Workspace: ws, Args: []string{"true"}, Network: policy.DenyAllNetwork()})
		ours += time.Since(start)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("Exec: %v %+v", err, res)
		}
		b.StopTimer()
		start = time.Now()
		if out, err := exec.Command(cli, "exec", id, "true").CombinedOutput(); err != nil {
			b.Fatalf("docker exec: %v %s", err, out)
		}
		ref += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(ours)/float64(ref), "x-vs-docker-exec")
}

// BenchmarkDockerFirstExec: a new sandbox's first Execute (create, start,
// copy the workspace in, exec) against `docker run --rm IMAGE true`.
func BenchmarkDockerFirstExec(b *testing.B) {
	probe := newDocker(b)
	ws := b.TempDir()
	writeFiles(b, ws, map[string]string{"go.mod": "module x\n", "main.go": "package main\n"})
	cli := dockerCLI(b)
	var ours, ref time.Duration
	b.ResetTimer()
	for range b.N {
		be, err := New()
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		res, err := be.Exec(context.Background(), &backend.Request{Workspace: ws, Args: []string{"true"}, Network: policy.DenyAllNetwork()})
		ours += time.Since(start)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("Exec: %v %+v", err, res)
		}
		b.StopTimer()
		be.Close()
		start = time.Now()
		if out, err := exec.Command(cli, "run", "--rm", "--network", "none", probe.Image(), "true").CombinedOutput(); err != nil {
			b.Fatalf("docker run: %v %s", err, out)
		}
		ref += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(ours)/float64(ref), "x-vs-docker-run")
}

// BenchmarkDockerOverlay1000Files: a command writing 1,000 small files,
// its overlay read back, against the CLI running the same script with
// `docker exec` and copying the files out with `docker cp`.
func BenchmarkDockerOverlay1000Files(b *testing.B) {
	be := newDocker(b)
	ws := b.TempDir()
	id := warmBox(b, be, ws)
	const script = `mkdir -p out$1 && cd out$1 && i=0; while [ $i -lt 1000 ]; do echo $i > f$i; i=$((i+1)); done`
	cli := dockerCLI(b)
	var ours, ref time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		res, err := be.Exec(context.Background(), &backend.Request{Workspace: ws, Args: []string{"sh", "-c", script, "sh", fmt.Sprint(i)}, Network: policy.DenyAllNetwork()})
		ours += time.Since(start)
		if err != nil || res.ExitCode != 0 || len(res.Overlay.Files) != 1001 {
			b.Fatalf("Exec: %v %+v", err, res)
		}
		b.StopTimer()
		// Keep the workspace small, so every round measures the same.
		execShell(b, be, ws, "rm -rf out*")
		start = time.Now()
		if out, err := exec.Command(cli, "exec", id, "sh", "-c", "cd /pulse && mkdir -p ref && cd ref && "+script, "sh", fmt.Sprint(i)).CombinedOutput(); err != nil {
			b.Fatalf("docker exec: %v %s", err, out)
		}
		if out, err := exec.Command(cli, "cp", id+":/pulse/ref/out"+fmt.Sprint(i), b.TempDir()).CombinedOutput(); err != nil {
			b.Fatalf("docker cp: %v %s", err, out)
		}
		ref += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(ours)/float64(ref), "x-vs-docker-exec+cp")
}
