package namespace

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

func TestCPULimitCgroup(t *testing.T) {
	b := newBackend(t, WithoutPrestart())
	if !b.cg.cpu {
		t.Skip("needs a writable cpu cgroup: none here")
	}
	done := make(chan *backend.Result, 1)
	go func() {
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "sleep 2",
			Limits: policy.ResourceLimits{CPUs: 0.5, Timeout: 30 * time.Second}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	// Read the quota of the running init's cgroup from the host side.
	var quota string
	waitFor(t, func() bool {
		cg, ok := runningInitCgroups(b)
		if !ok {
			return false
		}
		for _, line := range strings.Split(cg, "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) == 3 && strings.Contains(","+parts[1]+",", ",cpu,") && strings.Contains(parts[2], "pulse-") {
				dir := b.cg.dirs["cpu"].base
				q, err := os.ReadFile(filepath.Join(dir, filepath.Base(parts[2]), "cpu.cfs_quota_us"))
				if err == nil {
					quota = strings.TrimSpace(string(q))
					return true
				}
			}
		}
		return false
	})
	t0 := time.Now()
	b.Close()
	res := <-done
	t.Logf("close took %v, %+v", time.Since(t0), res)
	if quota != "50000" {
		t.Fatalf("cpu quota %q, want 50000 (half of a 100ms period)", quota)
	}
}

func TestReconcileRemovesDeadCgroups(t *testing.T) {
	b := newBackend(t)
	d, ok := b.cg.dirs["pids"]
	if !ok {
		t.Skip("needs a writable pids cgroup: none here")
	}
	const deadPid = 4194303 // above any default pid_max
	if err := unix.Kill(deadPid, 0); !errors.Is(err, unix.ESRCH) {
		t.Skipf("pid %d exists here", deadPid)
	}
	dead := filepath.Join(d.base, "pulse-"+strconv.Itoa(deadPid)+"-0123456789abcdef")
	if err := os.Mkdir(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dead) })
	live := filepath.Join(d.base, "pulse-"+strconv.Itoa(os.Getpid())+"-0123456789abcdef")
	if err := os.Mkdir(live, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(live) })
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cgroup of a dead owner left: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("cgroup of a live owner removed: %v", err)
	}
}

// A limit the probe said this machine enforces must not be dropped when its
// cgroup cannot be made at run time: the command does not run at all.
func TestCgroupFailureFailsClosed(t *testing.T) {
	b := newBackend(t)
	d, ok := b.cg.dirs["pids"]
	if !ok || !b.cg.pids {
		t.Skip("needs a writable pids cgroup: none here")
	}
	// A regular file where the cgroup hierarchy was: every mkdir under it
	// fails (ENOTDIR), as a full or vanished hierarchy would.
	notDir := filepath.Join(t.TempDir(), "not-a-cgroup")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The pool's refills make cgroups too: none may run while the
	// hierarchy is swapped.
	b.waitWarm()
	good := d.base
	d.base = notDir
	b.cg.dirs["pids"] = d
	ws := t.TempDir()
	var out bytes.Buffer
	res, err := b.Exec(t.Context(), &backend.Request{Workspace: ws, Shell: "echo ran",
		Stdout: &out, Stderr: &out,
		Limits: policy.ResourceLimits{Pids: 64, Timeout: 30 * time.Second}})
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("Exec with a pids limit and no cgroup: res %+v err %v, want ErrUnavailable", res, err)
	}
	if strings.Contains(out.String(), "ran") {
		t.Fatalf("the command ran without its limits: %q", out.String())
	}
	// The hierarchy back, the same backend runs the command.
	b.waitWarm()
	d.base = good
	b.cg.dirs["pids"] = d
	res, got, _ := runCmd(t, b, &backend.Request{Workspace: ws, Shell: "echo ran",
		Limits: policy.ResourceLimits{Pids: 64, Timeout: 30 * time.Second}})
	if res.ExitCode != 0 || got != "ran\n" {
		t.Fatalf("with the cgroup hierarchy back: %+v %q", res, got)
	}
}
