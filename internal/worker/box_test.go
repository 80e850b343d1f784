package worker_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/internal/testenv"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/internal/worker"
	"github.com/pulse-agent/pulse/internal/worker/runner"
	"github.com/pulse-agent/pulse/protocol"
)

// A worker that cannot make boxes says so at Hello, with the reason, and
// takes one execution at a time whatever it was configured for; an Exec
// asking for a box is refused, never run outside one.
func TestWorkerWithoutBoxesSaysSoAndRunsOneAtATime(t *testing.T) {
	defer worker.RefuseBoxes(errors.New("user namespaces are disabled (test)"))()
	f := setup(t, func(c *worker.Config) { c.MaxConcurrent = 4 })
	h := f.conn.Hello()
	if h.GetIsolation() != "" || h.GetCapacityMax() != 1 || h.GetEgress() || !strings.Contains(h.GetIsolationNote(), "user namespaces are disabled") {
		t.Fatalf("hello of a worker without boxes: isolation %q, note %q, capacity %d, egress %v; want none, the reason, 1, false",
			h.GetIsolation(), h.GetIsolationNote(), h.GetCapacityMax(), h.GetEgress())
	}
	marker := filepath.Join(f.dir, "ran")
	res := f.run(t, &sandboxv1.Exec{Box: &sandboxv1.Box{Workspace: f.dir, OverlayFile: f.dir + ".overlay", Shell: "touch " + quote(marker)}, TimeoutS: 30})
	if res.Error == nil || !strings.Contains(res.Error.GetMessage(), runner.ErrNoBox.Error()) {
		t.Fatalf("a box asked of a worker without boxes: %v %v, want ExecError naming %q", res.End, res.Error, runner.ErrNoBox)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the boxed command ran outside a box")
	}
}

// A worker that can make boxes says so, keeps its capacity, and runs a
// boxed Exec against a read-only view of the workspace: the workspace on
// the worker is untouched, and what the command wrote is the overlay
// archive beside it.
func TestWorkerBoxCapturesWritesBesideTheWorkspace(t *testing.T) {
	f := setup(t, func(c *worker.Config) { c.MaxConcurrent = 3 })
	h := f.conn.Hello()
	if h.GetIsolation() == "" {
		t.Skipf("no boxes on this machine: %s", h.GetIsolationNote())
	}
	if h.GetIsolation() != runner.IsolationNamespace || h.GetCapacityMax() != 3 || !h.GetEgress() {
		t.Fatalf("hello of a boxing worker: isolation %q, capacity %d, egress %v", h.GetIsolation(), h.GetCapacityMax(), h.GetEgress())
	}
	checkBoxCaptures(t, f)
}

// With isolation gvisor the worker boxes each execution in gVisor's runsc
// (a node that cannot make user namespaces): Hello says so, the command
// sees gVisor's kernel, not the host's, and capture is as with
// namespace boxes.
func TestWorkerGVisorBoxes(t *testing.T) {
	f := setup(t, func(c *worker.Config) { c.MaxConcurrent = 2; c.Isolation = runner.IsolationGVisor })
	h := f.conn.Hello()
	if h.GetIsolation() == "" {
		testenv.MustHave(t, testenv.GVisor, errors.New(h.GetIsolationNote()))
	}
	if h.GetIsolation() != runner.IsolationGVisor || h.GetCapacityMax() != 2 || !h.GetEgress() {
		t.Fatalf("hello of a gVisor worker: isolation %q, capacity %d, egress %v", h.GetIsolation(), h.GetCapacityMax(), h.GetEgress())
	}
	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(f.dir, "kws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	res := f.run(t, &sandboxv1.Exec{Box: &sandboxv1.Box{Workspace: ws, OverlayFile: ws + ".overlay", Shell: "cat /proc/version"},
		TimeoutS: 120, Streaming: true})
	wantEnd(t, res, 0)
	if len(res.Stdout) == 0 || string(res.Stdout) == string(host) {
		t.Fatalf("the box's kernel: %q; the host's: %q (want gVisor's own)", res.Stdout, host)
	}
	checkBoxCaptures(t, f)
}

// checkBoxCaptures runs a boxed Exec against a read-only view of a
// workspace: the workspace on the worker stays untouched, and what the
// command wrote is the overlay archive beside it.
func checkBoxCaptures(t *testing.T, f *fixture) {
	t.Helper()
	ws := filepath.Join(f.dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "old.txt"), []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ovFile := ws + ".overlay"
	res := f.run(t, &sandboxv1.Exec{Box: &sandboxv1.Box{Workspace: ws, OverlayFile: ovFile,
		Shell: `cat old.txt; rm old.txt; echo "$GREETING" > new.txt; echo err >&2; exit 7`, Env: map[string]string{"GREETING": "made in a box"}},
		TimeoutS: 60, Streaming: true})
	wantEnd(t, res, 7)
	if string(res.Stdout) != "old\n" || string(res.Stderr) != "err\n" {
		t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "old.txt")); err != nil || string(b) != "old\n" {
		t.Errorf("the workspace on the worker was changed: old.txt %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(ws, "new.txt")); err == nil {
		t.Error("the box wrote into the workspace on the worker")
	}
	data, err := os.ReadFile(ovFile)
	if err != nil {
		t.Fatalf("no overlay archive beside the workspace: %v", err)
	}
	ov, err := protocol.UnpackOverlay(data, protocol.OverlayLimits{Bytes: 1 << 20, Members: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(ov.Files) != 1 || ov.Files[0].Path != "new.txt" || string(ov.Files[0].Data) != "made in a box\n" ||
		len(ov.Deleted) != 1 || ov.Deleted[0] != "old.txt" {
		t.Errorf("overlay %+v", ov)
	}
}
