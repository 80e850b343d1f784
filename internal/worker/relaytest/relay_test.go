package relaytest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
	sandboxv1 "github.com/pulse-agent/pulse/internal/wire/sandbox/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func dial(t *testing.T, r *Relay) sandboxv1.SandboxWorkerClient {
	t.Helper()
	cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return sandboxv1.NewSandboxWorkerClient(cc)
}

func attachWith(t *testing.T, c sandboxv1.SandboxWorkerClient, auth string, first *sandboxv1.WorkerFrame) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if auth != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", auth)
	}
	st, err := c.Attach(ctx)
	if err != nil {
		return err
	}
	// Send reports io.EOF once the server has ended the call; the
	// status comes from Recv either way.
	_ = st.Send(first)
	_, err = st.Recv()
	return err
}

func TestRejectsBadTokens(t *testing.T) {
	r, err := Start("right")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := dial(t, r)
	hello := &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Hello{Hello: &sandboxv1.Hello{SandboxId: "x"}}}
	for _, auth := range []string{"", "Bearer wrong", "right", "bearer right", "Bearer right "} {
		if err := attachWith(t, c, auth, hello); status.Code(err) != codes.Unauthenticated {
			t.Errorf("authorization %q: err = %v, want Unauthenticated", auth, err)
		}
	}
	if n := r.Attaches(); n != 0 {
		t.Errorf("%d attaches accepted", n)
	}
	if n := r.Rejected(); n != 5 {
		t.Errorf("%d attaches rejected, want 5", n)
	}
}

func TestRequiresHelloFirst(t *testing.T) {
	r, err := Start("tok")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	hb := &sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Heartbeat{Heartbeat: &sandboxv1.Heartbeat{}}}
	if err := attachWith(t, dial(t, r), "Bearer tok", hb); status.Code(err) != codes.InvalidArgument {
		t.Errorf("err = %v, want InvalidArgument", err)
	}
}

func TestRoutesFramesByReqID(t *testing.T) {
	r, err := Start("tok")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok"), 10*time.Second)
	defer cancel()
	st, err := dial(t, r).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&sandboxv1.WorkerFrame{Frame: &sandboxv1.WorkerFrame_Hello{Hello: &sandboxv1.Hello{SandboxId: "w1"}}}); err != nil {
		t.Fatal(err)
	}
	conn, err := r.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if conn.Hello().GetSandboxId() != "w1" {
		t.Errorf("hello = %v", conn.Hello())
	}
	call, err := conn.Exec(&sandboxv1.Exec{ReqId: 9, Command: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(&sandboxv1.Exec{ReqId: 9, Command: "x"}); err != ErrPending {
		t.Errorf("second pending exec: err = %v, want ErrPending", err)
	}
	got, err := st.Recv()
	if err != nil || got.GetExec().GetReqId() != 9 {
		t.Fatalf("worker got %v, %v", got, err)
	}
	for _, f := range []*sandboxv1.WorkerFrame{
		{Frame: &sandboxv1.WorkerFrame_Chunk{Chunk: &sandboxv1.Chunk{ReqId: 9, Stream: sandboxv1.Stream_STDERR, Data: []byte("e")}}},
		{Frame: &sandboxv1.WorkerFrame_Chunk{Chunk: &sandboxv1.Chunk{ReqId: 9, Data: []byte("o")}}},
		{Frame: &sandboxv1.WorkerFrame_End{End: &sandboxv1.End{ReqId: 9, ExitCode: 3}}},
		{Frame: &sandboxv1.WorkerFrame_End{End: &sandboxv1.End{ReqId: 9, ExitCode: 4}}}, // a second terminal: stray
	} {
		if err := st.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	res, err := call.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "o" || string(res.Stderr) != "e" || res.End.GetExitCode() != 3 {
		t.Errorf("result = %+v", res)
	}
	// Waited for, then checked below (the wait's own verdict is not).
	_ = testenv.Poll(10*time.Second, func() error {
		if len(conn.Stray()) == 0 {
			return errors.New("no stray frame yet")
		}
		return nil
	})
	if s := conn.Stray(); len(s) != 1 || s[0].GetEnd().GetExitCode() != 4 {
		t.Errorf("stray = %v, want the second End", s)
	}
	conn.Drop()
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("after Drop the worker got %v, want Unavailable", err)
	}
}
