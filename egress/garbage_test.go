package egress

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pulse-agent/pulse/internal/testenv"
)

// TestRefusedGarbageIsAuditedAndExplained: whatever a connection sends
// that the proxy cannot serve (SOCKS4, a malformed SOCKS5 or HTTP
// request, a head cut short) is refused with an Event that says why, and
// the client gets an answer it can read where its protocol has one.
func TestRefusedGarbageIsAuditedAndExplained(t *testing.T) {
	w := newWorld(t)
	for _, tc := range []struct {
		name, send string
		// halfClose shuts the client's write side after sending.
		halfClose bool
		method    string
		host      string
		port      int
		answer    func([]byte) bool
	}{
		{name: "SOCKS4", send: "\x04\x01\x00\x50\x7f\x00\x00\x01user\x00", method: "SOCKS4", host: "127.0.0.1", port: 80,
			answer: func(b []byte) bool { return len(b) == 8 && b[0] == 0 && b[1] == 91 }},
		{name: "SOCKS4a", send: "\x04\x01\x01\xbb\x00\x00\x00\x01\x00evil.test\x00", method: "SOCKS4", host: "evil.test", port: 443,
			answer: func(b []byte) bool { return len(b) == 8 && b[0] == 0 && b[1] == 91 }},
		{name: "SOCKS4 cut short", send: "\x04\x01\x00", halfClose: true, method: "SOCKS4",
			answer: func(b []byte) bool { return len(b) == 8 && b[1] == 91 }},
		{name: "SOCKS5 malformed request", send: "\x05\x01\x00\x05\x01\x07\x01\x7f\x00\x00\x01\x00\x50", method: "SOCKS5",
			answer: func(b []byte) bool { return len(b) == 12 && bytes.Equal(b[:3], []byte{5, 0, 5}) && b[3] != 0 }},
		{name: "SOCKS5 no methods", send: "\x05\x00", method: "SOCKS5",
			answer: func(b []byte) bool { return bytes.Equal(b, []byte{5, 0xff}) }},
		{name: "HTTP garbage", send: "HELLO THERE\r\n\r\n", method: "HTTP", answer: isBadRequest},
		{name: "HTTP garbage, one long line", send: "X" + strings.Repeat("y", 60<<10) + "\r\n\r\n", method: "HTTP", answer: isBadRequest},
		{name: "HTTP head cut short", send: "GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127", halfClose: true, method: "HTTP", answer: isBadRequest},
		{name: "HTTP head too large", send: "GET http://127.0.0.1/ HTTP/1.1\r\nX: " + strings.Repeat("a", 70<<10), method: "HTTP", answer: isBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.mu.Lock()
			w.events = nil
			w.mu.Unlock()
			c, err := net.Dial("tcp", w.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, tc.send)
			if tc.halfClose {
				c.(*net.TCPConn).CloseWrite()
			}
			b, _ := io.ReadAll(c)
			if !tc.answer(b) {
				t.Errorf("answer %q", b)
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
			// Nothing a client sends is kept beyond a short reason, so a
			// flood of garbage grows nothing but the audit log.
			if len(ev.Reason) > 200 {
				t.Errorf("reason of %d bytes: %.300q", len(ev.Reason), ev.Reason)
			}
			if ev.Allowed || ev.Reason == "" || ev.Method != tc.method || ev.Host != tc.host || ev.Port != tc.port {
				t.Errorf("event %+v, want a refusal of %s %s:%d with a reason", ev, tc.method, tc.host, tc.port)
			}
		})
	}
}

func isBadRequest(b []byte) bool {
	s := string(b)
	return strings.HasPrefix(s, "HTTP/1.1 400 ") && strings.Contains(s, "\r\n"+DeniedHeader+": denied\r\n") &&
		strings.Contains(s, "\r\n\r\npulse egress: refused ")
}
