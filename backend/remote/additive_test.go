package remote

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server"
	"github.com/pulse-agent/pulse/policy"
)

// recordingExecutor runs requests with the real host executor and keeps
// the last request's limits, to show what reached the server's backend.
type recordingExecutor struct {
	server.Executor
	mu   sync.Mutex
	last policy.ResourceLimits
}

func (r *recordingExecutor) Exec(ctx context.Context, req *backend.Request) (*backend.Result, error) {
	r.mu.Lock()
	r.last = req.Limits
	r.mu.Unlock()
	return r.Executor.Exec(ctx, req)
}

func (r *recordingExecutor) limits() policy.ResourceLimits {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// startServerExec starts a server whose executor is exec.
func startServerExec(t *testing.T, exec server.Executor, extra ...server.Option) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{dir: t.TempDir(), exec: exec}
	ts.start(t, ln, extra...)
	t.Cleanup(ts.stop)
	return ts
}

// TestLimitsTravel: the client sends Request.Limits to a server that
// takes them, the server clamps them by its ceiling, and Capabilities
// reports the levels of the server's executor. Against a server that does
// not list the feature, nothing but the timeout is sent and the limits
// read Unsupported, as before.
func TestLimitsTravel(t *testing.T) {
	rec := &recordingExecutor{Executor: hostExecutor(t)}
	ts := startServerExec(t, rec, server.WithLimitCeiling(policy.ResourceLimits{Pids: 100}))
	lim := policy.ResourceLimits{Timeout: time.Minute, MemoryBytes: 1 << 30, CPUs: 1.5, Pids: 500, FileSizeBytes: 8192, OutputBytes: 1 << 20, DiskBytes: 1 << 20}
	for _, legacy := range []bool{false, true} {
		t.Run(map[bool]string{false: "limits field", true: "older server"}[legacy], func(t *testing.T) {
			b := newBackend(t, ts.url)
			if legacy {
				b.mu.Lock()
				b.legacy = true
				b.mu.Unlock()
				probe(b)
			}
			caps := b.Capabilities()
			srvLimits := rec.Capabilities().Limits
			for _, k := range []policy.LimitKey{policy.LimitMemoryBytes, policy.LimitCPUs, policy.LimitPids, policy.LimitFileSizeBytes, policy.LimitDiskBytes} {
				want := known(srvLimits[k])
				if legacy {
					want = policy.Unsupported
				}
				if caps.Limits[k] != want {
					t.Errorf("limit %s: %q, want %q", k, caps.Limits[k], want)
				}
			}
			res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "true", Network: allowAll, Limits: lim})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("Exec: %+v, %v", res, err)
			}
			want := policy.ResourceLimits{Timeout: time.Minute, MemoryBytes: 1 << 30, CPUs: 1.5, Pids: 100, FileSizeBytes: 8192, OutputBytes: 1 << 20, DiskBytes: 1 << 20}
			if legacy {
				// Only the timeout travels; the server's ceiling and cap
				// apply.
				want = policy.ResourceLimits{Timeout: time.Minute, Pids: 100, OutputBytes: policy.DefaultOutputBytes}
			}
			if got := rec.limits(); got != want {
				t.Errorf("the server's backend got %+v, want %+v", got, want)
			}
		})
	}
}
