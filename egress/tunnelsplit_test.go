package egress

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// TestPlainTunnelRequestSentInPiecesNamesItsHost: whether a tunnel's
// requests are read one by one must not hang on how the command's first
// bytes were cut into writes. A request whose first write is only the
// start of its request line ("G", then "ET / HTTP/1.1 ...") naming
// another host is refused, and so is a later request on the tunnel.
func TestPlainTunnelRequestSentInPiecesNamesItsHost(t *testing.T) {
	w := newWorld(t)
	target := fmt.Sprintf("127.0.0.1:%d", w.httpPort)
	for name, pieces := range map[string][]string{
		"first request":  {"G", "ET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
		"second request": {"GE", "T /one HTTP/1.1\r\nHost: " + target + "\r\n\r\nGET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
		"empty line":     {"\r\n", "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
	} {
		t.Run(name, func(t *testing.T) {
			c, br, answer := w.connect(target)
			if c == nil {
				t.Fatal(answer)
			}
			defer c.Close()
			for i, p := range pieces {
				if i > 0 {
					time.Sleep(100 * time.Millisecond) // the proxy has read the first piece alone
				}
				io.WriteString(c, p)
			}
			if b, _ := io.ReadAll(br); strings.Contains(string(b), "evil") {
				t.Errorf("a request naming another host was answered: %q", b)
			}
		})
	}
}
