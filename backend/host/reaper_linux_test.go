package host_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/policy"
)

// newReaped is a backend that may not make cgroups (host.NoCgroupEnv), so
// a child subreaper tracks its commands' processes: the fallback for
// machines where no cgroup can be made, forced on this one.
func newReaped(t *testing.T) *host.Backend {
	t.Helper()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid(1): ", err)
	}
	t.Setenv(host.NoCgroupEnv, "1")
	b := newBackend(t)
	notes := strings.Join(b.Capabilities().Notes, "\n")
	if strings.Contains(notes, "tracked in a cgroup") {
		t.Fatalf("%s=1 but the backend still uses a cgroup: %s", host.NoCgroupEnv, notes)
	}
	// A test binary can always re-execute itself on Linux: no skip.
	if !strings.Contains(notes, "subreaper") {
		t.Fatalf("no subreaper without a cgroup: %s", notes)
	}
	return b
}

// noReaperLeft fails when a subreaper this test process started is still
// running.
func noReaperLeft(t *testing.T) {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.HasPrefix(cmdline, []byte("pulse-host-reaper\x00")) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
			if len(f) > 1 && f[1] == self && f[0] != "Z" {
				t.Errorf("subreaper %s still running after its command ended", e.Name())
			}
		}
	}
}

// The command's shell starts `setsid sh -c 'sleep 100 &'`: the sleep is
// in another session and group, and its parent is gone at once. It dies
// when the command ends all the same.
func TestReaperKillsWhatLeftTheGroup(t *testing.T) {
	b := newReaped(t)
	ws := t.TempDir()
	var out bytes.Buffer
	res := run(t, b, &backend.Request{Workspace: ws, Stdout: &out,
		Shell: `setsid sh -c 'sleep 100 & echo $! > esc.pid'; while [ ! -s esc.pid ]; do sleep 0.05; done; echo done`})
	pid := readPID(t, filepath.Join(ws, "esc.pid"))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if res.ExitCode != 0 || res.Termination != backend.Exited || out.String() != "done\n" {
		t.Fatalf("exit %d (%s), stdout %q", res.ExitCode, res.Termination, out.String())
	}
	waitGone(t, pid)
	noReaperLeft(t)
}

// On a timeout the subreaper kills what left the group too.
func TestReaperTimeoutKillsWhatLeftTheGroup(t *testing.T) {
	b := newReaped(t)
	ws := t.TempDir()
	res := run(t, b, &backend.Request{Workspace: ws, Limits: policy.ResourceLimits{Timeout: time.Second},
		Shell: `setsid sh -c 'sleep 100 & echo $! > esc.pid'; sleep 100`})
	if res.Termination != backend.Timeout {
		t.Fatalf("termination %s, want timeout", res.Termination)
	}
	pid := readPID(t, filepath.Join(ws, "esc.pid"))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	waitGone(t, pid)
	noReaperLeft(t)
}

// Between the backend and the command, the subreaper changes nothing the
// caller sees: exit codes, a death by signal, stdin, the file size limit
// set through the gate.
func TestReaperKeepsWhatTheCallerSees(t *testing.T) {
	b := newReaped(t)
	if res := run(t, b, &backend.Request{Shell: `exit 7`}); res.ExitCode != 7 || res.Termination != backend.Exited {
		t.Errorf("exit 7: got %d (%s)", res.ExitCode, res.Termination)
	}
	if res := run(t, b, &backend.Request{Shell: `kill -TERM $$`}); res.Termination != backend.Signaled || res.ExitCode != -1 {
		t.Errorf("kill -TERM $$: got %d (%s), want signaled", res.ExitCode, res.Termination)
	}
	var out bytes.Buffer
	if res := run(t, b, &backend.Request{Shell: `cat; env | grep -c PULSE_HOST_REAPER`, Stdin: strings.NewReader("in\n"), Stdout: &out}); out.String() != "in\n0\n" {
		t.Errorf("stdin and environment: exit %d, stdout %q", res.ExitCode, out.String())
	}
	ws := t.TempDir()
	res := run(t, b, &backend.Request{Workspace: ws,
		Args:   []string{"dd", "if=/dev/zero", "of=big", "bs=1000", "count=100"},
		Limits: policy.ResourceLimits{FileSizeBytes: 2500}})
	if res.Termination != backend.Signaled {
		t.Errorf("dd over the file size limit: %d (%s), want signaled by SIGXFSZ", res.ExitCode, res.Termination)
	}
	if fi, err := os.Stat(filepath.Join(ws, "big")); err != nil || fi.Size() > 2500 {
		t.Errorf("big: %v, %d bytes; want at most 2500", err, fi.Size())
	}
	if _, err := os.Stat(filepath.Join(ws, "core")); err == nil {
		t.Error("the subreaper left a core file")
	}
	noReaperLeft(t)
}

// The owner is SIGKILLed while its command runs: the subreaper, told by
// PR_SET_PDEATHSIG, kills what the command started, setsid'd or not,
// with no Reconcile.
func TestReaperKillsWhatADeadOwnerLeft(t *testing.T) {
	newReaped(t)
	cmd := outerCmd(t, "true", `setsid sh -c 'echo $$ > esc.pid; exec sleep 300' & sleep 300`)
	ws := outerWS(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, err := os.Stat(filepath.Join(ws, "esc.pid")); err == nil && st.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the command never started its setsid child")
		}
		time.Sleep(20 * time.Millisecond)
	}
	pid := readPID(t, filepath.Join(ws, "esc.pid"))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	waitGone(t, pid)
}

// The whole conformance suite holds with the subreaper between the
// backend and the command: signals from Start's Signal reach the command,
// exit codes, limits and kills are as they are without it.
func TestConformanceUnderSubreaper(t *testing.T) {
	newReaped(t)
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, err := host.New()
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
