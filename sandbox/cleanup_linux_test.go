package sandbox

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/syncio"
	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestCleanupFailureEndsInRecoveryRequired makes a command's cleanup fail
// for real: the egress proxy's directory (made under TMPDIR for a command
// under an allowlist) cannot be removed, because TMPDIR became a
// read-only bind mount while the command ran. The execution must end
// RECOVERY_REQUIRED, not FINALIZED, with an audit event naming the
// directory left behind. Needs root (mount); namespace backend.
func TestCleanupFailureEndsInRecoveryRequiredNamespaceRoot(t *testing.T) {
	checkCleanupFailure(t, newIsolated)
}

func TestCleanupFailureEndsInRecoveryRequiredDockerRoot(t *testing.T) {
	checkCleanupFailure(t, newDockerSandbox)
}

func checkCleanupFailure(t *testing.T, newSandbox func(t *testing.T, ws string, opts ...Option) *Sandbox) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test makes TMPDIR a read-only bind mount")
	}
	ws := t.TempDir()
	tmp := t.TempDir()
	sb := newSandbox(t, ws, WithAllowHosts("127.0.0.1:1"))
	t.Setenv("TMPDIR", tmp)
	if err := unix.Mount(tmp, tmp, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount here: %v", err)
	}
	mounted := true
	unmount := func() {
		if mounted {
			mounted = false
			if err := unix.Unmount(tmp, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", tmp, err)
			}
		}
	}
	t.Cleanup(unmount)

	stdinR, stdinW := io.Pipe()
	var out syncio.Buffer
	done := make(chan error, 1)
	go func() {
		_, err := sb.Execute(context.Background(), Command{Shell: "echo running; cat >/dev/null", Stdin: stdinR, Stdout: &out})
		done <- err
	}()
	// Wait for the command itself to run, not only for the proxy's
	// directory: a backend still setting up (Docker writes its egress
	// trust store after the proxy starts) would trip on the read-only
	// TMPDIR before the command, and the test would prove nothing.
	var egressDir string
	for deadline := time.Now().Add(time.Minute); egressDir == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !strings.Contains(out.String(), "running") {
			continue
		}
		m, _ := filepath.Glob(filepath.Join(tmp, "pulse-egress-*"))
		if len(m) > 0 {
			egressDir = m[0]
		}
	}
	if egressDir == "" {
		stdinW.Close()
		t.Fatalf("no egress directory appeared under %s: %v", tmp, <-done)
	}
	if err := unix.Mount("", tmp, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		stdinW.Close()
		t.Fatalf("remount read-only: %v", err)
	}
	stdinW.Close()
	if err := <-done; err != nil {
		t.Fatalf("execute: %v", err)
	}
	if _, err := os.Lstat(egressDir); err != nil {
		t.Fatalf("the egress directory is gone (%v): the cleanup did not fail, the test proves nothing", err)
	}
	unmount()
	evs := verifyAudit(t, sb)
	os.RemoveAll(egressDir)

	if !hasEvent(evs, func(e audit.Event) bool {
		return e.Action == "sandbox-cleanup" && e.Decision == "deny" && e.Reason == "cleanup_failed" &&
			strings.Contains(e.Target, egressDir) && strings.Contains(e.Detail, egressDir)
	}) {
		t.Errorf("no sandbox-cleanup event naming %s", egressDir)
	}
	var end []string
	for _, e := range evs {
		if e.Action == "lifecycle-transition" {
			end = append(end, e.Detail)
		}
	}
	if len(end) != 1 || !strings.HasPrefix(end[0], "execution state RECOVERY_REQUIRED:") || !strings.HasSuffix(end[0], "CLEANING -> RECOVERY_REQUIRED") {
		t.Errorf("lifecycle events %q, want one ending CLEANING -> RECOVERY_REQUIRED", end)
	}
}

// TestBackendLeftoversAuditedAtCloseNamespaceRoot: a run directory of
// the namespace backend (where a command's writes were caught) that
// cannot be removed — its state dir became a read-only bind mount after
// the command — is named by Close's error and by a sandbox-cleanup event
// in the audit log, never only logged. Needs root (mount).
func TestBackendLeftoversAuditedAtCloseNamespaceRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test makes the state dir a read-only bind mount")
	}
	probe, err := namespace.New()
	if err != nil {
		t.Fatal(err)
	}
	testenv.MustHaveNamespace(t, probe.Probe)
	probe.Close()
	ws, runtime := t.TempDir(), t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", runtime)
	state := filepath.Join(runtime, "pulse-namespace")
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackendName("namespace"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(context.Background(), Command{Shell: "echo x > f"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("execute: %v %+v", err, res)
	}
	if err := unix.Mount(state, state, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount here: %v", err)
	}
	mounted := true
	unmount := func() {
		if mounted {
			mounted = false
			if err := unix.Unmount(state, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", state, err)
			}
		}
	}
	t.Cleanup(unmount)
	if err := unix.Mount("", state, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount read-only: %v", err)
	}
	path := sb.AuditPath()
	cerr := sb.Close()
	unmount()
	if cerr == nil || !strings.Contains(cerr.Error(), "run directory "+state+"/") {
		t.Fatalf("Close = %v, want an error naming a run directory under %s", cerr, state)
	}
	if _, err := audit.Verify(t.Context(), path); err != nil {
		t.Fatalf("audit log does not verify: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		e, err := audit.ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		found = found || e.Action == "sandbox-cleanup" && e.Decision == "deny" && e.Reason == "cleanup_failed" &&
			strings.Contains(e.Target, "run directory "+state+"/")
	}
	if !found {
		t.Errorf("no sandbox-cleanup event naming the run directory:\n%s", data)
	}
}

// readAudit verifies the audit log at path and returns its events.
func readAudit(t *testing.T, path string) []audit.Event {
	t.Helper()
	if _, err := audit.Verify(t.Context(), path); err != nil {
		t.Fatalf("audit log does not verify: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []audit.Event
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		e, err := audit.ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	return evs
}

// TestBackendLeftoversAuditedAtCloseDockerRoot: the egress trust store of
// a Docker container under an allowlist (a directory under TMPDIR) that
// cannot be removed when the sandbox closes — TMPDIR became a read-only
// bind mount — is named by Close's error and a sandbox-cleanup event.
// Needs root (mount) and Docker.
func TestBackendLeftoversAuditedAtCloseDockerRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test makes TMPDIR a read-only bind mount")
	}
	newDockerBackend(t) // skips without Docker
	ws, tmp := t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", tmp)
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackendName("docker"), WithAllowHosts("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Execute(context.Background(), Command{Shell: "true"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("execute: %v %+v", err, res)
	}
	if m, _ := filepath.Glob(filepath.Join(tmp, "pulse-docker-trust-*")); len(m) == 0 {
		t.Skip("no egress trust store on this machine (no CA bundle): nothing to leave")
	}
	if err := unix.Mount(tmp, tmp, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount here: %v", err)
	}
	mounted := true
	unmount := func() {
		if mounted {
			mounted = false
			if err := unix.Unmount(tmp, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", tmp, err)
			}
		}
	}
	t.Cleanup(unmount)
	if err := unix.Mount("", tmp, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount read-only: %v", err)
	}
	path := sb.AuditPath()
	cerr := sb.Close()
	unmount()
	want := "docker: egress trust store " + filepath.Join(tmp, "pulse-docker-trust-")
	if cerr == nil || !strings.Contains(cerr.Error(), want) {
		t.Fatalf("Close = %v, want it to name %s*", cerr, want)
	}
	if !hasEvent(readAudit(t, path), func(e audit.Event) bool {
		return e.Action == "sandbox-cleanup" && e.Reason == "cleanup_failed" && strings.Contains(e.Target, want)
	}) {
		t.Errorf("no sandbox-cleanup event naming %s*", want)
	}
}
