package host_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

func newBackend(t *testing.T, opts ...host.Option) *host.Backend {
	t.Helper()
	b, err := host.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.Probe(context.Background()); err != nil {
		t.Skip("host backend unavailable: ", err)
	}
	return b
}

func run(t *testing.T, b *host.Backend, req *backend.Request) *backend.Result {
	t.Helper()
	if req.Workspace == "" {
		req.Workspace = t.TempDir()
	}
	res, err := b.Exec(context.Background(), req)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return res
}

func TestFileSizeLimitShell(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	var out bytes.Buffer
	res := run(t, b, &backend.Request{
		Workspace: ws,
		// head dies of SIGXFSZ at the limit; the shell goes on, which also
		// shows that the limit binds children, not only the shell.
		Shell:  `head -c 100000 /dev/zero > big; if [ -e /proc/$$/fd/3 ]; then echo gate-open; else echo gate-closed; fi`,
		Stdout: &out,
		Limits: policy.ResourceLimits{FileSizeBytes: 4096},
	})
	if res.ExitCode != 0 || out.String() != "gate-closed\n" {
		t.Errorf("exit %d, stdout %q; want 0, gate-closed", res.ExitCode, out.String())
	}
	fi, err := os.Stat(filepath.Join(ws, "big"))
	if err != nil || fi.Size() != 4096 {
		t.Fatalf("big: %v, size %d; want 4096 bytes", err, fi.Size())
	}
}

func TestFileSizeLimitArgs(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	res := run(t, b, &backend.Request{
		Workspace: ws,
		Args:      []string{"dd", "if=/dev/zero", "of=big", "bs=1000", "count=100"},
		Limits:    policy.ResourceLimits{FileSizeBytes: 2500},
	})
	if res.Termination != backend.Signaled || res.ExitCode != -1 {
		t.Errorf("termination %q, exit %d; want signaled by SIGXFSZ", res.Termination, res.ExitCode)
	}
	fi, err := os.Stat(filepath.Join(ws, "big"))
	if err != nil || fi.Size() != 2500 {
		t.Fatalf("big: %v; want 2500 bytes", err)
	}
	// Without a limit the same command writes everything, so the limit,
	// not dd, stopped it.
	res = run(t, b, &backend.Request{Workspace: ws, Args: []string{"dd", "if=/dev/zero", "of=big", "bs=1000", "count=100"}})
	if fi, err := os.Stat(filepath.Join(ws, "big")); err != nil || fi.Size() != 100000 || res.ExitCode != 0 {
		t.Fatalf("unlimited dd: exit %d, %v", res.ExitCode, err)
	}
}

func TestMetrics(t *testing.T) {
	b := newBackend(t)
	res := run(t, b, &backend.Request{Shell: `i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done`})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	if res.Metrics.MaxRSSBytes < 1<<20 {
		t.Errorf("max RSS %d bytes; a shell uses more than 1 MiB", res.Metrics.MaxRSSBytes)
	}
	if res.Metrics.UserCPU+res.Metrics.SystemCPU <= 0 {
		t.Errorf("no CPU time reported for a busy loop: %+v", res.Metrics)
	}
	if res.PID <= 0 || res.Duration <= 0 {
		t.Errorf("pid %d, duration %v", res.PID, res.Duration)
	}
}

func TestBadRequests(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(ws, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		req  backend.Request
		want error
	}{
		"env name with =":      {backend.Request{Shell: "true", Env: map[string]string{"A=B": "x"}}, backend.ErrInvalidRequest},
		"empty env name":       {backend.Request{Shell: "true", Env: map[string]string{"": "x"}}, backend.ErrInvalidRequest},
		"NUL in env value":     {backend.Request{Shell: "true", Env: map[string]string{"A": "x\x00y"}}, backend.ErrInvalidRequest},
		"NUL in script":        {backend.Request{Shell: "true\x00"}, backend.ErrInvalidRequest},
		"symlinked dir escape": {backend.Request{Shell: "true", Dir: "escape"}, backend.ErrInvalidRequest},
		"absolute dir":         {backend.Request{Shell: "true", Dir: outside}, backend.ErrInvalidRequest},
		"dir is a file":        {backend.Request{Shell: "true", Dir: "file"}, backend.ErrInvalidRequest},
		"missing dir":          {backend.Request{Shell: "true", Dir: "nope"}, backend.ErrInvalidRequest},
		"unknown program":      {backend.Request{Args: []string{"pulse-no-such-program"}}, backend.ErrInvalidRequest},
		"negative limit":       {backend.Request{Shell: "true", Limits: policy.ResourceLimits{OutputBytes: -1}}, backend.ErrInvalidRequest},
		"network deny-all":     {backend.Request{Shell: "true", Network: policy.DenyAllNetwork()}, backend.ErrUnsupported},
		"unknown network mode": {backend.Request{Shell: "true", Network: policy.NetworkPolicy{Mode: "bogus"}}, backend.ErrUnsupported},
		"unknown secret mode":  {backend.Request{Shell: "true", Secrets: secrets.Policy{Mode: "bogus"}}, backend.ErrUnsupported},
	} {
		t.Run(name, func(t *testing.T) {
			req := c.req
			req.Workspace = ws
			in := &closeRecorder{Reader: strings.NewReader("x")}
			req.Stdin = in
			res, err := b.Exec(context.Background(), &req)
			if !errors.Is(err, c.want) || res != nil {
				t.Errorf("got result %v, error %v; want %v", res != nil, err, c.want)
			}
			if !in.closed.Load() {
				t.Error("stdin not closed on a refused request")
			}
		})
	}
	if res, err := b.Exec(context.Background(), &backend.Request{Shell: "true", Workspace: "relative"}); !errors.Is(err, backend.ErrInvalidRequest) || res != nil {
		t.Errorf("relative workspace: %v", err)
	}
}

type closeRecorder struct {
	*strings.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

func TestSecretModesAndAllowAllNetworkRun(t *testing.T) {
	b := newBackend(t)
	for _, m := range []secrets.Mode{secrets.DenyAll, secrets.Allowlist, secrets.AllowAll} {
		res := run(t, b, &backend.Request{Shell: "true", Network: policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, Secrets: secrets.Policy{Mode: m}})
		if res.ExitCode != 0 {
			t.Errorf("secret mode %q: exit %d", m, res.ExitCode)
		}
	}
	caps := b.Capabilities()
	if caps.Isolation != backend.IsolationHostUnsafe || caps.CapturesWrites ||
		caps.NetworkLevel(policy.NetworkDenyAll) != policy.Unsupported ||
		caps.NetworkLevel(policy.NetworkAllowlist) != policy.Unsupported ||
		caps.SecretLevel(secrets.DenyAll) != policy.BestEffort {
		t.Errorf("capabilities do not match the host's reality: %+v", caps)
	}
}

func TestContextDoneBeforeStart(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := b.Exec(ctx, &backend.Request{Workspace: ws, Shell: "touch ran"})
	if !errors.Is(err, context.Canceled) || res != nil {
		t.Errorf("got result %v, error %v; want context.Canceled", res != nil, err)
	}
	if _, err := os.Stat(filepath.Join(ws, "ran")); err == nil {
		t.Error("the command ran with a done context")
	}
}

func TestProbeWithoutShell(t *testing.T) {
	b, err := host.New(host.WithShell("/nonexistent/pulse-shell"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Probe(context.Background()); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("Probe: %v; want ErrUnavailable", err)
	}
	if _, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true"}); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("Exec: %v; want ErrUnavailable", err)
	}
	if _, err := host.New(host.WithShell("bash")); err == nil {
		t.Error("a relative shell path was accepted")
	}
}

func TestBackgroundProcessDiesWithCommand(t *testing.T) {
	b := newBackend(t)
	ws := t.TempDir()
	res := run(t, b, &backend.Request{Workspace: ws, Shell: `sleep 30 > /dev/null 2>&1 & echo $! > bg.pid`})
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
	pid := readPID(t, filepath.Join(ws, "bg.pid"))
	waitGone(t, pid)
}

// TestEscapedProcessBoundedWait: a process that calls setsid leaves the
// group (and, where no cgroup tracks the command, survives its kill); Exec
// still returns, at the latest once the wait delay is over, although it
// holds stdout open.
func TestEscapedProcessBoundedWait(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid(1): ", err)
	}
	b := newBackend(t, host.WithWaitDelay(200*time.Millisecond))
	ws := t.TempDir()
	var out bytes.Buffer
	res := run(t, b, &backend.Request{Workspace: ws, Stdout: &out,
		Shell: `setsid sh -c 'echo $$ > esc.pid; exec sleep 30' & while [ ! -s esc.pid ]; do sleep 0.05; done; echo done`})
	pid := readPID(t, filepath.Join(ws, "esc.pid"))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if res.ExitCode != 0 || res.Termination != backend.Exited || out.String() != "done\n" {
		t.Errorf("exit %d, termination %q, stdout %q", res.ExitCode, res.Termination, out.String())
	}
}

func TestSameWriterForBothStreams(t *testing.T) {
	b := newBackend(t)
	// A bytes.Buffer is not safe for concurrent writes: under -race this
	// shows the two copiers never write to one writer at once.
	var both bytes.Buffer
	res := run(t, b, &backend.Request{Stdout: &both, Stderr: &both,
		Shell: `i=0; while [ $i -lt 200 ]; do echo out; echo err >&2; i=$((i+1)); done`})
	if res.ExitCode != 0 || strings.Count(both.String(), "out\n") != 200 || strings.Count(both.String(), "err\n") != 200 {
		t.Errorf("exit %d, combined output %d bytes", res.ExitCode, both.Len())
	}
}

type failingWriter struct{ calls atomic.Int64 }

func (f *failingWriter) Write(p []byte) (int, error) {
	f.calls.Add(1)
	return 0, errors.New("sink broken")
}

func TestFailingWriterDoesNotBlockCommand(t *testing.T) {
	b := newBackend(t)
	w := &failingWriter{}
	res := run(t, b, &backend.Request{Stdout: w, Shell: `head -c 1048576 /dev/zero; echo end >&2`})
	if res.ExitCode != 0 || res.Termination != backend.Exited {
		t.Errorf("exit %d, termination %q", res.ExitCode, res.Termination)
	}
	if w.calls.Load() != 1 {
		t.Errorf("a failed writer was called %d times; want 1", w.calls.Load())
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		t.Fatalf("bad pid %q", data)
	}
	return pid
}

// waitGone polls until pid is gone or a zombie; a live process after the
// generous deadline means it was not killed.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	if err := testenv.Poll(5*time.Second, func() error {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return nil
		}
		fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
		if len(fields) > 0 && (fields[0] == "Z" || fields[0] == "X") {
			return nil
		}
		return errors.New("still running")
	}); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("process %d still runs after Exec returned", pid)
	}
}
