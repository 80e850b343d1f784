package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend/namespace"
)

// copyExe copies this test binary to dir/pulse, to be run as pulse
// (asPulseEnv) with whatever the test puts beside it.
func copyExe(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	must(t, err)
	data, err := os.ReadFile(self)
	must(t, err)
	exe := filepath.Join(dir, "pulse")
	must(t, os.WriteFile(exe, data, 0o755))
	return exe
}

// `pulse doctor` reports a namespace backend whose init cannot start
// instead of crashing: here pulse runs with a pulse-runtime beside
// it that the kernel will not execute (ENOEXEC, as a sandbox that refuses
// the clone fails the start too; the start's clean-up dereferenced a nil
// init), and, second, with a state dir that cannot be made.
func TestDoctorReportsAnInitThatCannotStart(t *testing.T) {
	dir := t.TempDir()
	exe := copyExe(t, dir)
	must(t, os.WriteFile(filepath.Join(dir, namespace.InitProgramName), []byte("\x00not a program\n"), 0o755))

	doctor := func(rt string) string {
		t.Helper()
		cmd := exec.Command(exe, "doctor")
		cmd.Env = append(os.Environ(), asPulseEnv+"=1", "XDG_RUNTIME_DIR="+rt, "PULSE_REMOTE_URL=", "DOCKER_HOST=unix:///nonexistent")
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Contains(string(out), "panic") {
			t.Fatalf("pulse doctor: %v\n%s", err, out)
		}
		i := strings.Index(string(out), "namespace: ")
		if i < 0 {
			t.Fatalf("pulse doctor does not report the namespace backend:\n%s", out)
		}
		line, _, _ := strings.Cut(string(out[i:]), "\n  isolation")
		return line
	}

	// The probe drops the program it cannot run and tries this binary.
	if line := doctor(t.TempDir()); !strings.HasPrefix(line, "namespace: ") || strings.Contains(line, "exec format error") {
		t.Fatalf("namespace line %q", line)
	}

	// A state dir that cannot be made: unavailable, and why.
	rt := t.TempDir()
	must(t, os.WriteFile(filepath.Join(rt, "pulse-namespace"), nil, 0o600))
	line := doctor(rt)
	if !strings.HasPrefix(line, "namespace: unavailable\n  why: ") || !strings.Contains(line, "pulse-namespace") {
		t.Fatalf("with an unusable state dir, doctor says %q; want unavailable, naming the state dir", line)
	}
}
