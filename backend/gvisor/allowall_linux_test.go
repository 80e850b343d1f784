package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/policy"
)

// Network allow-all gives the command the host's network, as on
// namespace: it reaches a listener on the host's loopback (which
// deny-all hides, TestEscapeProbes), in a sandbox of its own, while
// everything else holds: its writes are captured, the host's files are
// not written, and a deny-all command after it still runs on the warm
// sandbox and still cannot reach the listener.
func TestAllowAllReachesTheHostNetwork(t *testing.T) {
	b := newBackend(t)
	dial := fmt.Sprintf("(exec 3<>/dev/tcp/127.0.0.1/%d && cat <&3) 2>/dev/null; echo done > out", hostListener(t))
	run := func(mode policy.NetworkMode) (string, *backend.Result) {
		t.Helper()
		var out bytes.Buffer
		ws := t.TempDir()
		res, err := b.Exec(context.Background(), &backend.Request{Workspace: ws, Shell: dial,
			Network: policy.NetworkPolicy{Mode: mode}, Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if _, err := os.Stat(filepath.Join(ws, "out")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the command wrote the workspace itself", mode)
		}
		return out.String(), res
	}
	out, res := run(policy.NetworkAllowAll)
	if out != "host-listener\n" {
		t.Errorf("allow-all: the command did not reach the host's loopback: %q", out)
	}
	if len(res.Overlay.Files) != 1 || res.Overlay.Files[0].Path != "out" {
		t.Errorf("allow-all: overlay %+v, want out", res.Overlay)
	}
	out, _ = run(policy.NetworkDenyAll)
	if out != "" {
		t.Errorf("deny-all after allow-all reached the host's loopback: %q", out)
	}
	// A terminal with allow-all: the one runsc makes (TestTTYCold).
	var tout bytes.Buffer
	res, err := b.Exec(context.Background(), &backend.Request{Workspace: t.TempDir(), Shell: "[ -t 1 ] && echo on-a-terminal",
		Network: policy.NetworkPolicy{Mode: policy.NetworkAllowAll}, TTY: &backend.TTY{Rows: 24, Cols: 80}, Stdout: &tout})
	if err != nil || res.ExitCode != 0 || tout.String() != "on-a-terminal\r\n" {
		t.Errorf("a terminal with allow-all: %v %+v %q", err, res, tout.String())
	}
}

// hostListener listens on the host's loopback until the test ends and
// says "host-listener" to every connection; it returns the port.
func hostListener(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host-listener\n"))
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}
