// Command pulse-server runs commands for remote Pulse clients over an
// authenticated WebSocket protocol (protocol/PROTOCOL.md), with an
// embedded executor (Docker, Linux namespaces, or — only when asked — the
// bare host) or as a relay that pulse-workers attach to over gRPC.
//
// Configuration comes from the environment variables of the Python server
// it replaces (PULSE_REMOTE_TOKEN, PULSE_REMOTE_HOST, PULSE_REMOTE_PORT,
// PULSE_REMOTE_WORKSPACE_ROOT, PULSE_REMOTE_DB, PULSE_REMOTE_MAX_CONCURRENCY,
// PULSE_REMOTE_RETENTION_HOURS, PULSE_TLS_CERT/KEY/CA) and flags of the same
// meaning. SIGINT and SIGTERM drain it: no new submissions, running ones
// get a grace period, then are cancelled and recorded. The server itself
// is internal/server/cli's Run, which tests run as it is.
package main

// docs/cli.md holds this command's -help; this rewrites it (make docs).
//go:generate env PULSE_UPDATE_DOCS=1 go test -count=1 -run ^TestFlagReferenceIsCurrent$ .

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/server/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// The namespace backend re-executes this binary as its sandbox init.
	namespace.Init()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.Env{Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr, Version: version})
	stop()
	os.Exit(code)
}
