package server

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/protocol"
)

// attachBoxlessWorker attaches a worker that makes no boxes, as one
// that predates them says at Hello (no isolation), and keeps it attached
// until the test ends. It is a bare stream, not a pulse-worker: a worker
// of this build boxes wherever the machine lets it.
func (rh *relayHarness) attachBoxlessWorker(t *testing.T, id string, capacity uint32) {
	t.Helper()
	cc, err := grpc.NewClient(rh.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+workerToken))
	t.Cleanup(cancel)
	st, err := sandboxv1.NewSandboxWorkerClient(cc).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Hello{Hello: &sandboxv1.Hello{
		SandboxId: id, CapacityMax: capacity, Capabilities: []string{"bash"}}}}); err != nil {
		t.Fatal(err)
	}
	rh.waitWorkers(t, 1)
}

// A relay whose workers make no boxes refuses a policy they cannot
// enforce, says how to allow the fleet, and takes one execution at a time
// from each of them, whatever capacity they claim.
func TestRelayRefusalSaysHowToAllowTheFleet(t *testing.T) {
	rh := startRelay(t)
	rh.attachBoxlessWorker(t, "refusal-worker", 4)
	if _, capacity, _ := rh.relay.Workers(); capacity != 1 {
		t.Errorf("a worker without boxes counts for %d executions at once, want 1", capacity)
	}
	c := rh.dial(tokenA)
	r := c.submit("deny-net", "true", map[string]any{"network": map[string]any{"mode": "deny-all"}})
	if r.Type != protocol.TypeError || r.str("code") != protocol.CodeUnsupported {
		t.Fatalf("deny-all network on the relay: %s", r.raw)
	}
	if msg := r.str("message"); !strings.Contains(msg, "--policy examples/fleet-policy.yaml") || !strings.Contains(msg, "box") {
		t.Fatalf("the refusal does not say why and how to allow the fleet: %q", msg)
	}
}
