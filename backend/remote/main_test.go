package remote

import (
	"context"
	"github.com/pulse-agent/pulse/backend/namespace"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/pulse-agent/pulse/internal/server/cli"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/internal/testenv/testproc"
)

func TestMain(m *testing.M) {
	// A pulse-worker child boxes executions with the namespace backend,
	// which re-runs this binary as each box's init.
	namespace.Init()
	// The worker and the server that tests run as processes of their own
	// are this test binary, re-executed (testenv.Command).
	testenv.RunIfChild("pulse-worker", testproc.Worker)
	testenv.RunIfChild("pulse-server", serverMain)
	// goleak fails the run when a goroutine outlives the tests: a leak
	// the race detector does not see, since nothing races.
	goleak.VerifyTestMain(m)
}

// Where serverMain keeps its database and workspaces, and its port.
const (
	serverDirEnv  = "PULSE_TEST_SERVER_DIR"
	serverPortEnv = "PULSE_TEST_SERVER_PORT"
)

// serverMain is pulse-server — its real command line, internal/server/cli's
// Run — on the host backend (as --unsafe-host), the database and
// workspaces in serverDirEnv, on 127.0.0.1 at serverPortEnv, until SIGTERM
// or a kill.
func serverMain() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	dir := os.Getenv(serverDirEnv)
	vars := map[string]string{"PULSE_REMOTE_TOKEN": testToken}
	code := cli.Run(ctx, []string{"--development", "--backend", "host", "--unsafe-host",
		"--host", "127.0.0.1", "--port", os.Getenv(serverPortEnv), "--max-concurrency", "32",
		"--workspace-root", filepath.Join(dir, "workspaces"), "--database", filepath.Join(dir, "db.sqlite3")},
		cli.Env{Getenv: func(k string) string { return vars[k] }, Stdout: os.Stderr, Stderr: os.Stderr})
	stop()
	os.Exit(code)
}
