package sandbox

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/host"
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
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackendName("host"), WithUnsafeHostExecution())
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
