package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/relay"
	"github.com/pulse-agent/pulse/internal/testenv"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/protocol"
	"github.com/pulse-agent/pulse/secrets"
)

const workerToken = "relay-worker-token"

type relayHarness struct {
	*harness
	relay *relay.Relay
	addr  string
}

func startRelay(t *testing.T, opts ...relay.Option) *relayHarness {
	t.Helper()
	r, err := relay.New([]string{workerToken}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	r.Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	h := startServer(t, t.TempDir(), r)
	return &relayHarness{harness: h, relay: r, addr: lis.Addr().String()}
}

// startWorker runs a pulse-worker process (testproc.Worker: this test
// binary, re-executed) attached to the relay.
func (rh *relayHarness) startWorker(t *testing.T, id, token string, capacity string) *exec.Cmd {
	t.Helper()
	cmd := testenv.Command(t, "pulse-worker")
	cmd.Env = append(cmd.Env, "RELAY_ADDR="+rh.addr, "SANDBOX_ID="+id, "SANDBOX_TOKEN="+token,
		"RELAY_TLS=0", "WORKER_MAX_CONCURRENT="+capacity)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}

func (rh *relayHarness) waitWorkers(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		if live, _, _ := rh.relay.Workers(); live != n {
			return fmt.Errorf("%d workers attached, want %d", live, n)
		}
		return nil
	})
}

// End to end: a client of the WebSocket API runs commands on a real
// pulse-worker process attached over gRPC.
func TestRelayWithRealWorker(t *testing.T) {
	rh := startRelay(t, relay.WithStdinPiece(4096))
	c := rh.dial(tokenA)

	// Without a worker, a submission is refused for capacity.
	if r := c.submit("early", "true", nil); r.Type != protocol.TypeError || r.str("code") != protocol.CodeCapacity {
		t.Fatalf("submit without workers: %s", r.raw)
	}
	rh.startWorker(t, "w1", workerToken, "2")
	rh.waitWorkers(t, 1)
	if r, _ := c.do(protocol.ActionCapabilities, nil); r.str("executor") != "relay" {
		t.Fatalf("capabilities: %s", r.raw)
	}

	// Only a worker whose Hello listed every required program qualifies.
	if r := c.submit("needs-x", "true", map[string]any{"requires": []string{"bash", "no-such-program"}}); r.Type != protocol.TypeError || r.str("code") != protocol.CodeCapacity {
		t.Fatalf("submit with unmet requirement: %s", r.raw)
	}
	c.submit("needs-bash", "echo ok", map[string]any{"requires": []string{"bash"}})
	if res, _ := c.untilResult("needs-bash", nil); res.str("stdout") != "ok\n" {
		t.Fatalf("submit with met requirement: %s", res.raw)
	}

	up, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": "rel-1",
		"data": targz(t, file{"in.txt", "shipped to the worker\n"}, file{"gone.txt", "x"}, file{"sub/k", "k"})})
	if up.str("status") != protocol.StatusUploaded {
		t.Fatalf("upload: %s", up.raw)
	}
	c.submit("rel-1", `cat ../in.txt; echo "$GREETING" >&2; echo made > ../out.txt; rm ../gone.txt; exit 3`,
		map[string]any{"cwd": "sub", "env": map[string]any{"GREETING": "hi it's me"}})
	res, streams := c.untilResult("rel-1", nil)
	var stdout, stderr string
	for i, s := range streams {
		if s.num("seq") != int64(i+1) {
			t.Fatalf("seq %d at %d", s.num("seq"), i)
		}
		if s.str("stream") == "stdout" {
			stdout += s.str("data")
		} else {
			stderr += s.str("data")
		}
	}
	if stdout != "shipped to the worker\n" || stderr != "hi it's me\n" || res.num("exit_code") != 3 || res.str("termination_reason") != "exited" {
		t.Fatalf("stdout %q stderr %q result %s", stdout, stderr, res.raw)
	}
	dl, _ := c.do(protocol.ActionDownload, map[string]any{"execution_id": "rel-1"})
	files := untar(t, dl.str("data"))
	var man protocol.Manifest
	json.Unmarshal([]byte(files[protocol.ManifestName]), &man)
	if files["out.txt"] != "made\n" || len(man.Deleted) != 1 || man.Deleted[0] != "gone.txt" {
		t.Fatalf("overlay %v, manifest %+v", files, man)
	}
	if _, ok := files["in.txt"]; ok {
		t.Fatalf("unchanged file in overlay: %v", files)
	}

	// argv form, with an argument that env would take for an assignment.
	c.submit("rel-argv", []string{"printf", "%s|%s", "A=B", "it's"}, nil)
	if res, _ := c.untilResult("rel-argv", nil); res.str("stdout") != "A=B|it's" {
		t.Fatalf("argv: %s", res.raw)
	}

	// Cancel aborts the command on the worker.
	c.submit("rel-cancel", "echo started; sleep 30", nil)
	for {
		if m := c.recv(); m.Type == protocol.TypeStream {
			break
		}
	}
	r, other := c.do(protocol.ActionCancel, map[string]any{"execution_id": "rel-cancel"})
	if r.str("status") != protocol.StatusCancelled {
		t.Fatalf("cancel: %s", r.raw)
	}
	if res, _ := c.untilResult("rel-cancel", other); res.str("termination_reason") != "cancelled" || res.str("error") != protocol.StatusCancelled {
		t.Fatalf("cancelled result: %s", res.raw)
	}

	// A workspace sent in several pieces reaches the worker intact. The
	// piece size is lowered (startRelay above) so that a small workspace
	// takes many pieces; by default one piece is 2 MiB, under gRPC's 4 MiB
	// message limit.
	big := make([]byte, 64<<10)
	rand.Read(big)
	sum := sha256.Sum256(big)
	if r, _ := c.do(protocol.ActionUpload, map[string]any{"execution_id": "rel-big", "data": targz(t, file{"big.bin", string(big)})}); r.str("status") != protocol.StatusUploaded {
		t.Fatalf("upload big: %s", r.raw)
	}
	c.submit("rel-big", "sha256sum big.bin", nil)
	if res, _ := c.untilResult("rel-big", nil); !strings.HasPrefix(res.str("stdout"), hex.EncodeToString(sum[:])) {
		t.Fatalf("big workspace: %s", res.raw)
	}

	c.submit("rel-timeout", "sleep 30", map[string]any{"timeout_s": 1})
	if res, _ := c.untilResult("rel-timeout", nil); res.Payload["timed_out"] != true {
		t.Fatalf("timeout result: %s", res.raw)
	}
	if live, capacity, busy := rh.relay.Workers(); live != 1 || capacity != 2 || busy != 0 {
		t.Fatalf("workers = %d live, %d capacity, %d busy", live, capacity, busy)
	}
}

// Executions go to the least-loaded worker, and a worker that dies fails
// its in-flight executions with a clear reason.
func TestRelaySchedulingAndWorkerLoss(t *testing.T) {
	rh := startRelay(t)
	c := rh.dial(tokenA)
	w1 := rh.startWorker(t, "w1", workerToken, "1")
	rh.startWorker(t, "w2", workerToken, "1")
	rh.waitWorkers(t, 2)
	// A worker with a bad token never attaches.
	rh.startWorker(t, "intruder", "wrong-token", "1")

	c.submit("on-a", `echo up; sleep 30`, nil)
	c.submit("on-b", `echo up; sleep 30`, nil)
	for seen := 0; seen < 2; {
		if m := c.recv(); m.Type == protocol.TypeStream {
			seen++
		}
	}
	if live, capacity, busy := rh.relay.Workers(); live != 2 || capacity != 2 || busy != 2 {
		t.Fatalf("workers = %d live, %d capacity, %d busy; want both busy", live, capacity, busy)
	}
	// Both slots are taken: the next submission is refused.
	if r := c.submit("third", "true", nil); r.Type != protocol.TypeError || r.str("code") != protocol.CodeCapacity {
		t.Fatalf("third: %s", r.raw)
	}
	syscall.Kill(-w1.Process.Pid, syscall.SIGKILL)
	var lost msg
	for {
		m := c.recv()
		if m.Type == protocol.TypeResult {
			lost = m
			break
		}
	}
	if lost.num("exit_code") != -1 || !strings.Contains(lost.str("stderr"), "w1 disconnected") || lost.str("termination_reason") != "error" {
		t.Fatalf("lost execution: %s", lost.raw)
	}
	st, _ := c.do(protocol.ActionStatus, map[string]any{"execution_id": lost.str("execution_id")})
	if st.str("status") != protocol.StatusFailed {
		t.Fatalf("status of lost execution: %s", st.raw)
	}
	rh.waitWorkers(t, 1)
	other := "on-a"
	if lost.str("execution_id") == "on-a" {
		other = "on-b"
	}
	if r, _ := c.do(protocol.ActionCancel, map[string]any{"execution_id": other}); r.str("status") != protocol.StatusCancelled {
		t.Fatalf("cancel survivor: %s", r.raw)
	}
	if err := rh.relay.Available(nil); err != nil {
		t.Fatalf("survivor has no free slot: %v", err)
	}
}

// The server checks for a free slot before it accepts a submission but
// does not reserve it, so two accepted at once may race for one slot. The
// one that loses waits for the slot to free and runs, rather than fail
// UNAVAILABLE after its STARTING: here the second Exec is started while
// the only slot is taken, and must run once the first ends.
func TestRelayExecWaitsForASlotTakenFirst(t *testing.T) {
	rh := startRelay(t)
	rh.startWorker(t, "w1", workerToken, "1")
	rh.waitWorkers(t, 1)
	req := func(id, shell string) *backend.Request {
		return &backend.Request{ExecutionID: id, Workspace: t.TempDir(), Shell: shell,
			Network: policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, Secrets: secrets.Policy{Mode: secrets.AllowAll}}
	}
	first := make(chan error, 1)
	go func() {
		res, err := rh.relay.Exec(context.Background(), req("first", "sleep 1"))
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d", res.ExitCode)
		}
		first <- err
	}()
	testenv.Eventually(t, 30*time.Second, func() error {
		if _, _, busy := rh.relay.Workers(); busy != 1 {
			return fmt.Errorf("%d slots busy, want the first's", busy)
		}
		return nil
	})
	var out strings.Builder
	second := req("second", "echo second")
	second.Stdout = &out
	res, err := rh.relay.Exec(context.Background(), second)
	if err != nil {
		t.Fatalf("the second execution did not wait for the slot: %v", err)
	}
	if res.ExitCode != 0 || out.String() != "second\n" {
		t.Fatalf("second: exit %d, stdout %q", res.ExitCode, out.String())
	}
	if err := <-first; err != nil {
		t.Fatalf("first: %v", err)
	}
}

// A worker lost before an execution's command was sent to it never ran
// the command: the relay sets the execution up on another worker, and it
// ends with its outcome rather than WORKER_LOST. The first worker here
// attaches, takes the execution's first step and drops its stream.
func TestRelayWorkerLostBeforeTheCommandTriesAnother(t *testing.T) {
	rh := startRelay(t)
	cc, err := grpc.NewClient("passthrough:///"+rh.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+workerToken))
	defer cancel()
	st, err := sandboxv1.NewSandboxWorkerClient(cc).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// "a-" sorts first: with both idle (and both boxing), the relay picks
	// this one first.
	if err := st.Send(&sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Hello{Hello: &sandboxv1.Hello{SandboxId: "a-drops", CapacityMax: 1, Isolation: "namespace"}}}); err != nil {
		t.Fatal(err)
	}
	rh.waitWorkers(t, 1)
	rh.startWorker(t, "w-real", workerToken, "1")
	rh.waitWorkers(t, 2)
	dropped := make(chan string, 1)
	go func() {
		for {
			f, err := st.Recv()
			if err != nil {
				return
			}
			if ex := f.GetExec(); ex != nil {
				dropped <- ex.GetCommand()
				cancel()
				return
			}
		}
	}()
	var out strings.Builder
	res, err := rh.relay.Exec(context.Background(), &backend.Request{ExecutionID: "moved", Workspace: t.TempDir(), Shell: "echo ran",
		Stdout: &out, Network: policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, Secrets: secrets.Policy{Mode: secrets.AllowAll}})
	if err != nil {
		t.Fatalf("the execution did not move to the other worker: %v", err)
	}
	if res.ExitCode != 0 || out.String() != "ran\n" {
		t.Fatalf("exit %d, stdout %q", res.ExitCode, out.String())
	}
	select {
	case cmd := <-dropped:
		if strings.Contains(cmd, "echo ran") {
			t.Fatalf("the dropped worker was sent the command itself: %q", cmd)
		}
	default:
		t.Fatal("the first execution step never reached the worker that drops")
	}
}
