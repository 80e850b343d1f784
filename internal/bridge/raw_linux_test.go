package bridge

import (
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A connection accepted by the raw listener is bridged to a Unix socket
// dialled raw: bytes cross both ways and each side sees the other's
// half-close, as through package net.
func TestRawListenerBridgesToUnix(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				c.Write(append([]byte("echo:"), b...))
			}()
		}
	}()
	l, err := ListenLoopback("127.0.0.1:0")
	if err == nil {
		l.Close()
		t.Fatal("port 0 accepted; a relay must name its port")
	}
	// A free port: what the kernel gives a net listener, closed again.
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := tl.Addr().String()
	tl.Close()
	if l, err = ListenLoopback(addr); err != nil {
		t.Fatal(err)
	}
	go l.Serve(func(c io.ReadWriteCloser) { ToUnix(c, sock) })
	for i := range 3 { // more than one connection on one listener
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("ping"))
		c.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != "echo:ping" {
			t.Fatalf("connection %d: got %q, %v; want %q", i, got, err, "echo:ping")
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("dialled a closed listener")
	}
	for _, bad := range []string{"0.0.0.0:3128", "127.0.0.1", "127.0.0.1:x", "[::1]:3128", "127.0.0.1:70000"} {
		if l, err := ListenLoopback(bad); err == nil {
			l.Close()
			t.Errorf("ListenLoopback(%q) accepted", bad)
		}
	}
}

// The sandbox inits link this package: on Linux it must not pull in
// package net (cgo where cgo is on, and its start-up).
func TestLinksNoNet(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command to list the package's dependencies")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/pulse-agent/pulse/internal/bridge").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "net" || p == "runtime/cgo" {
			t.Errorf("bridge links %s", p)
		}
	}
}
