package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pulse-agent/pulse/backend/docker"
	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/internal/testenv/testproc"
)

// run is Run with its Env spelled out.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, onListen func(api, workers string)) int {
	return Run(ctx, args, Env{Getenv: getenv, Stdout: stdout, Stderr: stderr, OnListen: onListen})
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestUsageErrors(t *testing.T) {
	abs := t.TempDir()
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"relative paths in production", nil, nil, "must be absolute"},
		{"development off loopback", []string{"--development", "--host", "0.0.0.0"}, nil, "loopback"},
		{"non-loopback without mTLS", []string{"--host", "0.0.0.0", "--workspace-root", abs, "--database", abs + "/db"}, nil, "PULSE_TLS_CERT"},
		{"concurrency", []string{"--development", "--max-concurrency", "129"}, nil, "between 1 and 128"},
		{"limit ceiling", []string{"--development", "--max-pids", "-1"}, nil, "must not be negative"},
		{"concurrency env", []string{"--development"}, map[string]string{"PULSE_REMOTE_MAX_CONCURRENCY": "x"}, "not an integer"},
		{"retention", []string{"--development", "--retention-hours", "0"}, nil, "between 1 and 8760"},
		{"host without opt-in", []string{"--development", "--backend", "host"}, nil, "--unsafe-host"},
		{"relay without listener", []string{"--development", "--executor", "relay"}, nil, "--worker-listen"},
		{"relay without tokens", []string{"--development", "--executor", "relay", "--worker-listen", "127.0.0.1:0"}, nil, "worker tokens"},
		{"listener without relay", []string{"--development", "--worker-listen", "127.0.0.1:0"}, nil, "--executor relay"},
		{"stray argument", []string{"--development", "extra"}, nil, "unexpected"},
		{"upload limit", []string{"--development", "--max-upload-bytes", "10"}, nil, "--max-upload-bytes must be at least 1024"},
		{"unpacked below upload", []string{"--development", "--max-upload-bytes", "4096", "--max-unpacked-bytes", "2048"}, nil, "--max-unpacked-bytes at least"},
		{"output cap", []string{"--development", "--max-output-bytes", "0"}, nil, "--max-output-bytes must be at least 1024"},
		{"upload env", []string{"--development"}, map[string]string{"PULSE_REMOTE_MAX_UPLOAD_BYTES": "lots"}, "not an integer"},
	}
	for _, tc := range cases {
		var stderr bytes.Buffer
		code := run(context.Background(), tc.args, env(tc.env), &bytes.Buffer{}, &stderr, nil)
		if code != ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: code %d, stderr %q; want usage error with %q", tc.name, code, stderr.String(), tc.want)
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, env(nil), &out, &bytes.Buffer{}, nil); code != ExitOK || !strings.HasPrefix(out.String(), "pulse-server ") {
		t.Errorf("--version: %d %q", code, out.String())
	}
}

// TestStartupProblemsAllAtOnce: a first run with nothing configured must
// name every problem in one go, then the shortest way to a local try.
func TestStartupProblemsAllAtOnce(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want []string
		not  []string
	}{
		{"nothing set", nil, nil,
			[]string{"PULSE_REMOTE_TOKEN is not set", "must be absolute"},
			[]string{"PULSE_TLS_CERT"}}, // TLS is optional on loopback
		{"weak token off loopback", []string{"--host", "0.0.0.0", "--max-concurrency", "0"},
			map[string]string{"PULSE_REMOTE_TOKEN": "dev", "PULSE_REMOTE_RETENTION_HOURS": "x"},
			[]string{"token 1 of 1 is weak", "must be absolute", "PULSE_TLS_CERT", "PULSE_TLS_KEY", "PULSE_TLS_CA",
				"--max-concurrency", "PULSE_REMOTE_RETENTION_HOURS", "(7 problems)"},
			[]string{"is not set"}},
		{"development accepts a short token", []string{"--development", "--backend", "nope"},
			map[string]string{"PULSE_REMOTE_TOKEN": "dev"},
			[]string{"--backend must be", "(1 problem)"},
			[]string{"weak", "absolute", "PULSE_REMOTE_TOKEN is"}},
	}
	for _, tc := range cases {
		var stderr bytes.Buffer
		code := run(context.Background(), tc.args, env(tc.env), &bytes.Buffer{}, &stderr, nil)
		out := stderr.String()
		if code != ExitUsage {
			t.Errorf("%s: exit %d, want %d\n%s", tc.name, code, ExitUsage, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, out)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(out, n) {
				t.Errorf("%s: output has %q:\n%s", tc.name, n, out)
			}
		}
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if last := lines[len(lines)-1]; last != "for a local try: PULSE_REMOTE_TOKEN=dev pulse-server --development" {
			t.Errorf("%s: last line %q, want the local-try hint", tc.name, last)
		}
	}
}

type started struct {
	api, workers string
	code         chan int
	cancel       context.CancelFunc
	stderr       *testenv.SyncBuffer // the server's log
}

func start(t *testing.T, args []string, vars map[string]string) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{code: make(chan int, 1), cancel: cancel, stderr: &testenv.SyncBuffer{}}
	ready := make(chan struct{})
	var once sync.Once
	stderr := s.stderr
	go func() {
		s.code <- run(ctx, args, env(vars), &bytes.Buffer{}, stderr, func(api, workers string) {
			s.api, s.workers = api, workers
			once.Do(func() { close(ready) })
		})
	}()
	select {
	case <-ready:
	case code := <-s.code:
		t.Fatalf("server exited %d: %s", code, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.code:
		case <-time.After(30 * time.Second):
			t.Error("server did not stop")
		}
	})
	return s
}

// roundTrip submits echo over the WebSocket API and returns the result's
// stdout.
func roundTrip(t *testing.T, url, token string, client *http.Client) string {
	t.Helper()
	// A bound against a hang only: a Docker server's first command makes
	// its container and, from a test binary, builds the in-box runtime
	// from source, which took over 20 s on two loaded cores.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: client,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	defer c.CloseNow()
	msg, _ := json.Marshal(map[string]any{"action": "submit", "payload": map[string]any{
		"execution_id": "cli-1", "command": "echo from-main", "request_id": "q1"}})
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatal(err)
	}
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var f struct {
			Type    string         `json:"type"`
			Payload map[string]any `json:"payload"`
		}
		json.Unmarshal(data, &f)
		if f.Type == "error" {
			t.Fatalf("error: %s", data)
		}
		if f.Type == "result" {
			s, _ := f.Payload["stdout"].(string)
			return s
		}
	}
}

func TestServesWithUnsafeHost(t *testing.T) {
	dir := t.TempDir()
	s := start(t, []string{"--development", "--backend", "host", "--unsafe-host", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token"})
	resp, err := http.Get("http://" + s.api + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("readyz = %d", resp.StatusCode)
	}
	if out := roundTrip(t, "ws://"+s.api, "dev-token", nil); out != "from-main\n" {
		t.Fatalf("stdout %q", out)
	}
	s.cancel()
	if code := <-s.code; code != ExitOK {
		t.Fatalf("exit code %d after SIGTERM-equivalent", code)
	}
	s.code <- ExitOK // for the cleanup
}

func TestProductionRefusesWeakToken(t *testing.T) {
	dir := t.TempDir()
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"--backend", "host", "--unsafe-host", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db")},
		env(map[string]string{"PULSE_REMOTE_TOKEN": "dev-token"}), &bytes.Buffer{}, &stderr, nil)
	if code != ExitUsage || !strings.Contains(stderr.String(), "insecure token") {
		t.Fatalf("code %d, stderr %s", code, stderr.String())
	}
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	p := testenv.NewPKI(t)
	ca, cert, key := p.CAFile, p.ServerCertFile, p.ServerKeyFile
	s := start(t, []string{"--development", "--backend", "host", "--unsafe-host", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token", "PULSE_TLS_CERT": cert, "PULSE_TLS_KEY": key, "PULSE_TLS_CA": ca})
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: p.ClientConfig()}}
	if out := roundTrip(t, "wss://"+s.api, "dev-token", withCert); out != "from-main\n" {
		t.Fatalf("stdout %q", out)
	}
	without := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.Pool}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, _, err := websocket.Dial(ctx, "wss://"+s.api, &websocket.DialOptions{HTTPClient: without,
		HTTPHeader: http.Header{"Authorization": {"Bearer dev-token"}}}); err == nil {
		c.CloseNow()
		t.Fatal("a client without a certificate was accepted")
	}
	if resp, err := http.Get("http://" + s.api + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plaintext accepted on a TLS listener")
		}
	}
}

func TestRelayModeListensForWorkers(t *testing.T) {
	dir := t.TempDir()
	s := start(t, []string{"--development", "--executor", "relay", "--worker-listen", "127.0.0.1:0", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token", "PULSE_WORKER_TOKEN": "worker-token"})
	if s.workers == "" {
		t.Fatal("no worker listener")
	}
	conn, err := net.DialTimeout("tcp", s.workers, 5*time.Second)
	if err != nil {
		t.Fatalf("worker listener: %v", err)
	}
	conn.Close()
	resp, err := http.Get("http://" + s.api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(b.String(), "pulse_server_workers 0") {
		t.Fatalf("metrics:\n%s", b.String())
	}
}

// A pulse-worker process (testproc.Worker: this test binary, re-executed)
// attaches over TLS (verifying the server against the CA, presenting no
// client certificate) while clients need mutual TLS.
func TestRelayOverTLSWithRealWorker(t *testing.T) {
	dir := t.TempDir()
	p := testenv.NewPKI(t)
	ca, cert, key := p.CAFile, p.ServerCertFile, p.ServerKeyFile
	s := start(t, []string{"--development", "--executor", "relay", "--worker-listen", "127.0.0.1:0", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token", "PULSE_WORKER_TOKEN": "worker-token",
			"PULSE_TLS_CERT": cert, "PULSE_TLS_KEY": key, "PULSE_TLS_CA": ca})
	w := testenv.Command(t, "pulse-worker")
	w.Env = append(w.Env, "RELAY_ADDR="+s.workers, "SANDBOX_TOKEN=worker-token", "RELAY_TLS=1",
		"SANDBOX_ID=tls-worker", "SSL_CERT_FILE="+ca)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { w.Process.Kill(); w.Wait() }()
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: p.ClientConfig()}}
	testenv.Eventually(t, 30*time.Second, func() error {
		resp, err := withCert.Get("https://" + s.api + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		if !strings.Contains(b.String(), "pulse_server_workers 1") {
			return fmt.Errorf("worker did not attach:\n%s", b.String())
		}
		return nil
	})
	if out := roundTrip(t, "wss://"+s.api, "dev-token", withCert); out != "from-main\n" {
		t.Fatalf("stdout %q", out)
	}
}

func TestMain(m *testing.M) {
	// The namespace backend re-executes this test binary as its sandbox
	// init, as it does pulse-server itself.
	namespace.Init()
	testenv.RunIfChild("pulse-worker", testproc.Worker)
	testenv.RunIfChild("pulse-server", func() {
		// As cmd/pulse-server's main runs it, so a test can SIGKILL a
		// real server process.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := Run(ctx, os.Args[1:], Env{Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr})
		stop()
		os.Exit(code)
	})
	code := m.Run()
	// The cluster the Postgres tests share outlives them otherwise: a
	// postgres left running per run of this package.
	testenv.StopSharedPostgres()
	os.Exit(code)
}

// With an isolating backend the server runs under its defaults: network
// denied, writes captured.
func TestServesWithNamespaceBackend(t *testing.T) {
	// Probed and closed: the server opens its own.
	testenv.MustHaveNamespace(t, func(ctx context.Context) error {
		b, err := namespace.New()
		if err != nil {
			return err
		}
		defer b.Close()
		return b.Probe(ctx)
	})
	dir := t.TempDir()
	s := start(t, []string{"--development", "--backend", "namespace", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token"})
	if out := roundTrip(t, "ws://"+s.api, "dev-token", nil); out != "from-main\n" {
		t.Fatalf("stdout %q", out)
	}
}

func TestServesWithDockerBackend(t *testing.T) {
	// Probed and closed: the server opens its own.
	testenv.MustHaveDocker(t, func(ctx context.Context) error {
		b, err := docker.New()
		if err != nil {
			return err
		}
		defer b.Close()
		return b.Probe(ctx)
	})
	dir := t.TempDir()
	s := start(t, []string{"--development", "--backend", "docker", "--port", "0",
		"--workspace-root", filepath.Join(dir, "ws"), "--database", filepath.Join(dir, "db.sqlite3")},
		map[string]string{"PULSE_REMOTE_TOKEN": "dev-token"})
	if out := roundTrip(t, "ws://"+s.api, "dev-token", nil); out != "from-main\n" {
		t.Fatalf("stdout %q", out)
	}
}
