package remote

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/internal/server/store"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

const testToken = "remote-backend-test-token"

// testServer is a real pulse-server (internal/server) serving on a real
// 127.0.0.1 socket, running commands with the host backend as its local
// executor. The host backend cannot deny the network, so the server's
// default policy is allow-all, as pulse-server runs with --unsafe-host.
type testServer struct {
	dir    string
	addr   string
	url    string
	srv    *server.Server
	st     *store.Store
	hs     *http.Server
	ln     *testenv.Listener
	closed bool
	// exec replaces the host executor when set.
	exec server.Executor
}

func hostExecutor(t testing.TB) server.Executor {
	t.Helper()
	b, err := host.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Probe(context.Background()); err != nil {
		t.Skipf("host backend unavailable: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return server.NewLocal(b, 0, nil)
}

func serverOptions(dir string, extra ...server.Option) []server.Option {
	return append([]server.Option{
		server.WithTokens(testToken),
		server.WithWorkspaceRoot(filepath.Join(dir, "workspaces")),
		server.WithDefaultPolicies(policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, secrets.DenyAllSecrets()),
		server.WithMaxConcurrent(32),
	}, extra...)
}

// startServer starts a server in a fresh directory on a free port.
func startServer(t testing.TB, extra ...server.Option) *testServer {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{dir: dir}
	ts.start(t, ln, extra...)
	t.Cleanup(ts.stop)
	return ts
}

func (ts *testServer) start(t testing.TB, ln net.Listener, extra ...server.Option) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(ts.dir, "db.sqlite3"))
	if err != nil {
		t.Fatal(err)
	}
	ex := ts.exec
	if ex == nil {
		ex = hostExecutor(t)
	}
	srv, err := server.New(context.Background(), ex, st, serverOptions(ts.dir, extra...)...)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	ts.srv, ts.st, ts.ln = srv, st, &testenv.Listener{Listener: ln}
	ts.addr = ln.Addr().String()
	ts.url = "ws://" + ts.addr + "/"
	ts.hs = newHTTPServer(srv)
	ts.closed = false
	go ts.hs.Serve(ts.ln)
}

// stop shuts the server down in order, as pulse-server does on SIGTERM.
func (ts *testServer) stop() {
	if ts.closed {
		return
	}
	ts.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ts.srv.Shutdown(ctx)
	ts.hs.Close()
	ts.ln.DropAll()
	ts.st.Close()
}

// crash drops every connection and the store at once, the way a killed
// process would, without letting running executions record their end.
// The executions' goroutines are left to die with the old server.
func (ts *testServer) crash() *server.Server {
	ts.closed = true
	ts.hs.Close()
	ts.ln.DropAll()
	ts.st.Close()
	return ts.srv
}

// newBackend builds a probed client of url.
func newBackend(t testing.TB, url string, opts ...Option) *Backend {
	t.Helper()
	b, err := New(append([]Option{WithURL(url), WithToken(testToken), WithLogger(testLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Probe(ctx); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	// The tests' Execs dial their own connections, as before Probe left
	// one for the next call (a proxy's cuts apply to the connections it
	// accepts later); TestProbeReconcileExecShareOneConnection has it.
	b.dropSpare()
	return b
}

// testLogger shows the client's log with -v when PULSE_TEST_LOG is set.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("PULSE_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return testenv.Logger(t)
}

// buffer is a goroutine-safe writer that can wake a waiter when some
// text has arrived.
type buffer struct {
	mu     sync.Mutex
	b      []byte
	writes int
	waitOn string
	hit    chan struct{}
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	b.writes++
	if b.hit != nil && strings.Contains(string(b.b), b.waitOn) {
		close(b.hit)
		b.hit = nil
	}
	return len(p), nil
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}

// when returns a channel closed once s has been written.
func (b *buffer) when(s string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	if strings.Contains(string(b.b), s) {
		close(ch)
		return ch
	}
	b.waitOn, b.hit = s, ch
	return ch
}

// awaitStart waits until started is closed (the command printed its first
// line). A command that ends first, with its outcome on done, or never
// starts fails the test at once instead of leaving it waiting forever.
func awaitStart[T any](t *testing.T, started <-chan struct{}, done <-chan T) {
	t.Helper()
	select {
	case <-started:
	case o := <-done:
		t.Fatalf("the command ended before it started: %+v", o)
	case <-time.After(2 * time.Minute):
		t.Fatal("the command did not start within 2 minutes")
	}
}

// endWithin is how long a test waits for an Exec to return once it has
// done what should end it: a bound on a hung test, not a speed check.
const endWithin = 2 * time.Minute

// cutProxy forwards TCP connections to target and can cut them: each
// accepted connection is closed, both ways, once cutAfter bytes have gone
// from the server to the client (for the first cuts connections).
type cutProxy struct {
	ln       net.Listener
	target   string
	cutAfter int64
	upstream bool // cut the client-to-server direction instead
	// afterHeader counts cutAfter from the end of the HTTP upgrade
	// exchange, so a cut can land on the first WebSocket frame.
	afterHeader bool
	mu          sync.Mutex
	cuts        int // connections still to cut
	cutDone     int
	conns       []net.Conn
}

func newCutProxy(t testing.TB, target string, cutAfter int64) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, cutAfter: cutAfter}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) url() string { return "ws://" + p.ln.Addr().String() + "/" }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *cutProxy) handle(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	cut := p.cuts > 0
	if cut {
		p.cuts--
	}
	p.conns = append(p.conns, c, s)
	p.mu.Unlock()
	up, down := io.Writer(s), io.Writer(c)
	if cut && p.upstream {
		up = &cutWriter{w: s, left: p.cutAfter, header: p.afterHeader}
	} else if cut {
		down = &cutWriter{w: c, left: p.cutAfter, header: p.afterHeader}
	}
	go func() {
		p.copy(up, c)
		c.Close()
		s.Close()
	}()
	p.copy(down, s)
	c.Close()
	s.Close()
}

func (p *cutProxy) copy(w io.Writer, r io.Reader) {
	if _, err := io.Copy(w, r); errors.Is(err, errCut) {
		p.mu.Lock()
		p.cutDone++
		p.mu.Unlock()
	}
}

// setCuts arms the proxy to cut the next n connections.
func (p *cutProxy) setCuts(n int) {
	p.mu.Lock()
	p.cuts = n
	p.mu.Unlock()
}

// cutCount is how many connections were cut mid-stream.
func (p *cutProxy) cutCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cutDone
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

var errCut = errors.New("cut by the test proxy")

// cutWriter passes through left bytes, then fails: the copy stops in
// the middle of whatever frame was being sent.
type cutWriter struct {
	w      io.Writer
	left   int64
	header bool   // still inside the HTTP header, which does not count
	tail   []byte // the last bytes seen, to find the header's end
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if c.header {
		buf := append(c.tail, p...)
		i := bytes.Index(buf, []byte("\r\n\r\n"))
		if i < 0 {
			c.tail = append([]byte(nil), buf[max(0, len(buf)-3):]...)
			return c.w.Write(p)
		}
		c.header = false
		// Bytes of p up to the header's end pass uncounted.
		n := i + 4 - len(c.tail)
		if _, err := c.w.Write(p[:n]); err != nil {
			return 0, err
		}
		m, err := c.Write(p[n:])
		return n + m, err
	}
	if int64(len(p)) > c.left {
		n, _ := c.w.Write(p[:c.left])
		c.left = 0
		return n, errCut
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}

var (
	allowAll    = policy.NetworkPolicy{Mode: policy.NetworkAllowAll}
	denySecrets = secrets.DenyAllSecrets()
)

func policyLimits(output int64) policy.ResourceLimits {
	return policy.ResourceLimits{OutputBytes: output, Timeout: 5 * time.Minute}
}

func newHTTPServer(srv *server.Server) *http.Server {
	return &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
}
