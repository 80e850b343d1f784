package bridge

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeProxy answers each CONNECT on a Unix socket: 200 and an echo of
// what follows for allowed, 403 and a close for anything else; it
// records the targets asked for.
func fakeProxy(t *testing.T, allowed string) (sock string, targets chan string) {
	sock = filepath.Join(t.TempDir(), "proxy.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	targets = make(chan string, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				targets <- req.Method + " " + req.Host
				if req.Host != allowed {
					io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
					return
				}
				io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
				b, _ := io.ReadAll(br)
				c.Write(append([]byte("echo:"), b...))
			}()
		}
	}()
	return sock, targets
}

// A connection is tunnelled as a CONNECT to its target; a refused
// CONNECT closes the connection with nothing relayed.
func TestTunnelConnectsThroughTheProxy(t *testing.T) {
	sock, targets := fakeProxy(t, "127.0.0.1:4000")
	for _, tc := range []struct{ target, want string }{
		{"127.0.0.1:4000", "echo:ping"},
		{"127.0.0.1:5000", ""},
	} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// The listener is closed by the goroutine once it has accepted:
		// closing it here, right after the dial, could reset a connection
		// still in the accept queue, and then nothing reaches the proxy.
		go func() {
			defer l.Close()
			if b, err := l.Accept(); err == nil {
				Tunnel(b, sock, tc.target)
			}
		}()
		a, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		a.Write([]byte("ping"))
		closeWrite(a)
		got, _ := io.ReadAll(a)
		a.Close()
		if string(got) != tc.want {
			t.Errorf("%s: read %q, want %q", tc.target, got, tc.want)
		}
		select {
		case asked := <-targets:
			if asked != "CONNECT "+tc.target {
				t.Errorf("proxy was asked %q, want CONNECT %s", asked, tc.target)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s: the proxy was never asked", tc.target)
		}
	}
}

// The proxy's answer: only a 200 of HTTP/1.x opens the tunnel, the
// header is read to its end whatever it holds, and the bytes after it are
// the tunnel's.
func TestConnectEstablished(t *testing.T) {
	long := "X-Long: " + strings.Repeat("a", maxConnectReply) + "\r\n"
	for _, tc := range []struct {
		reply string
		ok    bool
	}{
		{"HTTP/1.1 200 Connection established\r\n\r\nrest", true},
		{"HTTP/1.0 200 OK\r\nContent-Length: 4\r\nX-A: b\r\n\r\nrest", true},
		{"HTTP/1.1 200\nVia: p\n\nrest", true},
		{"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", false},
		{"HTTP/1.1 2000 Odd\r\n\r\nrest", false},
		{"HTTP/2.0 200 OK\r\n\r\nrest", false},
		{"ICY 200 OK\r\n\r\nrest", false},
		{"HTTP/1.1 200 OK\r\n", false},                     // the header never ends
		{"HTTP/1.1 200 OK\r\n" + long + "\r\nrest", false}, // too long
	} {
		br := bufio.NewReader(strings.NewReader(tc.reply))
		if got := connectEstablished(br); got != tc.ok {
			t.Errorf("%.40q: established %v, want %v", tc.reply, got, tc.ok)
			continue
		}
		if tc.ok {
			if rest, _ := io.ReadAll(br); string(rest) != "rest" {
				t.Errorf("%.40q: left %q for the tunnel, want %q", tc.reply, rest, "rest")
			}
		}
	}
}
