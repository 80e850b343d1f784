// Package testproc holds the programs a test binary can be re-executed as
// (testenv.RunIfChild) when the real main function lives in a package
// main the test cannot import. Each is the same library the command's
// main runs, configured from the environment only. It is for tests; it
// is not internal/testenv itself, which imports nothing of the project.
package testproc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/pulse-agent/pulse/internal/worker"
)

// Worker is pulse-worker as cmd/pulse-worker's main runs it without
// flags: configured from the environment (RELAY_ADDR, SANDBOX_ID,
// SANDBOX_TOKEN, RELAY_TLS, WORKER_MAX_CONCURRENT, SSL_CERT_FILE, ...),
// running until SIGINT or SIGTERM. It exits 1 on an error, after saying
// it on stderr; it logs warnings and errors only.
func Worker() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := worker.FromEnv(os.Getenv)
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		err = worker.Run(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pulse-worker:", err)
		stop()
		os.Exit(1)
	}
}
