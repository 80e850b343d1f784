//go:build linux

package gvisor

import (
	"context"
	"errors"
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
	get := func(p backend.Process, port int) string {
		t.Helper()
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
