package host_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
)

// BenchmarkExecTrue measures one host Exec of `true` (bash -c true with
// the group kill, gate-free start, output caps and rusage) against a bare
// os/exec of `bash -c true`, alternating the two in the same loop so both
// see the same machine load, and reports the ratio.
func BenchmarkExecTrue(b *testing.B) {
	be, err := host.New()
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	if err := be.Probe(context.Background()); err != nil {
		b.Skip("host backend unavailable: ", err)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		b.Skip("needs bash for the reference: ", err)
	}
	ws := b.TempDir()
	ctx := context.Background()
	// The reference gets the environment the backend builds, so that the
	// ratio is the cost of supervision, not of a different locale.
	env := []string{"PATH=" + host.DefaultPath, "HOME=" + os.Getenv("HOME"), "LANG=C.UTF-8", "TERM=dumb", "USER=" + os.Getenv("USER")}
	var hostTotal, refTotal time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		res, err := be.Exec(ctx, &backend.Request{Workspace: ws, Shell: "true"})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("host Exec: %v %+v", err, res)
		}
		t1 := time.Now()
		cmd := exec.Command(bash, "-c", "true")
		cmd.Dir = ws
		cmd.Env = env
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		hostTotal += t1.Sub(t0)
		refTotal += time.Since(t1)
	}
	if refTotal > 0 {
		b.ReportMetric(float64(hostTotal)/float64(refTotal), "x-vs-bash")
		b.ReportMetric(float64(hostTotal.Nanoseconds())/float64(b.N), "host-ns/exec")
		b.ReportMetric(float64(refTotal.Nanoseconds())/float64(b.N), "bash-ns/exec")
	}
}
