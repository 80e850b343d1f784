// Command pulse-worker executes commands for a pulse-server relay. It dials
// out over gRPC (SandboxWorker.Attach), announces itself with Hello, runs
// each execution in a box of its own (the namespace backend, or gVisor's
// runsc where namespaces cannot be made: WORKER_ISOLATION; one at a time
// as bash -c children where no box can be made) and streams the bytes back. It holds no
// credentials besides its relay token and does no orchestration.
//
// RELAY_ADDR may list several relays (the replicas of a pulse-server
// fleet), separated by commas; the worker attaches to each and counts
// its capacity once across them. With RELAY_EACH_ADDRESS=1 it attaches
// to every address each name resolves to.
//
// Configuration comes from the environment (RELAY_ADDR, SANDBOX_ID,
// SANDBOX_TOKEN, RELAY_TLS, WORKER_MAX_CONCURRENT, SANDBOX_IMAGE,
// SANDBOX_TRUST); flags of the same meaning override it. SIGINT and SIGTERM
// stop it: running commands are killed and it exits 0. A relay that
// refuses the token makes it exit 3 at once: retrying cannot help.
package main

// docs/cli.md holds this command's -help; this rewrites it (make docs).
//go:generate env PULSE_UPDATE_DOCS=1 go test -count=1 -run ^TestFlagReferenceIsCurrent$ .

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/worker"
	"github.com/pulse-agent/pulse/internal/worker/runner"
)

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitRefused: the relay refused the token (Unauthenticated or
	// PermissionDenied). Distinct so a supervisor can stop restarting.
	exitRefused = 3
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// The worker boxes each execution with the namespace backend, which
	// re-runs this binary as each box's init.
	namespace.Init()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pulse-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg, err := worker.FromEnv(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "pulse-worker: %v\n", err)
		return exitUsage
	}
	cfg.BindFlags(fs)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	check := fs.Bool("check", false, "check what this worker needs here (the programs of the relay's exec path, boxes), print it and exit: 0 when it would attach, 2 when it would refuse")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pulse-worker: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintf(stdout, "pulse-worker %s\n", version)
		return exitOK
	}
	if *check {
		return runCheck(ctx, cfg.Isolation, stdout, stderr)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "pulse-worker: -log-level: %v\n", err)
		return exitUsage
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "pulse-worker: %v\n", err)
		return exitUsage
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := worker.Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "pulse-worker: %v\n", err)
		if errors.Is(err, worker.ErrTokenRefused) {
			return exitRefused
		}
		if errors.Is(err, worker.ErrMissingPrograms) {
			return exitUsage
		}
		return exitFailure
	}
	return exitOK
}

// runCheck says what Run would find at start, without dialling: the
// programs of the relay's exec path, present and working (else Run
// refuses: exit 2) and whether executions get boxes of their own here (without, the
// worker attaches all the same and runs one at a time). An image build
// runs it inside the image it made.
func runCheck(ctx context.Context, isolation string, stdout, stderr io.Writer) int {
	if err := worker.CheckPrograms(nil); err != nil {
		fmt.Fprintf(stderr, "pulse-worker: %v\n", err)
		return exitUsage
	}
	if err := worker.CheckExecPath(ctx, nil); err != nil {
		fmt.Fprintf(stderr, "pulse-worker: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(stdout, "programs: ok (%s)\n", strings.Join(worker.RequiredPrograms, ", "))
	b, kind, err := runner.ProbeBoxes(ctx, nil, isolation)
	if err != nil {
		fmt.Fprintf(stdout, "boxes: none, so one execution at a time: %v\n", err)
		return exitOK
	}
	if c, ok := b.(io.Closer); ok {
		c.Close()
	}
	fmt.Fprintf(stdout, "boxes: %s\n", kind)
	return exitOK
}
