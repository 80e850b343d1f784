package bridge

import (
	"io"
	"net"
	"path/filepath"
	"testing"
)

// Bytes cross both ways through a real TCP pair and a real Unix socket,
// and each side sees EOF when the other half-closes.
func TestToUnixCopiesBothWaysAndHalfCloses(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() { // an echo server that answers after its input ends
		c, err := ul.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		c.Write(append([]byte("echo:"), b...))
	}()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go func() {
		c, err := tl.Accept()
		if err == nil {
			ToUnix(c, sock)
		}
	}()
	c, err := net.Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("ping"))
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "echo:ping" {
		t.Fatalf("got %q, %v; want %q", got, err, "echo:ping")
	}
}

// Without the proxy's socket the connection is closed, not left open.
func TestToUnixClosesWhenTheSocketIsMissing(t *testing.T) {
	a, b := net.Pipe()
	go ToUnix(a, filepath.Join(t.TempDir(), "missing.sock"))
	if _, err := b.Read(make([]byte, 1)); err == nil {
		t.Fatal("read succeeded on a bridge with no socket")
	}
}
