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
