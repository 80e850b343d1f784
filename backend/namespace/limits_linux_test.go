package namespace

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

func TestFileSizeLimit(t *testing.T) {
	b := newBackend(t)
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(),
		Shell:  "(head -c 100000 /dev/zero > big) 2>/dev/null; echo status=$?; wc -c < big",
		Limits: policy.ResourceLimits{FileSizeBytes: 4096, Timeout: 30 * time.Second}})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if strings.Contains(out, "status=0") || !strings.HasSuffix(out, "4096\n") {
		t.Fatalf("file grew past the limit: %q", out)
	}
	if len(res.Overlay.Files) != 1 || len(res.Overlay.Files[0].Data) != 4096 {
		t.Fatalf("overlay %+v", res.Overlay)
	}
}

func TestMemoryLimitOOM(t *testing.T) {
	b := newBackend(t)
	if !b.cg.memory {
		t.Skip("needs a writable memory cgroup: none here")
	}
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(),
		// bash itself (pid 1) holds the 256 MiB string.
		Shell:  `x=$(head -c 268435456 /dev/zero | tr '\0' a); echo survived ${#x}`,
		Limits: policy.ResourceLimits{MemoryBytes: 32 << 20, Timeout: 60 * time.Second}})
	if strings.Contains(out, "survived") {
		t.Fatalf("allocated past a 32 MiB limit: %q", out)
	}
	if res.Termination != backend.OOM {
		t.Fatalf("termination %s exit %d, want oom", res.Termination, res.ExitCode)
	}
}

func TestPidsLimit(t *testing.T) {
	b := newBackend(t)
	if !b.cg.pids {
		t.Skip("needs a writable pids cgroup: none here")
	}
	// Each `sleep &` is a process; with 8 allowed, forks start failing.
	// bash retries a failed fork with back-off, so the timeout ends it.
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(),
		Shell:  `for i in $(seq 20); do sleep 5 & done 2>/dev/null; n=0; for d in /proc/[0-9]*; do n=$((n+1)); done; echo procs=$n`,
		Limits: policy.ResourceLimits{Pids: 8, Timeout: 1500 * time.Millisecond}})
	if strings.Contains(out, "procs=") {
		n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out), "procs=")))
		if n > 8 {
			t.Fatalf("%d processes under a limit of 8", n)
		}
		return
	}
	if res.Termination != backend.Timeout {
		t.Fatalf("no output and termination %s", res.Termination)
	}
}

func TestLandlockConfinesWrites(t *testing.T) {
	b := newBackend(t)
	if b.landlock < 1 {
		t.Skip("needs landlock: the kernel has none")
	}
	// /proc/self/comm is writable by its owner as far as mounts and
	// permissions go; only landlock stops it.
	res, out, _ := runCmd(t, b, &backend.Request{Workspace: t.TempDir(),
		Shell: `echo renamed > /proc/self/comm 2>/dev/null && echo WROTE; echo ok > inws && echo ws-ok`})
	if res.ExitCode != 0 || strings.Contains(out, "WROTE") || !strings.Contains(out, "ws-ok") {
		t.Fatalf("exit %d out %q", res.ExitCode, out)
	}
}
