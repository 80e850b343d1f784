package sandbox

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend/host"
	"github.com/pulse-agent/pulse/internal/testenv"
	"github.com/pulse-agent/pulse/policy"
	"github.com/pulse-agent/pulse/secrets"
)

// hostBackend is a host backend closed with t.
func hostBackend(t *testing.T) *host.Backend {
	t.Helper()
	hb, err := host.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hb.Close() })
	return hb
}

// remoteEnv is an environment naming the pulse-server at addr and token.
func remoteEnv(addr, token string) func(string) string {
	return func(k string) string {
		switch k {
		case "PULSE_REMOTE_URL":
			return "ws://" + addr + "/"
		case "PULSE_REMOTE_TOKEN":
			return token
		}
		return ""
	}
}

// The remote backend that PULSE_REMOTE_URL names is probed while New does
// the rest of its work, and selection takes that probe: New and a
// command use one connection, the probe's.
func TestRemoteProbedAheadIsTheOneSelected(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &testenv.Listener{Listener: ln}
	startRemoteOn(t, cl, hostBackend(t), 0, policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, secrets.AllowAllSecrets())
	before := cl.Accepted()
	env := remoteEnv(ln.Addr().String(), "sandbox-remote-test-token")
	pol, err := policy.Parse([]byte("version: 1\ndefaults: {shell: allow, network: allow, secrets: allow}\nnetwork: {mode: allow-all}\n"))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := New(context.Background(), t.TempDir(), withGetenv(env), WithPolicy(pol), WithSecretPolicy(secrets.AllowAllSecrets()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	if sb.Backend().Name() != "remote" {
		t.Fatalf("backend %s selected, passed over %q", sb.Backend().Name(), sb.PassedOver())
	}
	if res, err := sb.Execute(context.Background(), Command{Shell: "echo ran"}); err != nil || res.ExitCode != 0 || res.Stdout != "ran\n" {
		t.Fatalf("Execute: %v %+v", err, res)
	}
	if n := cl.Accepted() - before; n != 1 {
		t.Errorf("%d connections for New and one command, want 1", n)
	}
}

// A probe started ahead that selection does not take (New failed first)
// is ended: its connection is closed, not left open.
func TestUntakenProbeAheadIsEnded(t *testing.T) {
	// A listener that accepts and never answers: the probe waits on its
	// HTTP upgrade until it is ended.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	o, err := buildOptions([]Option{withGetenv(remoteEnv(ln.Addr().String(), "dev"))})
	if err != nil {
		t.Fatal(err)
	}
	a := probeAhead(context.Background(), &o)
	if a == nil {
		t.Fatal("no probe ahead with PULSE_REMOTE_URL set")
	}
	c := testenv.Recv(t, accepted, time.Minute, "the probe's connection")
	defer c.Close()
	a.discard()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the probe's connection is still open after discard: %v", err)
	}

	// Nothing is probed ahead when selection would not try the remote
	// first.
	for _, opt := range []Option{WithBackendName("host"), WithImage("alpine:3")} {
		o, err := buildOptions([]Option{withGetenv(remoteEnv("127.0.0.1:1", "dev")), opt})
		if err != nil {
			t.Fatal(err)
		}
		if a := probeAhead(context.Background(), &o); a != nil {
			a.discard()
			t.Errorf("a probe ahead with backend %q, image %q", o.backendName, o.image)
		}
	}
}
