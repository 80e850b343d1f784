package remote

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/internal/testenv/testproc"
)

func TestMain(m *testing.M) {
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

// serverMain is pulse-server on the host backend as its serve function
// puts it together — store, Reconcile of what a killed predecessor left,
// the local executor, the HTTP server on 127.0.0.1 — until SIGTERM or a
// kill.
func serverMain() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "pulse-server:", err)
		os.Exit(1)
	}
	dir := os.Getenv(serverDirEnv)
	st, err := store.Open(ctx, filepath.Join(dir, "db.sqlite3"))
	if err != nil {
		fail(err)
	}
	defer st.Close()
	b, err := host.New()
	if err != nil {
		fail(err)
	}
	defer b.Close()
	if err := b.Reconcile(ctx); err != nil {
		fail(err)
	}
	srv, err := server.New(ctx, server.NewLocal(b, 0, nil), st, serverOptions(dir)...)
	if err != nil {
		fail(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", os.Getenv(serverPortEnv)))
	if err != nil {
		fail(err)
	}
	hs := newHTTPServer(srv)
	go hs.Serve(ln)
	<-ctx.Done()
	hs.Close()
}
