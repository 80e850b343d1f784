package docker

import (
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// TestDockerMergeThatDoesNotFitKeepsTheReport: a command whose writes fit
// in the scratch tmpfs but not twice (its copy, and the baseline they are
// merged into) has them all reported: the merge that fails part way is
// undone and the host rebuilds the baseline, so the next command sees the
// workspace as it is. The merge used to leave the tmpfs full, and the
// report (its status file first) could not be written: every write lost.
func TestDockerMergeThatDoesNotFitKeepsTheReport(t *testing.T) {
	b := newDocker(t, WithScratchSize("48m"))
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{"kept.txt": "k\n"})
	r := execShell(t, b, ws, `echo small > small.txt && head -c 25000000 /dev/zero > big && echo done`)
	if r.res.ExitCode != 0 || r.stdout != "done\n" || r.res.Termination != "exited" {
		t.Fatalf("exit %d (%s), stdout %q, stderr %q", r.res.ExitCode, r.res.Termination, r.stdout, r.stderr)
	}
	sizes := map[string]int{}
	for _, f := range r.res.Overlay.Files {
		sizes[f.Path] = len(f.Data)
	}
	if sizes["small.txt"] != 6 || sizes["big"] != 25000000 {
		t.Fatalf("overlay sizes %v, want small.txt 6 and big 25000000", sizes)
	}
	r = execShell(t, b, ws, `ls; wc -c < kept.txt`)
	if r.res.ExitCode != 0 || r.stdout != "kept.txt\n2\n" {
		t.Fatalf("the next command: exit %d, stdout %q, want the workspace as it is; stderr %q", r.res.ExitCode, r.stdout, r.stderr)
	}
	if strings.Contains(r.stderr, "pulse:") {
		t.Errorf("the next command's stderr: %q", r.stderr)
	}
}

// TestDockerOOMNamesTheMemoryLimit: a command the kernel's OOM killer
// ends is reported as oom, with the limit named, not as a plain signal.
func TestDockerOOMNamesTheMemoryLimit(t *testing.T) {
	b := newDocker(t, WithContainerLimits(policy.ResourceLimits{MemoryBytes: 64 << 20}))
	ws := probeWorkspace(t)
	r := execShell(t, b, ws, `./probe alloc 200`)
	if r.res.Termination != backend.OOM || r.res.ExitCode != -1 {
		t.Fatalf("termination %s, exit %d, want oom; stdout %q, stderr %q", r.res.Termination, r.res.ExitCode, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, "limits.memory_bytes, 67108864 bytes") {
		t.Errorf("stderr does not name the memory limit: %q", r.stderr)
	}
	// A command this backend kills itself (its timeout) is not taken for
	// one the OOM killer ended.
	r = execShell(t, b, ws, `sleep 30`, func(req *backend.Request) { req.Limits.Timeout = time.Second })
	if r.res.Termination != backend.Timeout {
		t.Errorf("a timed-out command after an OOM: %s", r.res.Termination)
	}
}

// TestDockerFullTmpNamed: a command that fills /tmp and fails is reported
// as disk_limit naming /tmp, and what it wrote in the workspace is kept;
// the next command sees the workspace as it is (nothing was staged).
func TestDockerFullTmpNamed(t *testing.T) {
	old := tmpfsBytes
	tmpfsBytes = 8 << 20
	t.Cleanup(func() { tmpfsBytes = old })
	b := newDocker(t)
	ws := t.TempDir()
	r := execShell(t, b, ws, `echo s > s.txt && head -c 20000000 /dev/zero > /tmp/big`)
	if r.res.Termination != backend.DiskLimit || r.res.ExitCode != 1 {
		t.Fatalf("termination %s, exit %d, want disk_limit and the command's exit 1; stderr %q", r.res.Termination, r.res.ExitCode, r.stderr)
	}
	if !strings.Contains(r.stderr, "/tmp (8 MiB, fixed)") {
		t.Errorf("stderr does not name /tmp: %q", r.stderr)
	}
	if !hasFile(r.res.Overlay, "s.txt") {
		t.Fatalf("the workspace write is not in the overlay: %+v", r.res.Overlay)
	}
	r = execShell(t, b, ws, `rm -f /tmp/big; ls`)
	if r.res.ExitCode != 0 || r.stdout != "" {
		t.Fatalf("the next command: exit %d, stdout %q, stderr %q; want an empty workspace", r.res.ExitCode, r.stdout, r.stderr)
	}
}
