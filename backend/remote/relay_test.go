package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/backendtest"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/egress"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

const workerToken = "remote-backend-worker-token"

// startRelayServer runs pulse-server with the relay executor on
// 127.0.0.1 and one pulse-worker process (testproc.Worker: this test
// binary, re-executed) attached to it over gRPC.
func startRelayServer(t *testing.T, opts ...relay.Option) string {
	t.Helper()
	url, _ := startRelayWorker(t, opts...)
	return url
}

// startRelayWorker is startRelayServer, and it returns the worker's
// process too, for a test that kills it.
func startRelayWorker(t *testing.T, opts ...relay.Option) (string, *exec.Cmd) {
	t.Helper()
	relay, err := relay.New([]string{workerToken}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	relay.Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)

	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "db.sqlite3"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(context.Background(), relay, st, serverOptions(dir)...)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{dir: dir, srv: srv, st: st, ln: &testenv.Listener{Listener: ln}, addr: ln.Addr().String()}
	ts.url = "ws://" + ts.addr + "/"
	ts.hs = newHTTPServer(srv)
	go ts.hs.Serve(ts.ln)
	t.Cleanup(ts.stop)

	cmd := testenv.Command(t, "pulse-worker")
	cmd.Env = append(cmd.Env, "RELAY_ADDR="+lis.Addr().String(), "SANDBOX_ID=remote-test-worker",
		"SANDBOX_TOKEN="+workerToken, "RELAY_TLS=0", "WORKER_MAX_CONCURRENT=8")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	testenv.Eventually(t, 30*time.Second, func() error {
		if live, _, _ := relay.Workers(); live != 1 {
			return fmt.Errorf("the pulse-worker did not attach: %d live workers", live)
		}
		return nil
	})
	return ts.url, cmd
}

// relayProcessReason is why the relay runs no started processes: its
// pulse-workers run each command as a series of Execs, with no handle to
// signal it or feed it input, so the server lists no process feature and
// Start is refused with ErrUnsupported (TestConformanceRelay/RefusesProcesses).
const relayProcessReason = "the relay executor keeps no handle on a worker's command, so the server lists no process feature"

// TestConformanceRelay runs the suite against pulse-server relaying to a
// pulse-worker process.
// stdinReason is why three cases cannot run through a relay: its executor
// runs no processes with a handle, so Exec sends stdin whole with the
// submission, read to its end before the command starts.
const stdinReason = "the relay runs no processes, so Exec carries stdin only whole, before the command starts: " +
	"a stdin that ends only after the command has printed (or never ends) cannot be sent"

func TestConformanceRelay(t *testing.T) {
	// Mostly waiting on timeouts and processes: run beside the rest.
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a pulse-worker process; skipped with -short")
	}
	url := startRelayServer(t)
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newBackend(t, url)
	},
		backendtest.WithTimeScale(3),
		backendtest.Skip("StreamingOutput", stdinReason),
		backendtest.Skip("StdinNotRead", stdinReason),
		backendtest.Skip("ReconcileSparesLive", stdinReason),
		backendtest.Skip("StartWait", relayProcessReason),
		backendtest.Skip("StartKillTree", relayProcessReason),
		backendtest.Skip("StartSignal", relayProcessReason),
		backendtest.WithOverlayLoss("the relay's archive limit is lowered below the size of the file the command writes, "+
			"so comparing the workspace collected from the worker fails and the server reports OVERLAY_LOST",
			func(t *testing.T) backend.Backend {
				return newBackend(t, startRelayServer(t, relay.WithArchiveLimits(protocol.ArchiveLimits{MaxUnpacked: backendtest.LostFileBytes / 2})))
			}),
	)
	t.Run("RefusesProcesses", func(t *testing.T) {
		_, err := newBackend(t, url).Start(context.Background(), &backend.Request{Shell: "true", Workspace: t.TempDir()})
		if !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("Start on the relay = %v, want ErrUnsupported", err)
		}
	})
}

// TestRelayCutMidStream: reattach works the same when the command runs on
// a worker.
func TestRelayCutMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a pulse-worker process; skipped with -short")
	}
	url := startRelayServer(t)
	p := newCutProxy(t, strings.TrimSuffix(strings.TrimPrefix(url, "ws://"), "/"), 100_000)
	b := newBackend(t, p.url())
	p.setCuts(2)
	var out buffer
	res, err := execShell(t, b, t.TempDir(), "seq 1 100000; sleep 0.3; seq 100001 150000", &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.cutCount() < 2 {
		t.Fatalf("the proxy cut %d connections, want 2", p.cutCount())
	}
	if res.ExitCode != 0 || out.String() != seqOutput(1, 150000) {
		t.Errorf("exit %d, stdout %d bytes; want %d", res.ExitCode, len(out.String()), len(seqOutput(1, 150000)))
	}
}

// A client of a fleet whose worker boxes its executions gets the box's
// enforcement as the server's capabilities, and an allowlist command with
// a secret bound to a host runs there: the host gets the value, the
// command its placeholder, and the connection comes back in the result.
func TestRelayWithBoxesEnforcesAllowlistAndInjection(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a pulse-worker process; skipped with -short")
	}
	nb, err := namespace.New(namespace.WithoutPrestart())
	if err != nil {
		t.Fatal(err)
	}
	if err := nb.Probe(context.Background()); err != nil {
		nb.Close()
		t.Skipf("no boxes on this machine, so the worker makes none: %v", err)
	}
	nb.Close()
	const value = "remote-fleet-secret-4242"
	// What the host got is recorded here: the command's output is
	// scrubbed of the value on its way back.
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		io.WriteString(w, "answered")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	b := newBackend(t, startRelayServer(t))
	caps := b.Capabilities()
	for _, m := range []policy.NetworkMode{policy.NetworkDenyAll, policy.NetworkAllowlist} {
		if caps.NetworkLevel(m) != policy.Strong {
			t.Errorf("network %s on a fleet with boxes: %s, want strong", m, caps.NetworkLevel(m))
		}
	}
	if caps.SecretLevel(secrets.DenyAll) != policy.Strong {
		t.Errorf("secrets deny-all on a fleet with boxes: %s, want strong", caps.SecretLevel(secrets.DenyAll))
	}

	ph := egress.NewPlaceholder("TOKEN")
	var out buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := b.Exec(ctx, &backend.Request{ExecutionID: t.Name(), Workspace: t.TempDir(),
		Shell: `echo "env=$TOKEN"; (exec 3<>/dev/tcp/127.0.0.1/3128 && printf 'GET http://localhost:` + port + `/ HTTP/1.1\r\nHost: localhost:` + port +
			`\r\nAuthorization: %s\r\nConnection: close\r\n\r\n' "$TOKEN" >&3 && cat <&3)`,
		Env:     map[string]string{"TOKEN": ph},
		Network: policy.NetworkPolicy{Mode: policy.NetworkAllowlist, Allow: []string{"localhost:" + port}},
		Secrets: denySecrets,
		Egress:  &backend.Egress{Inject: []backend.Injection{{Name: "TOKEN", Placeholder: ph, Value: value, Hosts: []string{"localhost"}}}},
		Stdout:  &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "env="+ph) || !strings.Contains(out.String(), "answered") {
		t.Errorf("the command should see the placeholder and the host's answer; stdout:\n%s", out.String())
	}
	select {
	case auth := <-got:
		if auth != value {
			t.Errorf("the host got Authorization %q, want the injected value", auth)
		}
	default:
		t.Error("the host got no request")
	}
	if len(res.Network) != 1 || !res.Network[0].Allowed || len(res.Network[0].Injected) != 1 {
		t.Errorf("network events %+v: want the one connection, allowed, TOKEN injected", res.Network)
	}
}
