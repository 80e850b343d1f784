//go:build linux

package gvisor

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// TestSyscallsServedByGVisor shows that the command's system calls reach
// gVisor's kernel, not the host's: uname(2) and /proc/version answer with
// another kernel than the host's, and syslog(2) (dmesg) reads gVisor's
// own boot log, which no host kernel writes.
func TestSyscallsServedByGVisor(t *testing.T) {
	b := newBackend(t)
	var out, errb bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(),
		Shell: "uname -r; echo ---; cat /proc/version; echo ---; dmesg", Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exit %d, stderr %q", res.ExitCode, errb.String())
	}
	parts := strings.Split(out.String(), "---\n")
	if len(parts) != 3 {
		t.Fatalf("output %q", out.String())
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	hostRelease := unix.ByteSliceToString(uts.Release[:])
	if got := strings.TrimSpace(parts[0]); got == hostRelease {
		t.Errorf("uname -r inside is the host's release %q", got)
	}
	hostVersion, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	if parts[1] == string(hostVersion) {
		t.Errorf("/proc/version inside is the host's: %q", parts[1])
	}
	if !strings.Contains(parts[2], "Starting gVisor") {
		t.Errorf("dmesg inside is not gVisor's boot log: %q", parts[2])
	}
}
