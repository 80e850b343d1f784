package rtprog

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/internal/boxrt"
)

// The runtime program is injected only when it is this build's, static,
// and, beside the binary, trusted as much as the binary: a program of
// another build, a dynamic one and a group-writable one are refused.
func TestRuntimeProgramIsThisBuildsAndTrusted(t *testing.T) {
	data, err := buildRuntime()
	if err != nil {
		t.Skipf("cannot build cmd/pulse-runtime here (needs the go command): %v", err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, boxrt.Name)
	if err := os.WriteFile(good, data, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "pulse")
	if err := os.WriteFile(exe, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := trustedBeside(exe, good); err != nil {
		t.Errorf("a program beside the binary, same owner, 0755: %v", err)
	}
	if _, err := checkRuntime(good); err != nil {
		t.Errorf("this build's program: %v", err)
	}
	if err := os.Chmod(good, 0o775); err != nil {
		t.Fatal(err)
	}
	if err := trustedBeside(exe, good); err == nil {
		t.Error("a group-writable program is trusted")
	}
	// A static program of other sources: this build with a byte of
	// its embedded runtime source changed (Identity hashes those).
	other := filepath.Join(t.TempDir(), boxrt.Name)
	patched := append([]byte(nil), data...)
	src := []byte("package boxrt")
	for i := 0; i+len(src) <= len(patched); i++ {
		if string(patched[i:i+len(src)]) == string(src) {
			patched[i+len(src)-1] = 'X'
			break
		}
	}
	if err := os.WriteFile(other, patched, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := checkRuntime(other); !errors.Is(err, ErrNoRuntime) {
		t.Errorf("a program of other sources: %v, want ErrNoRuntime", err)
	}
	sh := filepath.Join(t.TempDir(), boxrt.Name)
	if err := os.WriteFile(sh, []byte("#!/bin/sh\necho "+boxrt.Identity()+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := checkRuntime(sh); !errors.Is(err, ErrNoRuntime) {
		t.Errorf("a script that answers with this identity: %v, want ErrNoRuntime", err)
	}
}
