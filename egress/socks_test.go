package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// socksRequest is a SOCKS5 greeting (no authentication) and a request
// for cmd to host (an IPv4 or IPv6 address, else a name) and port.
func socksRequest(cmd byte, host string, port int) []byte {
	b := []byte{5, 1, 0, 5, cmd, 0}
	switch ip := net.ParseIP(host); {
	case ip != nil && ip.To4() != nil:
		b = append(append(b, 1), ip.To4()...)
	case ip != nil:
		b = append(append(b, 4), ip.To16()...)
	default:
		b = append(append(b, 3, byte(len(host))), host...)
	}
	return binary.BigEndian.AppendUint16(b, uint16(port))
}

// socks opens a SOCKS5 CONNECT and returns the connection with the reply
// code (the connection is nil unless the code is 0).
func (w *world) socks(host string, port int) (net.Conn, byte) {
	w.t.Helper()
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		w.t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(socksRequest(1, host, port))
	var r [12]byte
	if _, err := io.ReadFull(c, r[:]); err != nil {
		c.Close()
		w.t.Fatalf("SOCKS5 %s:%d: no reply: %v", host, port, err)
	}
	if !bytes.Equal(r[:2], []byte{5, 0}) || r[2] != 5 {
		w.t.Fatalf("SOCKS5 %s:%d: reply % x", host, port, r)
	}
	if r[3] != 0 {
		c.Close()
		return nil, r[3]
	}
	return c, 0
}

func TestSOCKS5(t *testing.T) {
	w := newWorld(t)
	get := func(c net.Conn, host string) string {
		defer c.Close()
		fmt.Fprintf(c, "GET /s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	// An address, and a name the proxy resolves itself.
	for _, host := range []string{"127.0.0.1", "allowed.test"} {
		c, code := w.socks(host, w.httpPort)
		if code != 0 {
			t.Fatalf("%s: refused with %d", host, code)
		}
		if got := get(c, fmt.Sprintf("%s:%d", host, w.httpPort)); !strings.Contains(got, "hello") {
			t.Errorf("%s: %q", host, got)
		}
		if ev := w.waitEvent(func(e Event) bool { return e.Method == "SOCKS5" && e.Host == host }); !ev.Allowed || ev.Received == 0 {
			t.Errorf("%s: event %+v", host, ev)
		}
	}
	for _, tc := range []struct {
		host string
		port int
	}{
		{"127.0.0.1", w.evilPort},   // unlisted port of a listed address
		{"evil.test", w.httpPort},   // unlisted name: never looked up
		{"rebind.test", w.httpPort}, // listed name resolving to denied addresses
		{"::1", w.httpPort},         // IPv6 literal not listed
		{"127.0.0.1/x", w.httpPort}, // malformed name
		{"10.0.0.1", 443},           // private range
	} {
		before := w.lookups.Load()
		if c, code := w.socks(tc.host, tc.port); code == 0 {
			c.Close()
			t.Errorf("%s:%d: allowed", tc.host, tc.port)
		}
		if tc.host == "evil.test" && w.lookups.Load() != before {
			t.Error("an unlisted name was looked up")
		}
	}
	if ev := w.waitEvent(func(e Event) bool { return e.Method == "SOCKS5" && e.Host == "rebind.test" }); ev.Allowed || ev.Reason == "" {
		t.Errorf("rebind event %+v", ev)
	}
	// A tunnel that relays to a second target is cut, as for CONNECT.
	c, code := w.socks("127.0.0.1", w.httpPort)
	if code != 0 {
		t.Fatalf("refused with %d", code)
	}
	if got := get(c, fmt.Sprintf("evil.test:%d", w.httpPort)); strings.Contains(got, "hello") {
		t.Errorf("a request naming another host went through: %q", got)
	}
}

// UDP ASSOCIATE and BIND are refused with "command not supported", and a
// client offering only authentication gets "no acceptable method".
func TestSOCKS5RefusesOtherCommands(t *testing.T) {
	w := newWorld(t)
	for _, cmd := range []byte{2, 3} {
		answer := w.raw(string(socksRequest(cmd, "127.0.0.1", w.httpPort)))
		if want := string([]byte{5, 0, 5, 7}); !strings.HasPrefix(answer, want) {
			t.Errorf("command %d: % x", cmd, answer)
		}
	}
	if answer := w.raw("\x05\x01\x02"); answer != "\x05\xff" {
		t.Errorf("authentication only: % x", answer)
	}
}

// A secret's bound host reached over SOCKS5 is TLS-terminated with the
// sandbox CA and gets the real value; the placeholder goes nowhere else.
func TestSOCKS5Injection(t *testing.T) {
	w := newWorld(t)
	c, code := w.socks("example.com", w.httpsPort)
	if code != 0 {
		t.Fatalf("refused with %d", code)
	}
	defer c.Close()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(w.ca.CertPEM())
	tc := tls.Client(c, &tls.Config{ServerName: "example.com", RootCAs: roots})
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: example.com:%d\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", w.httpsPort, w.placeholder)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), "authorized") {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
}

// FuzzSOCKS: whatever a client sends, a handshake readSOCKS accepts names
// a well-formed host and a port in range.
func FuzzSOCKS(f *testing.F) {
	f.Add(socksRequest(1, "127.0.0.1", 80))
	f.Add(socksRequest(1, "::1", 443))
	f.Add(socksRequest(1, "allowed.test", 1))
	f.Add(socksRequest(3, "127.0.0.1", 53))
	f.Add([]byte("\x05\x01\x00\x05\x01\x00\x03\x0aa:b/c@d%ef\x00\x50"))
	f.Add([]byte("\x05\x02\x02\x00\x05\x01\x00\x09"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		host, port, err := readSOCKS(bufio.NewReader(bytes.NewReader(data)), &out)
		if err != nil {
			if !errors.Is(err, errSOCKS) {
				t.Fatalf("error %v does not wrap errSOCKS", err)
			}
			return
		}
		if host == "" || port < 1 || port > 65535 || strings.ContainsAny(host, " /\\@%?#\x00[]") ||
			(strings.Contains(host, ":") && !isIP(host)) || host != strings.ToLower(host) {
			t.Fatalf("accepted %q port %d", host, port)
		}
	})
}
