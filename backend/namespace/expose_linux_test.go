package namespace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// exposeHelper starts an HTTP server (busybox httpd) in a deny-all
// sandbox, reaches it through DialPort and prints what it served; also
// what a port nobody listens on gives.
func exposeHelper(args []string) error {
	b, err := New()
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Probe(context.Background()); err != nil {
		fmt.Println("PROBE", err)
		return nil
	}
	got, err := exposeRoundTrip(b, args[0])
	fmt.Printf("SERVED %q\n", got)
	return err
}

func init() { helpers["expose"] = exposeHelper }

// exposeRoundTrip is the test itself, for any caller: it returns the
// page served from inside, and an error for anything that went wrong.
func exposeRoundTrip(b *Backend, ws string) (string, error) {
	ctx := context.Background()
	p, err := b.Start(ctx, &backend.Request{Workspace: ws, Network: policy.DenyAllNetwork(),
		Shell:  `echo hello-from-inside > index.html; exec busybox httpd -f -p 127.0.0.1:8000 -h .`,
		Stdout: io.Discard, Stderr: io.Discard, Limits: policyTimeout(time.Minute)})
	if err != nil {
		return "", err
	}
	defer p.Kill()
	if _, err := p.DialPort(ctx, 8001); err == nil || errors.Is(err, backend.ErrUnsupported) {
		return "", fmt.Errorf("a port nobody listens on: %v, want a connection refused", err)
	}
	var conn io.ReadWriteCloser
	for i := 0; ; i++ {
		conn, err = p.DialPort(ctx, 8000)
		if err == nil {
			break
		}
		if errors.Is(err, backend.ErrUnsupported) || errors.Is(err, backend.ErrProcessDone) || i == 500 {
			return "", fmt.Errorf("dial: %w", err)
		}
		time.Sleep(10 * time.Millisecond) // until httpd listens
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /index.html HTTP/1.0\r\n\r\n"); err != nil {
		return "", err
	}
	b2, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	if !strings.Contains(string(b2), "hello-from-inside") {
		return string(b2), errors.New("the page did not come back")
	}
	return "hello-from-inside", nil
}

func needBusybox(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox (httpd) not installed")
	}
}

// TestDialPortPrivateNetwork: a server in a sandbox with a network of its
// own (deny-all) is reached through DialPort, for this test's caller.
func TestDialPortPrivateNetwork(t *testing.T) {
	needBusybox(t)
	b := newBackend(t)
	if got, err := exposeRoundTrip(b, t.TempDir()); err != nil {
		t.Fatalf("%v (served %q)", err, got)
	}
}

// TestDialPortUnprivileged: the same for an unprivileged caller (uid
// 65534), which cannot enter the sandbox's network namespace itself.
func TestDialPortUnprivileged(t *testing.T) {
	needBusybox(t)
	s := runUnprivileged(t, "expose")
	if !strings.Contains(s, `SERVED "hello-from-inside"`) || strings.Contains(s, "refused:") {
		t.Fatalf("unprivileged expose: %q", s)
	}
}
