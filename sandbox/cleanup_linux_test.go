package sandbox

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/audit"
)

// TestCleanupFailureEndsInRecoveryRequired makes a command's cleanup fail
// for real: the egress proxy's directory (made under TMPDIR for a command
// under an allowlist) cannot be removed, because TMPDIR became a
// read-only bind mount while the command ran. The execution must end
// RECOVERY_REQUIRED, not FINALIZED, with an audit event naming the
// directory left behind. Needs root (mount); namespace backend.
func TestCleanupFailureEndsInRecoveryRequiredNamespaceRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test makes TMPDIR a read-only bind mount")
	}
	ws := t.TempDir()
	tmp := t.TempDir()
	sb := newIsolated(t, ws, WithAllowHosts("127.0.0.1:1"))
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
	done := make(chan error, 1)
	go func() {
		_, err := sb.Execute(context.Background(), Command{Shell: "cat >/dev/null", Stdin: stdinR})
		done <- err
	}()
	// The proxy's directory exists once the command is set up.
	var egressDir string
	for deadline := time.Now().Add(time.Minute); egressDir == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
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
	os.RemoveAll(egressDir)

	evs := verifyAudit(t, sb)
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
