package docker

import (
	"strings"
	"testing"
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
