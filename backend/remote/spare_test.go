package remote

import (
	"context"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

// countingListener counts the connections it accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// What a CLI process does — Probe, Reconcile, one Exec — goes over one
// connection: each later call takes the one the call before it left.
func TestProbeReconcileExecShareOneConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	ts := &testServer{dir: t.TempDir()}
	ts.start(t, cl)
	t.Cleanup(ts.stop)

	b, err := New(WithURL(ts.url), WithToken(testToken), WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	b.spareFor = time.Hour // however slowly the calls follow each other
	ctx := context.Background()
	if err := b.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := b.Exec(ctx, &backend.Request{Workspace: t.TempDir(), Shell: "true", Network: allowAll, Secrets: denySecrets})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec: %v %+v", err, res)
	}
	if n := cl.n.Load(); n != 1 {
		t.Errorf("%d connections accepted, want 1", n)
	}
	// The spare is gone once used: a second Exec dials its own.
	if _, err := b.Exec(ctx, &backend.Request{Workspace: t.TempDir(), Shell: "true", Network: allowAll, Secrets: denySecrets}); err != nil {
		t.Fatal(err)
	}
	if n := cl.n.Load(); n != 2 {
		t.Errorf("%d connections accepted after a second Exec, want 2", n)
	}
}

// Input from the null device is known to be empty: it goes with the
// submission (as none), not on a connection of its own. Other files,
// pipes included, are streamed as before.
func TestNullDeviceInputIsNotStreamed(t *testing.T) {
	info := serverInfo{features: map[string]bool{protocol.FeatureProcess: true}}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if streamsStdin(&backend.Request{Stdin: null}, info) {
		t.Error("stdin from /dev/null is streamed")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if !streamsStdin(&backend.Request{Stdin: r}, info) {
		t.Error("stdin from a pipe is not streamed")
	}
	f, err := os.CreateTemp(t.TempDir(), "in")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !streamsStdin(&backend.Request{Stdin: f}, info) {
		t.Error("stdin from a regular file is not streamed")
	}
}
