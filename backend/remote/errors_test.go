package remote

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// refusingAddr returns a 127.0.0.1 address whose port is bound by a socket
// that never listens, until the test ends: connections to it are refused.
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

func probe(b *Backend) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return b.Probe(ctx)
}

func mustNew(t *testing.T, opts ...Option) *Backend {
	t.Helper()
	b, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestDistinctErrors: each way of not reaching a usable server has its
// own class, all of them ErrUnavailable, and a message naming the fix.
func TestDistinctErrors(t *testing.T) {
	ts := startServer(t)
	// A port bound for the test's whole run but not listening: a dial is
	// refused, and no other process can take the port meanwhile (as it
	// could a port that was free a moment ago).
	down := "ws://" + refusingAddr(t) + "/"
	notPulse := httptest.NewServer(http.NotFoundHandler())
	defer notPulse.Close()
	for _, tc := range []struct {
		name  string
		url   string
		token string
		class error
		says  string
	}{
		{"wrong token", ts.url, "not-the-token", ErrUnauthorized, "PULSE_REMOTE_TOKEN"},
		{"server down", down, testToken, ErrUnreachable, "connection refused"},
		{"not a pulse-server", "ws" + strings.TrimPrefix(notPulse.URL, "http"), testToken, ErrVersion, "HTTP 404"},
		{"unresolvable host", "ws://pulse-server.invalid:1/", testToken, ErrUnreachable, "resolve"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustNew(t, WithURL(tc.url), WithToken(tc.token))
			err := probe(b)
			if !errors.Is(err, tc.class) || !errors.Is(err, backend.ErrUnavailable) {
				t.Fatalf("Probe: %v; want %v and ErrUnavailable", err, tc.class)
			}
			for _, other := range []error{ErrUnauthorized, ErrUnreachable, ErrVersion, ErrTLS} {
				if other != tc.class && errors.Is(err, other) {
					t.Errorf("Probe: %v is also %v", err, other)
				}
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Probe: %q does not say %q", err, tc.says)
			}
			res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true", Network: allowAll})
			if !errors.Is(err, tc.class) || res != nil {
				t.Errorf("Exec: result %v, error %v; want %v", res, err, tc.class)
			}
		})
	}
}

// TestCapabilitiesBeforeProbe: before Probe nothing is claimed; after it
// the server's executor levels are reported.
func TestCapabilitiesBeforeProbe(t *testing.T) {
	ts := startServer(t)
	b := mustNew(t, WithURL(ts.url), WithToken(testToken))
	c := b.Capabilities()
	if c.Isolation != backend.IsolationRemote || !c.CapturesWrites {
		t.Errorf("isolation %q, captures %v", c.Isolation, c.CapturesWrites)
	}
	for _, m := range []policy.NetworkMode{policy.NetworkDenyAll, policy.NetworkAllowAll, policy.NetworkAllowlist} {
		if l := c.NetworkLevel(m); l != policy.Unsupported {
			t.Errorf("before Probe, network %q is %q", m, l)
		}
	}
	for _, m := range []secrets.Mode{secrets.DenyAll, secrets.AllowAll, secrets.Allowlist} {
		if l := c.SecretLevel(m); l != policy.Unsupported {
			t.Errorf("before Probe, secrets %q is %q", m, l)
		}
	}
	if err := probe(b); err != nil {
		t.Fatal(err)
	}
	want := ts.srv.Executor().Capabilities()
	c = b.Capabilities()
	for m, l := range want.Network {
		if c.NetworkLevel(m) != l {
			t.Errorf("network %q: %q, the server says %q", m, c.NetworkLevel(m), l)
		}
	}
	for m, l := range want.Secrets {
		if c.SecretLevel(m) != l {
			t.Errorf("secrets %q: %q, the server says %q", m, c.SecretLevel(m), l)
		}
	}
	if c.Isolation != backend.IsolationRemote || c.Limits["memory_bytes"] != policy.Unsupported {
		t.Errorf("after Probe: isolation %q, memory limit %q", c.Isolation, c.Limits["memory_bytes"])
	}
}

// TestExecWithoutProbe fetches capabilities itself, and refuses a mode
// the server cannot enforce before anything runs.
func TestExecWithoutProbe(t *testing.T) {
	ts := startServer(t)
	b := mustNew(t, WithURL(ts.url), WithToken(testToken))
	ws := t.TempDir()
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Shell: "touch ran", Network: policy.DenyAllNetwork()})
	if !errors.Is(err, backend.ErrUnsupported) || res != nil {
		t.Fatalf("deny-all on a host executor: result %v, error %v; want ErrUnsupported", res, err)
	}
	var out buffer
	res, err = b.Exec(context.Background(), &backend.Request{Workspace: ws, Args: []string{"echo", "ok"}, Network: allowAll, Stdout: &out})
	if err != nil || res.ExitCode != 0 || out.String() != "ok\n" {
		t.Fatalf("exit %v, stdout %q, error %v", res, out.String(), err)
	}
	for _, f := range res.Overlay.Files {
		if f.Path == "ran" {
			t.Error("the refused command ran")
		}
	}
}

// TestCapacity: a server at its limit refuses at once, and says so.
func TestCapacity(t *testing.T) {
	ts := startServer(t, server.WithMaxConcurrent(1))
	b := newBackend(t, ts.url)
	var out buffer
	started := out.when("started")
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, err := b.Exec(ctx, &backend.Request{Workspace: t.TempDir(), Shell: "echo started; sleep 30", Network: allowAll, Stdout: &out})
		done <- err
	}()
	awaitStart(t, started, done)
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true", Network: allowAll})
	if !errors.Is(err, ErrCapacity) || !errors.Is(err, backend.ErrUnavailable) || res != nil {
		t.Errorf("second Exec: %v; want ErrCapacity", err)
	}
	cancel()
	if err := testenv.Recv(t, done, endWithin, "Exec's return"); err != nil {
		t.Errorf("cancelled Exec: %v", err)
	}
}

// noProcesses is an executor that runs no processes with a handle: the
// embedded interface hides the host executor's Start, so the server lists
// no process feature and Exec must send stdin whole.
type noProcesses struct{ server.Executor }

// TestTooLarge: stdin (sent whole, to a server that runs no processes) and
// workspaces over the limits are refused before anything is sent, and
// stdin is closed. To a server that runs processes the same stdin streams:
// no limit applies to it.
func TestTooLarge(t *testing.T) {
	ts := startServer(t)
	t.Run("stdin-streamed", func(t *testing.T) {
		b := newBackend(t, ts.url, WithMaxStdinBytes(1024))
		in := &closeRecorder{Reader: strings.NewReader(strings.Repeat("x", 2048))}
		var out bytes.Buffer
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "wc -c", Network: allowAll, Stdin: in, Stdout: &out})
		if err != nil || res.ExitCode != 0 || strings.TrimSpace(out.String()) != "2048" {
			t.Fatalf("Exec: %v, stdout %q; want 2048 bytes counted", err, out.String())
		}
		if !in.closed {
			t.Error("stdin was not closed")
		}
	})
	t.Run("stdin", func(t *testing.T) {
		whole := &testServer{dir: t.TempDir(), exec: noProcesses{hostExecutor(t)}}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		whole.start(t, ln)
		t.Cleanup(whole.stop)
		b := newBackend(t, whole.url, WithMaxStdinBytes(1024))
		in := &closeRecorder{Reader: strings.NewReader(strings.Repeat("x", 2048))}
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "cat", Network: allowAll, Stdin: in})
		if !errors.Is(err, ErrTooLarge) || !errors.Is(err, backend.ErrUnsupported) || res != nil {
			t.Errorf("Exec: %v; want ErrTooLarge", err)
		}
		if !in.closed {
			t.Error("stdin was not closed")
		}
	})
	for name, opt := range map[string]Option{
		"bytes":      WithWorkspaceLimits(0, 1000, 0),
		"members":    WithWorkspaceLimits(0, 0, 3),
		"compressed": WithWorkspaceLimits(500, 0, 0),
	} {
		t.Run(name, func(t *testing.T) {
			b := newBackend(t, ts.url, opt)
			ws := t.TempDir()
			for _, n := range []string{"a", "b", "c", "d"} {
				data := make([]byte, 600)
				rand.Read(data)
				os.WriteFile(filepath.Join(ws, n), data, 0o644)
			}
			res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Shell: "true", Network: allowAll})
			if !errors.Is(err, ErrTooLarge) || res != nil {
				t.Errorf("Exec: %v; want ErrTooLarge", err)
			}
		})
	}
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// TestStdinWithArgsAndDir: stdin reaches an argv command run in a
// subdirectory, through the submit's stdin field when the server lists it
// and as a carrier file against a server that does not; the carrier file
// shows up nowhere.
func TestStdinWithArgsAndDir(t *testing.T) {
	ts := startServer(t)
	for _, legacy := range []bool{false, true} {
		t.Run(map[bool]string{false: "stdin field", true: "carrier file"}[legacy], func(t *testing.T) {
			b := newBackend(t, ts.url)
			if legacy {
				b.mu.Lock()
				b.legacy = true
				b.mu.Unlock()
				probe(b)
			}
			ws := t.TempDir()
			os.MkdirAll(filepath.Join(ws, "sub", "dir"), 0o755)
			os.WriteFile(filepath.Join(ws, "keep.txt"), []byte("k"), 0o644)
			var out buffer
			in := []byte("line one\n\x00\xff binary\n")
			res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws,
				Args: []string{"sh", "-c", "cat; ls -a ../.. | grep -c pulse-stdin; readlink /proc/$$/fd/0; cat > copy.bin < /dev/null"},
				Dir:  "sub/dir", Network: allowAll, Stdin: strings.NewReader(string(in)), Stdout: &out})
			if err != nil {
				t.Fatal(err)
			}
			got, fd0, _ := strings.Cut(strings.TrimPrefix(out.String(), string(in)+"0\n"), "\n")
			if !strings.HasPrefix(out.String(), string(in)+"0\n") {
				t.Errorf("stdout %q, want the input then 0", out.String())
			}
			// The stdin field gives the command a pipe; the carrier is a
			// (removed) file.
			if isFile := strings.Contains(got, "pulse-stdin"); isFile != legacy {
				t.Errorf("fd 0 is %q (%q), legacy %v", got, fd0, legacy)
			}
			for _, f := range res.Overlay.Files {
				if strings.Contains(f.Path, "pulse-stdin") {
					t.Errorf("overlay lists the stdin carrier %q", f.Path)
				}
			}
			if len(res.Overlay.Deleted) != 0 {
				t.Errorf("overlay deletions %v", res.Overlay.Deleted)
			}
			entries, _ := os.ReadDir(ws)
			if len(entries) != 2 {
				t.Errorf("the local workspace changed: %d entries", len(entries))
			}
		})
	}
}

// TestSymlinks: a server that accepts symlinks gets those that stay
// inside the workspace, and a command sees them; one that leads out is
// left out. Against a server without the feature every symlink is left
// out, since it would refuse the whole upload. The workspace itself may
// be reached through a symlink.
func TestSymlinks(t *testing.T) {
	ts := startServer(t)
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "real.txt"), []byte("real\n"), 0o644)
	os.MkdirAll(filepath.Join(ws, "sub"), 0o755)
	if err := os.Symlink("real.txt", filepath.Join(ws, "link.txt")); err != nil {
		t.Skipf("symlinks unavailable: %v", err)
	}
	os.Symlink("../real.txt", filepath.Join(ws, "sub", "up.txt"))
	os.Symlink("../../etc/passwd", filepath.Join(ws, "sub", "out"))
	os.Symlink("/etc/passwd", filepath.Join(ws, "abs"))
	alias := filepath.Join(t.TempDir(), "alias")
	if err := os.Symlink(ws, alias); err != nil {
		t.Fatal(err)
	}
	script := "cat real.txt; for l in link.txt sub/up.txt sub/out abs; do if test -L $l; then echo \"$l -> $(readlink $l): $(cat $l 2>/dev/null | head -c 5)\"; fi; done"
	for _, legacy := range []bool{false, true} {
		t.Run(map[bool]string{false: "symlinks accepted", true: "older server"}[legacy], func(t *testing.T) {
			b := newBackend(t, ts.url)
			if legacy {
				b.mu.Lock()
				b.legacy = true
				b.mu.Unlock()
				probe(b)
			}
			var out buffer
			res, err := b.Exec(context.Background(), &backend.Request{Workspace: alias, Shell: script, Network: allowAll, Stdout: &out})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("Exec: %v %+v", err, res)
			}
			want := "real\nlink.txt -> real.txt: real\nsub/up.txt -> ../real.txt: real\n"
			if legacy {
				want = "real\n"
			}
			if out.String() != want {
				t.Errorf("stdout %q, want %q", out.String(), want)
			}
			if len(res.Overlay.Files) != 0 || len(res.Overlay.Deleted) != 0 {
				t.Errorf("overlay %+v", res.Overlay)
			}
		})
	}
}

// TestConfig: bad configurations are refused by New, FromEnv reads the
// environment, and TLS files with ws:// fail closed.
func TestConfig(t *testing.T) {
	for name, opts := range map[string][]Option{
		"no url":          {WithToken("t")},
		"http scheme":     {WithURL("http://127.0.0.1:1/"), WithToken("t")},
		"no token":        {WithURL("ws://127.0.0.1:1/")},
		"tls on ws":       {WithURL("ws://127.0.0.1:1/"), WithToken("t"), WithTLSFiles("", "", "/ca.pem")},
		"cert no key":     {WithURL("wss://127.0.0.1:1/"), WithToken("t"), WithTLSFiles("/c.pem", "", "")},
		"creds in url":    {WithURL("ws://u:p@127.0.0.1:1/"), WithToken("t")},
		"missing ca":      {WithURL("wss://127.0.0.1:1/"), WithToken("t"), WithTLSFiles("", "", "/nonexistent/ca.pem")},
		"bad stdin bound": {WithURL("ws://127.0.0.1:1/"), WithToken("t"), WithMaxStdinBytes(0)},
	} {
		if _, err := New(opts...); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v; want ErrConfig", name, err)
		}
	}
	if _, err := FromEnv(func(string) string { return "" }); !errors.Is(err, ErrNotConfigured) {
		t.Errorf("empty environment: %v; want ErrNotConfigured", err)
	}
	ts := startServer(t)
	env := map[string]string{EnvURL: ts.url, EnvToken: testToken}
	b, err := FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := probe(b); err != nil {
		t.Errorf("FromEnv backend: %v", err)
	}
}

// TestClosed: every method after Close says so; Close is idempotent.
func TestClosed(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := b.Probe(context.Background()); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Probe after Close: %v", err)
	}
	if err := b.Reconcile(context.Background()); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Reconcile after Close: %v", err)
	}
}

// TestTLS: wss:// with a client certificate works end to end; a server
// that cannot be verified, and a client without a certificate, are TLS
// errors.
func TestTLS(t *testing.T) {
	ts := startServer(t)
	p := testenv.NewPKI(t)
	hs := httptest.NewUnstartedServer(ts.srv.Handler())
	hs.TLS = p.ServerConfig()
	hs.StartTLS()
	defer hs.Close()
	url := "wss" + strings.TrimPrefix(hs.URL, "https") + "/"

	b := newBackend(t, url, WithTLSFiles(p.ClientCertFile, p.ClientKeyFile, p.CAFile))
	var out buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "echo over-tls", Network: allowAll, Stdout: &out})
	if err != nil || res.ExitCode != 0 || out.String() != "over-tls\n" {
		t.Fatalf("Exec over TLS: %v, %q", err, out.String())
	}

	noCA := mustNew(t, WithURL(url), WithToken(testToken), WithTLSFiles(p.ClientCertFile, p.ClientKeyFile, ""))
	if err := probe(noCA); !errors.Is(err, ErrTLS) || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("server signed by an unknown CA: %v; want ErrTLS", err)
	}
	noCert := mustNew(t, WithURL(url), WithToken(testToken), WithTLSFiles("", "", p.CAFile))
	if err := probe(noCert); !errors.Is(err, ErrTLS) {
		t.Errorf("no client certificate: %v; want ErrTLS", err)
	}
	plain := mustNew(t, WithURL(strings.Replace(url, "wss://", "ws://", 1)), WithToken(testToken))
	if err := probe(plain); errors.Is(err, ErrUnauthorized) || err == nil {
		t.Errorf("ws:// to a TLS port: %v; want a failure that is not about the token", err)
	}
}
