package host_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// tracksTree skips a test that needs the backend to track a command's
// processes in a cgroup, where this machine has no writable v2 hierarchy.
func tracksTree(t *testing.T, b *host.Backend) {
	t.Helper()
	if !strings.Contains(strings.Join(b.Capabilities().Notes, "\n"), "tracked in a cgroup") {
		t.Skip("no writable cgroup v2 hierarchy here: the host backend can only kill the process group")
	}
}

// TestSetsidDoesNotEscapeTheKill: a process that leaves the command's
// process group with setsid is still killed when the command ends.
func TestSetsidDoesNotEscapeTheKill(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid(1): ", err)
	}
	b := newBackend(t)
	tracksTree(t, b)
	ws := t.TempDir()
	res := run(t, b, &backend.Request{Workspace: ws,
		Shell: `setsid sh -c 'echo $$ > esc.pid; exec sleep 30' & while [ ! -s esc.pid ]; do sleep 0.05; done; echo done`})
	pid := readPID(t, filepath.Join(ws, "esc.pid"))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	waitGone(t, pid)
}

// TestReconcileKillsWhatADeadOwnerLeft: the owner of an execution is
// SIGKILLed while its command runs (as a pulse-server can be); what the
// command started, a setsid'd process included, keeps running until a
// later backend's Reconcile kills it.
func TestReconcileKillsWhatADeadOwnerLeft(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid(1): ", err)
	}
	b := newBackend(t)
	tracksTree(t, b)
	cmd := outerCmd(t, "true", `setsid sh -c 'echo $$ > esc.pid; exec sleep 300' & echo $! > bg.pid; sleep 300`)
	ws := outerWS(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Poll(30*time.Second, func() error {
		if st, err := os.Stat(filepath.Join(ws, "esc.pid")); err != nil || st.Size() == 0 {
			return errors.New("no esc.pid yet")
		}
		return nil
	}); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the command never started its setsid child")
	}
	pid := readPID(t, filepath.Join(ws, "esc.pid"))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the setsid'd process died with its owner (%v): nothing left to reconcile", err)
	}
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	waitGone(t, pid)
}

// outerWS is the workspace outerCmd gave the caller it starts.
func outerWS(cmd *exec.Cmd) string {
	for _, kv := range cmd.Env {
		if v, ok := strings.CutPrefix(kv, outerWSEnv+"="); ok {
			return v
		}
	}
	return ""
}
