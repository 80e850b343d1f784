package worker_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/worker"
)

// TestRefusesToStartWithoutTheExecPathsPrograms: on a PATH that holds
// bash and env alone (a worker image without tar, gzip, base64, ...), Run
// refuses before dialling, naming every missing program, instead of
// running commands whose writes it could not bring back.
func TestRefusesToStartWithoutTheExecPathsPrograms(t *testing.T) {
	bin := t.TempDir()
	for _, p := range []string{"bash", "env"} {
		real, err := exec.LookPath(p)
		if err != nil {
			t.Skipf("needs %s on PATH to build the thin PATH from", p)
		}
		if err := os.Symlink(real, filepath.Join(bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := worker.CheckPrograms(nil); err != nil {
		t.Skipf("this machine itself lacks what a worker needs: %v", err)
	}
	t.Setenv("PATH", bin)
	cfg := worker.Default()
	// A relay address nothing listens on: Run must fail before it dials.
	cfg.RelayAddr = "127.0.0.1:1"
	// Bounded, so that a Run that does not refuse ends (nil) and fails
	// the test instead of retrying the dial for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := worker.Run(ctx, cfg)
	if !errors.Is(err, worker.ErrMissingPrograms) {
		t.Fatalf("Run = %v, want ErrMissingPrograms", err)
	}
	for _, p := range []string{"mktemp", "cat", "rm", "base64", "tar", "gzip"} {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("the refusal does not name %s: %v", p, err)
		}
	}
	if strings.Contains(err.Error(), "bash,") || strings.Contains(err.Error(), " env") {
		t.Errorf("the refusal names a program that is there: %v", err)
	}
}

// TestRefusesToStartWhereTheExecPathFails: every program of the exec path
// is on PATH, but tar is BusyBox's (a worker image built on busybox
// alone), which takes neither --exclude nor --no-same-owner. The relay
// would run each command and then lose its writes; Run refuses first,
// saying which steps fail and what the image needs.
func TestRefusesToStartWhereTheExecPathFails(t *testing.T) {
	const busybox = "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		t.Skipf("needs a busybox at %s for its tar: %v", busybox, err)
	}
	if err := worker.CheckPrograms(nil); err != nil {
		t.Skipf("this machine itself lacks what a worker needs: %v", err)
	}
	if err := worker.CheckExecPath(t.Context(), nil); err != nil {
		t.Fatalf("the exec path fails with this machine's programs: %v", err)
	}
	bin := t.TempDir()
	for _, p := range worker.RequiredPrograms {
		real, _ := exec.LookPath(p)
		if p == "tar" {
			real = busybox
		}
		if err := os.Symlink(real, filepath.Join(bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	if out, err := exec.Command("tar", "--exclude=x", "-czf", "/dev/null", ".").CombinedOutput(); err == nil {
		t.Skipf("this busybox's tar takes --exclude (%s): nothing to refuse", out)
	}
	cfg := worker.Default()
	cfg.RelayAddr = "127.0.0.1:1"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := worker.Run(ctx, cfg)
	if !errors.Is(err, worker.ErrMissingPrograms) {
		t.Fatalf("Run = %v, want ErrMissingPrograms", err)
	}
	if !strings.Contains(err.Error(), "GNU tar") || !strings.Contains(err.Error(), "unrecognized option") {
		t.Errorf("the refusal does not say what fails and what is needed: %v", err)
	}
}
