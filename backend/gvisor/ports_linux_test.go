//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// TestDialPort: the host reaches a server a background command runs on
// its loopback (busybox httpd) through DialPort; a port nobody listens on
// is refused, and so is a port another command listens on (each command
// has a loopback of its own).
func TestDialPort(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox (httpd) not installed")
	}
	b := newWarm(t)
	ctx := context.Background()
	start := func(port string) backend.Process {
		p, err := b.Start(ctx, &backend.Request{Workspace: t.TempDir(), Network: policy.DenyAllNetwork(),
			Shell:  `echo hello-from-` + port + ` > index.html; exec busybox httpd -f -p 127.0.0.1:` + port + ` -h .`,
			Stdout: io.Discard, Stderr: io.Discard, Limits: policy.ResourceLimits{Timeout: 2 * time.Minute}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Kill() })
		return p
	}
	get := func(p backend.Process, port int) string { return getPage(t, p, port) }
	a := start("8000")
	if got := get(a, 8000); !strings.Contains(got, "hello-from-8000") {
		t.Fatalf("page %q", got)
	}
	if _, err := a.DialPort(ctx, 8001); err == nil || errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("a port nobody listens on: %v, want refused", err)
	}
	c := start("8002")
	if got := get(c, 8002); !strings.Contains(got, "hello-from-8002") {
		t.Fatalf("page %q", got)
	}
	if _, err := c.DialPort(ctx, 8000); err == nil {
		t.Error("a command's DialPort reached another command's port")
	}
	if _, err := a.DialPort(ctx, 0); !errors.Is(err, backend.ErrInvalidRequest) {
		t.Errorf("port 0: %v, want ErrInvalidRequest", err)
	}
	_ = a.Kill()
	if _, err := a.DialPort(ctx, 8000); !errors.Is(err, backend.ErrProcessDone) {
		t.Errorf("after the end: %v, want ErrProcessDone", err)
	}
}

// getPage gets /index.html from the server p runs on port, through
// DialPort, trying again until it listens.
func getPage(t *testing.T, p backend.Process, port int) string {
	t.Helper()
	ctx := context.Background()
	var conn net.Conn
	var err error
	for i := 0; ; i++ {
		if conn, err = p.DialPort(ctx, port); err == nil {
			break
		}
		if errors.Is(err, backend.ErrUnsupported) || errors.Is(err, backend.ErrProcessDone) || i == 1000 {
			t.Fatalf("dial %d: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond) // until httpd listens
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /index.html HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	return string(page)
}

// TestDialPortCold: an allow-all command (cold, on the host's network)
// serves on the host's loopback, and DialPort reaches it there; a cold
// command in a network stack of its own cannot be reached (no runtime in
// its sandbox), which DialPort says with ErrUnsupported.
func TestDialPortCold(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox (httpd) not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // for the command's httpd
	b := newWarm(t)
	ctx := context.Background()
	p, err := b.Start(ctx, &backend.Request{Workspace: t.TempDir(), Network: policy.NetworkPolicy{Mode: policy.NetworkAllowAll},
		Shell:  fmt.Sprintf(`echo hello-cold > index.html; exec busybox httpd -f -p 127.0.0.1:%d -h .`, port),
		Stdout: io.Discard, Stderr: io.Discard, Limits: policy.ResourceLimits{Timeout: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if page := getPage(t, p, port); !strings.Contains(page, "hello-cold") {
		t.Fatalf("page %q", page)
	}
	if _, err := p.DialPort(ctx, 0); !errors.Is(err, backend.ErrInvalidRequest) {
		t.Errorf("port 0: %v, want ErrInvalidRequest", err)
	}

	c := newBackend(t, WithCold())
	q, err := c.Start(ctx, &backend.Request{Workspace: t.TempDir(), Network: policy.DenyAllNetwork(), Shell: "sleep 60",
		Limits: policy.ResourceLimits{Timeout: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Kill()
	if _, err := q.DialPort(ctx, port); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("a cold deny-all command's port: %v, want ErrUnsupported", err)
	}
}
