package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestEveryRequestInAPlainTunnelNamesItsHost: a server shared by many
// names serves whichever a request's Host header names, so in a plain
// HTTP tunnel every request's Host is checked, not only the first's: a
// later request on the kept-alive tunnel (read one by one, or pipelined
// with the first) that names another host is cut, and the tunnel's Event
// says why.
func TestEveryRequestInAPlainTunnelNamesItsHost(t *testing.T) {
	w := newWorld(t)
	target := fmt.Sprintf("127.0.0.1:%d", w.httpPort)
	good := "GET /one HTTP/1.1\r\nHost: " + target + "\r\n\r\n"
	// The first request alone, cut the same way (servers skip empty
	// lines before a request line, and some take any method's case).
	for name, first := range map[string]string{
		"empty lines first":         "\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"lower-case method first":   "get / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"two spaces in the request": "GET  / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, br, answer := w.connect(target)
			if c == nil {
				t.Fatal(answer)
			}
			defer c.Close()
			io.WriteString(c, first)
			if b, _ := io.ReadAll(br); strings.Contains(string(b), "evil") {
				t.Errorf("answered: %q", b)
			}
		})
	}
	for name, second := range map[string]string{
		"another Host":       "GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"lower-case method":  "get /two HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"two Host headers":   "GET /two HTTP/1.1\r\nHost: " + target + "\r\nHost: evil.test\r\n\r\n",
		"absolute URI":       "GET http://evil.test/two HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"CONNECT":            "CONNECT evil.test:80 HTTP/1.1\r\nHost: evil.test:80\r\n\r\n",
		"bare-LF, Host case": "GET /two HTTP/1.1\nhOsT: evil.test\n\n",
	} {
		for _, pipelined := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pipelined=%v", name, pipelined), func(t *testing.T) {
				w.mu.Lock()
				w.events = nil
				w.mu.Unlock()
				c, br, answer := w.connect(target)
				if c == nil {
					t.Fatal(answer)
				}
				defer c.Close()
				var got strings.Builder
				if pipelined {
					io.WriteString(c, good+second)
				} else {
					io.WriteString(c, good)
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					got.Write(b)
					if string(b) != "hello "+target+" /one" {
						t.Fatalf("first request answered %q", b)
					}
					io.WriteString(c, second)
				}
				rest, _ := io.ReadAll(br)
				got.Write(rest)
				if strings.Contains(got.String(), "evil") || strings.Contains(got.String(), "/two") {
					t.Errorf("the second request was answered: %q", got.String())
				}
				var ev Event
				_ = testenv.Poll(5*time.Second, func() error {
					w.mu.Lock()
					defer w.mu.Unlock()
					if len(w.events) == 0 {
						return errors.New("no event")
					}
					ev = w.events[len(w.events)-1]
					return nil
				})
				if ev.Method != "CONNECT" || ev.Allowed || ev.Reason == "" {
					t.Errorf("tunnel event %+v, want a refusal with a reason", ev)
				}
			})
		}
	}
}

// TestPlainTunnelKeepsAliveAndUpgrades: requests that all name the
// tunnel's host go through one kept-alive tunnel, bodies and all, and a
// websocket upgrade the server accepts leaves the rest of the tunnel to
// the protocol it switched to.
func TestPlainTunnelKeepsAliveAndUpgrades(t *testing.T) {
	// A server that switches to an echo protocol after a 101.
	ws, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	wsTarget := ws.Addr().String()
	w := newWorld(t, wsTarget)
	target := fmt.Sprintf("127.0.0.1:%d", w.httpPort)
	c, br, answer := w.connect(target)
	if c == nil {
		t.Fatal(answer)
	}
	defer c.Close()
	io.WriteString(c, "POST /a HTTP/1.1\r\nHost: "+target+"\r\nContent-Length: 5\r\n\r\nGET /xGET /b HTTP/1.1\r\nHost: "+target+"\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
	for _, want := range []string{"hello " + target + " /a", "hello " + target + " /b"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != want {
			t.Errorf("answered %q, want %q", b, want)
		}
	}
	c.Close()

	// An upgrade the server does not accept leaves the tunnel HTTP, read
	// request by request.
	c, br, answer = w.connect(target)
	if c == nil {
		t.Fatal(answer)
	}
	defer c.Close()
	io.WriteString(c, "GET /a HTTP/1.1\r\nHost: "+target+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("upgrade refused by the server: %v %v", resp, err)
	} else {
		io.Copy(io.Discard, resp.Body)
	}
	io.WriteString(c, "GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if b, _ := io.ReadAll(br); strings.Contains(string(b), "evil") {
		t.Errorf("a request after a refused upgrade was answered: %q", b)
	}

	go func() {
		s, err := ws.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		sb := make([]byte, 4096)
		n, _ := s.Read(sb)
		if !strings.Contains(string(sb[:n]), "Upgrade: websocket") {
			return
		}
		io.WriteString(s, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(s, s)
	}()
	c, br, answer = w.connect(wsTarget)
	if c == nil {
		t.Fatal(answer)
	}
	defer c.Close()
	io.WriteString(c, "GET /chat HTTP/1.1\r\nHost: "+wsTarget+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "\x81\x05frame")
	b := make([]byte, 7)
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "\x81\x05frame" {
		t.Errorf("after the upgrade: %q %v", b, err)
	}
}
