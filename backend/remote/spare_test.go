package remote

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
)

// What a CLI process does — Probe, Reconcile, one Exec — goes over one
// connection: each later call takes the one the call before it left.
func TestProbeReconcileExecShareOneConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &testenv.Listener{Listener: ln}
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
	if n := cl.Accepted(); n != 1 {
		t.Errorf("%d connections accepted, want 1", n)
	}
	// The spare is gone once used: a second Exec dials its own.
	if _, err := b.Exec(ctx, &backend.Request{Workspace: t.TempDir(), Shell: "true", Network: allowAll, Secrets: denySecrets}); err != nil {
		t.Fatal(err)
	}
	if n := cl.Accepted(); n != 2 {
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

// requests is how many requests of action the server has answered, from
// its metrics.
func requests(t *testing.T, ts *testServer, action string) int {
	t.Helper()
	resp, err := http.Get("http://" + ts.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("pulse_server_requests_total{action=%q} ", action)
	for _, line := range strings.Split(string(body), "\n") {
		if n, ok := strings.CutPrefix(line, prefix); ok {
			v, err := strconv.Atoi(n)
			if err != nil {
				t.Fatalf("metrics line %q", line)
			}
			return v
		}
	}
	return 0
}

// A small workspace travels with the submission to a server that takes it
// there (one request less); one of a MiB or more is still uploaded first,
// and so is every workspace to a server without the feature.
func TestWorkspaceTravelsWithSubmit(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "in.txt"), []byte("small\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out buffer
	if res, err := execShell(t, b, ws, "cat in.txt", &out, nil); err != nil || res.ExitCode != 0 || out.String() != "small\n" {
		t.Fatalf("Exec: %v %+v %q", err, res, out.String())
	}
	if n := requests(t, ts, protocol.ActionUpload); n != 0 {
		t.Errorf("%d uploads for a small workspace, want 0", n)
	}

	big := make([]byte, progressUploadBytes+1)
	rand.Read(big) // incompressible
	if err := os.WriteFile(filepath.Join(ws, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	out = buffer{}
	if res, err := execShell(t, b, ws, "cat in.txt; wc -c <big.bin", &out, nil); err != nil || res.ExitCode != 0 || out.String() != fmt.Sprintf("small\n%d\n", len(big)) {
		t.Fatalf("Exec: %v %+v %q", err, res, out.String())
	}
	if n := requests(t, ts, protocol.ActionUpload); n != 1 {
		t.Errorf("%d uploads after a large workspace, want 1", n)
	}

	old := newBackend(t, ts.url)
	old.mu.Lock()
	delete(old.server.features, protocol.FeatureWorkspace)
	old.mu.Unlock()
	os.Remove(filepath.Join(ws, "big.bin"))
	out = buffer{}
	if res, err := execShell(t, old, ws, "cat in.txt", &out, nil); err != nil || res.ExitCode != 0 || out.String() != "small\n" {
		t.Fatalf("Exec without the feature: %v %+v %q", err, res, out.String())
	}
	if n := requests(t, ts, protocol.ActionUpload); n != 2 {
		t.Errorf("%d uploads after one to a server without the feature, want 2", n)
	}
}

// The server answers the capabilities with the upgrade
// (protocol.HeaderCapabilities): a CLI process's Probe and Exec ask it
// nothing else first, and what the header says is what the action says.
func TestCapabilitiesComeWithTheUpgrade(t *testing.T) {
	ts := startServer(t)
	b := newBackend(t, ts.url)
	ctx := context.Background()
	if err := b.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := b.Exec(ctx, &backend.Request{Workspace: t.TempDir(), Shell: "true", Network: allowAll, Secrets: denySecrets})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec: %v %+v", err, res)
	}
	if n := requests(t, ts, protocol.ActionCapabilities); n != 0 {
		t.Errorf("%d capabilities requests; want none, the upgrade answered them", n)
	}
	l, err := b.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if l.caps == nil {
		t.Fatal("the upgrade brought no capabilities")
	}
	asked, err := l.call(ctx, protocol.ActionCapabilities, &protocol.Empty{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The action's answer echoes its request id; the header's has none.
	asked.Reply.RequestID = nil
	got, _ := json.Marshal(l.caps)
	want, _ := json.Marshal(asked.Reply)
	if string(got) != string(want) {
		t.Errorf("header's answer\n%s\nthe action's\n%s", got, want)
	}
}

// A server whose header cannot be read costs the round trip, not the
// connection: the client asks with the action.
func TestMalformedCapabilitiesHeaderFallsBack(t *testing.T) {
	var asked atomic.Int32
	url := fakeServerUpgrading(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(protocol.HeaderCapabilities) != protocol.CapabilitiesAsk {
			t.Errorf("upgrade without %s: %q", protocol.HeaderCapabilities, r.Header.Get(protocol.HeaderCapabilities))
		}
		w.Header().Set(protocol.HeaderCapabilities, "not base64!")
	}, func(ctx context.Context, ws *websocket.Conn, action string, p map[string]any) {
		if action == protocol.ActionCapabilities {
			asked.Add(1)
			send(ctx, ws, protocol.TypeResponse, map[string]any{"status": protocol.StatusCapabilities, "request_id": p["request_id"], "capabilities": hostCaps})
		}
	})
	b := mustNew(t, WithURL(url), WithToken("t"))
	if err := probe(b); err != nil {
		t.Fatal(err)
	}
	if asked.Load() != 1 {
		t.Errorf("%d capabilities requests after a malformed header; want 1", asked.Load())
	}
	if c := b.Capabilities(); c.Network[policy.NetworkAllowAll] != policy.Strong {
		t.Errorf("capabilities %+v; want the action's answer", c)
	}
}
