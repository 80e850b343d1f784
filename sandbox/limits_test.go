package sandbox

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/audit"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// noMemoryBackend enforces network and secrets strongly but lists no
// memory limit. No real backend here lacks one unless configured so, so a
// fake shows the facade's side.
type noMemoryBackend struct {
	backend.Backend
	execs int
}

func (n *noMemoryBackend) Name() string { return "nomem" }
func (n *noMemoryBackend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Isolation: backend.IsolationContainer, CapturesWrites: true,
		Network: map[policy.NetworkMode]policy.EnforcementLevel{policy.NetworkDenyAll: policy.Strong},
		Secrets: map[secrets.Mode]policy.EnforcementLevel{secrets.DenyAll: policy.Strong},
		Limits:  map[policy.LimitKey]policy.EnforcementLevel{policy.LimitTimeout: policy.Strong, policy.LimitOutputBytes: policy.Strong, policy.LimitPids: policy.BestEffort}}
}
func (n *noMemoryBackend) Reconcile(context.Context) error { return nil }
func (n *noMemoryBackend) Close() error                    { return nil }
func (n *noMemoryBackend) Exec(context.Context, *backend.Request) (*backend.Result, error) {
	n.execs++
	return &backend.Result{Termination: backend.Exited}, nil
}

func TestUnenforceableLimitIsRefused(t *testing.T) {
	be := &noMemoryBackend{}
	sb, err := New(context.Background(), t.TempDir(), WithBackend(be))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = sb.Execute(ctx, Command{Args: []string{"true"}, Limits: &policy.ResourceLimits{MemoryBytes: 64 << 20}})
	if !errors.Is(err, ErrUnsupportedPolicy) || !strings.Contains(err.Error(), "memory_bytes") {
		t.Fatalf("err = %v, want ErrUnsupportedPolicy naming memory_bytes", err)
	}
	if be.execs != 0 {
		t.Fatal("a command ran with a limit the backend cannot enforce")
	}
	// Best-effort enforcement runs, and says so in the audit log.
	if _, err := sb.Execute(ctx, Command{Args: []string{"true"}, Limits: &policy.ResourceLimits{Pids: 10}}); err != nil {
		t.Fatalf("best-effort limit refused: %v", err)
	}
	if be.execs != 1 {
		t.Fatalf("execs = %d", be.execs)
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool {
		return e.Action == "limits" && e.Target == "pids" && e.EnforcementLevel == "best-effort"
	}) {
		t.Fatal("best-effort limit not audited")
	}
	if !hasEvent(evs, func(e audit.Event) bool {
		return e.Reason == "unsupported_policy" && strings.Contains(e.Detail, "memory_bytes")
	}) {
		t.Fatal("refused limit not audited")
	}
}

func TestUnsafeHostAcceptsUnenforcedLimitsAudited(t *testing.T) {
	sb := newHost(t, t.TempDir(), WithLimits(policy.ResourceLimits{MemoryBytes: 256 << 20}), WithUnsafeHostExecution(UnsafeLimits))
	res, err := sb.Execute(context.Background(), Command{Shell: "true"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("res=%+v err=%v", res, err)
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool {
		return e.Action == "limits" && e.Target == "memory_bytes" && e.Reason == "UNSAFE_HOST"
	}) {
		t.Fatal("unenforced limit on the unsafe host not audited")
	}
}

func TestUnreachableRemoteIsPassedOverAndSaid(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	env := func(k string) string {
		switch k {
		case "PULSE_REMOTE_URL":
			return "ws://" + addr
		case "PULSE_REMOTE_TOKEN":
			return "dev"
		}
		return ""
	}
	sb, err := New(context.Background(), t.TempDir(), withGetenv(env), WithUnsafeHostExecution())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if sb.Backend().Name() == "remote" {
		t.Fatal("an unreachable remote was chosen")
	}
	over := sb.PassedOver()
	if len(over) == 0 || !strings.HasPrefix(over[0], "remote: ") {
		t.Fatalf("PassedOver = %q, want the remote's reason first", over)
	}
}

// limitsBackend records the request, and enforces every limit strongly.
type limitsBackend struct{ ovBackend }

func (l *limitsBackend) Capabilities() backend.Capabilities {
	c := l.ovBackend.Capabilities()
	c.Limits = map[policy.LimitKey]policy.EnforcementLevel{}
	for _, k := range policy.LimitKeys() {
		c.Limits[k] = policy.Strong
	}
	return c
}

// A command's limits only tighten the policy's: a shorter timeout keeps
// the policy's pids and memory, and asking for more is refused before
// anything runs.
func TestCommandLimitsOnlyTightenThePolicys(t *testing.T) {
	pol := policy.Default()
	pol.Limits = policy.ResourceLimits{Pids: 32, MemoryBytes: 256 << 20, Timeout: 5 * time.Minute}
	be := &limitsBackend{}
	sb, err := New(context.Background(), t.TempDir(), WithBackend(be), WithPolicy(pol))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if _, err := sb.Execute(ctx, Command{Args: []string{"true"}, Limits: &policy.ResourceLimits{Timeout: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if got := be.req.Limits; got.Pids != 32 || got.MemoryBytes != 256<<20 || got.Timeout != time.Minute {
		t.Fatalf("limits sent = %+v, want pids 32, memory 256MiB, timeout 1m", got)
	}
	if _, err := sb.Execute(ctx, Command{Args: []string{"true"}, Limits: &policy.ResourceLimits{Pids: 8}}); err != nil {
		t.Fatal(err)
	}
	if got := be.req.Limits; got.Pids != 8 || got.MemoryBytes != 256<<20 || got.Timeout != 5*time.Minute {
		t.Fatalf("limits sent = %+v, want pids 8 with the policy's memory and timeout", got)
	}

	be.req = nil
	_, err = sb.Execute(ctx, Command{Args: []string{"true"}, Limits: &policy.ResourceLimits{Pids: 100, Timeout: time.Hour}})
	var le *policy.LimitError
	if !errors.Is(err, ErrLimitExceeded) || !errors.As(err, &le) {
		t.Fatalf("err = %v, want ErrLimitExceeded with a *policy.LimitError", err)
	}
	if !strings.Contains(err.Error(), "pids") || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("err = %v, want both fields named", err)
	}
	if be.req != nil {
		t.Fatal("a command asking for more than the policy allows ran")
	}
	evs := verifyAudit(t, sb)
	if !hasEvent(evs, func(e audit.Event) bool { return e.Decision == "deny" && e.Reason == "limit_exceeded" }) {
		t.Fatal("the refusal was not audited")
	}
}

func TestWithLimitsOnlyTightensThePolicys(t *testing.T) {
	pol := policy.Default()
	pol.Limits = policy.ResourceLimits{Pids: 32}
	_, err := New(context.Background(), t.TempDir(), WithBackend(&ovBackend{}), WithPolicy(pol),
		WithLimits(policy.ResourceLimits{Pids: 64}))
	if !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("err = %v, want ErrLimitExceeded", err)
	}
	be := &limitsBackend{}
	sb, err := New(context.Background(), t.TempDir(), WithBackend(be), WithPolicy(pol),
		WithLimits(policy.ResourceLimits{Pids: 16, MemoryBytes: 64 << 20}))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Execute(context.Background(), Command{Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if got := be.req.Limits; got.Pids != 16 || got.MemoryBytes != 64<<20 {
		t.Fatalf("limits sent = %+v", got)
	}
}

// A command cannot lift itself above the isolating backends' pids,
// memory and disk defaults; only the policy raises them.
func TestCommandLimitsCannotExceedTheIsolationDefaults(t *testing.T) {
	be := &limitsBackend{}
	sb, err := New(context.Background(), t.TempDir(), WithBackend(be))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	_, err = sb.Execute(ctx, Command{Args: []string{"true"}, Limits: &policy.ResourceLimits{Pids: policy.DefaultPids + 1}})
	if !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("err = %v, want ErrLimitExceeded", err)
	}
	_, err = sb.Execute(ctx, Command{Args: []string{"true"}, Limits: &policy.ResourceLimits{DiskBytes: policy.DefaultDiskBytes + 1}})
	if !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("disk_bytes over the default: err = %v, want ErrLimitExceeded", err)
	}
	if _, err := sb.Execute(ctx, Command{Args: []string{"true"}, Limits: &policy.ResourceLimits{Timeout: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if be.req.Limits.Pids != 0 || be.req.Limits.MemoryBytes != 0 || be.req.Limits.DiskBytes != 0 {
		t.Fatalf("limits sent = %+v: unset pids and memory are the backend's to default", be.req.Limits)
	}
}

// Docker's memory, cpu, pids and disk limits are its container's: a command's
// own lower value would quietly not apply, so it is refused.
func TestDockerRefusesPerCommandResourceLimits(t *testing.T) {
	ws := t.TempDir()
	probe := newDockerSandbox(t, ws) // skips without Docker
	probe.Close()
	sb, err := New(context.Background(), ws, withGetenv(noEnv), WithBackendName("docker"),
		WithLimits(policy.ResourceLimits{Pids: 256}))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	for _, l := range []policy.ResourceLimits{{Pids: 16}, {DiskBytes: 1 << 20}} {
		_, err = sb.Execute(ctx, Command{Shell: "true", Limits: &l})
		if !errors.Is(err, ErrUnsupportedPolicy) {
			t.Fatalf("limits %+v: err = %v, want ErrUnsupportedPolicy", l, err)
		}
	}
	if res, err := sb.Execute(ctx, Command{Shell: "true", Limits: &policy.ResourceLimits{Timeout: time.Minute}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("a per-command timeout on Docker: %+v %v", res, err)
	}
}
