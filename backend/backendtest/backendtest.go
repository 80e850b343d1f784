package backendtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// Factory builds the backend under test. It is called once per case.
type Factory func(t *testing.T) backend.Backend

// Option adjusts the suite for a backend.
type Option func(*options)

type options struct {
	scale    float64
	skip     map[string]string
	allowEnv map[string]bool
	loss     *overlayLoss
	only     map[string]bool // nil: every case
}

// overlayLoss is how the OverlayLost case makes a backend lose a
// command's writes.
type overlayLoss struct {
	how     string
	factory Factory
}

// WithOverlayLoss says how the OverlayLost case provokes, from outside,
// the loss of what a command wrote after it ran: factory builds a backend
// on which a command that writes a file of LostFileBytes bytes (and, on
// backends that hold the overlay in memory, nothing larger) loses that
// write, and how says in words what the trigger is. A backend that
// captures writes must give it (or Skip the case, saying why).
func WithOverlayLoss(how string, factory Factory) Option {
	return func(o *options) { o.loss = &overlayLoss{how: how, factory: factory} }
}

// LostFileBytes is the size of the file the OverlayLost case writes; a
// trigger that lowers an overlay limit sets it below this.
const LostFileBytes = 64

// WithTimeScale multiplies every duration the suite uses (timeouts, how
// long it watches a sentinel file) by f, for backends whose start-up is
// slow (a container exec, a remote round trip). f below 1 is ignored.
func WithTimeScale(f float64) Option {
	return func(o *options) {
		if f > 1 {
			o.scale = f
		}
	}
}

// Skip skips the case named name (as listed in the package documentation)
// with reason. Use it only for a case the backend cannot meet by design,
// and say why; the reason is printed with the skip.
func Skip(name, reason string) Option {
	return func(o *options) { o.skip[name] = reason }
}

// Only runs the cases named (as listed in the package documentation)
// and skips the others: for a second mode of one backend that differs
// from the first in a few paths only (gVisor's cold sandboxes beside its
// warm one). A name that is no case fails the run.
func Only(names ...string) Option {
	return func(o *options) {
		if o.only == nil {
			o.only = map[string]bool{}
		}
		for _, n := range names {
			o.only[n] = true
		}
	}
}

// AllowEnv lets the Env case accept extra variables that the backend's
// engine always sets (for example HOSTNAME in a container).
func AllowEnv(names ...string) Option {
	return func(o *options) {
		for _, n := range names {
			o.allowEnv[n] = true
		}
	}
}

// suite is what every case receives.
type suite struct {
	opts    options
	factory Factory
}

type testCase struct {
	name string
	run  func(t *testing.T, s *suite)
}

var cases = []testCase{
	{"Identity", testIdentity},
	{"ExitCodes", testExitCodes},
	{"StdoutStderrSplit", testStdoutStderrSplit},
	{"StdinRoundTrip", testStdinRoundTrip},
	{"NoStdin", testNoStdin},
	{"StdinNotRead", testStdinNotRead},
	{"StreamingOutput", testStreamingOutput},
	{"TimeoutKillsGroup", testTimeoutKillsGroup},
	{"CancelKillsGroup", testCancelKillsGroup},
	{"BackgroundEndsWithCommand", testBackgroundEndsWithCommand},
	{"OutputCap", testOutputCap},
	{"Env", testEnv},
	{"Cwd", testCwd},
	{"InvalidRequest", testInvalidRequest},
	{"UnsupportedNetwork", testUnsupportedNetwork},
	{"Concurrent", testConcurrent},
	{"Writes", testWrites},
	{"OverlayLost", testOverlayLost},
	{"HiddenPaths", testHiddenPaths},
	{"StackSeesPending", testStackSeesPending},
	{"StackDiscardHides", testStackDiscardHides},
	{"StackReplaceAcrossSteps", testStackReplaceAcrossSteps},
	{"StackLongSession", testStackLongSession},
	{"StackForkIndependent", testStackForkIndependent},
	{"ReconcileSparesLive", testReconcileSparesLive},
	{"StartWait", testStartWait},
	{"StartKillTree", testStartKillTree},
	{"StartSignal", testStartSignal},
	{"StartRefused", testStartRefused},
	{"StartTTY", testStartTTY},
	{"Close", testClose},
}

// Run runs every conformance case against the backends factory builds,
// each as a subtest of t.
func Run(t *testing.T, factory Factory, opts ...Option) {
	t.Helper()
	s := &suite{factory: factory, opts: options{scale: 1, skip: map[string]string{}, allowEnv: map[string]bool{}}}
	for _, o := range opts {
		o(&s.opts)
	}
	for n := range s.opts.only {
		if !slices.ContainsFunc(cases, func(c testCase) bool { return c.name == n }) {
			t.Fatalf("Only(%q): no such case", n)
		}
	}
	for _, c := range cases {
		if s.opts.only != nil && !s.opts.only[c.name] {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			if reason, ok := s.opts.skip[c.name]; ok {
				t.Skip("skipped by the backend: " + reason)
			}
			c.run(t, s)
		})
	}
}

// d scales a duration by the suite's time scale.
func (s *suite) d(v time.Duration) time.Duration {
	return time.Duration(float64(v) * s.opts.scale)
}

// env is one case's backend and workspace.
type env struct {
	t    *testing.T
	s    *suite
	b    backend.Backend
	caps backend.Capabilities
	ws   string
	name string // the backend's, in the cross-backend cases
}

// setup builds a backend for the case, checks it is usable and gives it a
// fresh workspace.
func (s *suite) setup(t *testing.T) *env {
	t.Helper()
	b := s.factory(t)
	if b == nil {
		t.Fatal("factory returned a nil backend")
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), s.d(30*time.Second))
	defer cancel()
	if err := b.Probe(ctx); err != nil {
		t.Fatalf("Probe: %v (a factory for an unavailable backend should skip instead)", err)
	}
	return &env{t: t, s: s, b: b, caps: b.Capabilities(), ws: t.TempDir()}
}

// captures reports whether the backend returns writes as an overlay.
func (e *env) captures() bool { return e.caps.CapturesWrites }

// request fills what every request needs: the workspace, the strongest
// policy modes the backend supports, a generous timeout so that a broken
// backend fails the case instead of hanging it, and an execution id.
func (e *env) request(req *backend.Request) *backend.Request {
	if req.Workspace == "" {
		req.Workspace = e.ws
	}
	if req.ExecutionID == "" {
		req.ExecutionID = "backendtest-" + strings.ReplaceAll(e.t.Name(), "/", "-")
	}
	if req.Network.Mode == "" {
		req.Network = policy.NetworkPolicy{Mode: pickNetwork(e.caps)}
	}
	if req.Secrets.Mode == "" {
		req.Secrets = secrets.Policy{Mode: pickSecrets(e.caps)}
	}
	if req.Limits.Timeout == 0 {
		req.Limits.Timeout = e.s.d(60 * time.Second)
	}
	return req
}

func pickNetwork(c backend.Capabilities) policy.NetworkMode {
	for _, m := range []policy.NetworkMode{policy.NetworkDenyAll, policy.NetworkAllowlist, policy.NetworkAllowAll} {
		if c.NetworkLevel(m) != policy.Unsupported {
			return m
		}
	}
	return policy.NetworkDenyAll
}

func pickSecrets(c backend.Capabilities) secrets.Mode {
	for _, m := range []secrets.Mode{secrets.DenyAll, secrets.Allowlist, secrets.AllowAll} {
		if c.SecretLevel(m) != policy.Unsupported {
			return m
		}
	}
	return secrets.DenyAll
}

// exec runs req and fails the case when Exec returns an error.
func (e *env) exec(ctx context.Context, req *backend.Request) *backend.Result {
	e.t.Helper()
	res, err := e.b.Exec(ctx, e.request(req))
	if err != nil {
		e.t.Fatalf("Exec(%s): %v", describe(req), err)
	}
	if res == nil {
		e.t.Fatalf("Exec(%s): nil Result with nil error", describe(req))
	}
	return res
}

// sh runs a shell script with output captured and returns the result and
// both streams.
func (e *env) sh(script string) (*backend.Result, string, string) {
	e.t.Helper()
	var out, errb recorder
	res := e.exec(context.Background(), &backend.Request{Shell: script, Stdout: &out, Stderr: &errb})
	return res, out.String(), errb.String()
}

func describe(req *backend.Request) string {
	if req.Shell != "" {
		s := req.Shell
		if len(s) > 60 {
			s = s[:60] + "..."
		}
		return "shell " + quote(s)
	}
	return "args " + quote(strings.Join(req.Args, " "))
}

func quote(s string) string { return "\"" + strings.ReplaceAll(s, "\"", "\\\"") + "\"" }

// recorder is an io.Writer that keeps what it receives, counts the calls,
// notices writes after the case declared the execution over, and can wake
// a waiter when some text or some amount has arrived.
type recorder struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	late   atomic.Int64
	closed atomic.Bool
	watch  func(total []byte)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.closed.Load() {
		r.late.Add(int64(len(p)))
	}
	r.mu.Lock()
	r.buf.Write(p)
	r.writes++
	w := r.watch
	var snapshot []byte
	if w != nil {
		snapshot = r.buf.Bytes()
	}
	if w != nil {
		w(snapshot)
	}
	r.mu.Unlock()
	return len(p), nil
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

func (r *recorder) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf.Bytes())
}

func (r *recorder) Writes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes
}

// closingReader wraps a reader and records Close.
type closingReader struct {
	r      io.Reader
	closed atomic.Bool
}

func (c *closingReader) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *closingReader) Close() error               { c.closed.Store(true); return nil }

// endless yields the same byte forever.
type endless struct{ closed atomic.Bool }

func (e *endless) Read(p []byte) (int, error) {
	if e.closed.Load() {
		return 0, errors.New("read after close")
	}
	for i := range p {
		p[i] = 'y'
	}
	return len(p), nil
}
func (e *endless) Close() error { e.closed.Store(true); return nil }

// writeFile creates a workspace file for a case.
func (e *env) writeFile(rel string, data []byte) {
	e.t.Helper()
	p := e.ws + "/" + rel
	if err := os.MkdirAll(p[:strings.LastIndex(p, "/")], 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		e.t.Fatal(err)
	}
}
