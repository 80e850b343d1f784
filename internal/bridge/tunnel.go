package bridge

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"time"
)

// Tunnel joins c to target through the HTTP proxy on the Unix socket
// sock: it asks the proxy for a CONNECT to target and, once the proxy
// answers 200, copies both ways as ToUnix does. A refusal, or a proxy
// that cannot be reached or does not answer in time, closes c: the
// command sees a reset, never a route around the proxy.
func Tunnel(c io.ReadWriteCloser, sock, target string) {
	defer c.Close()
	u, err := dialUnix(sock)
	if err != nil {
		return
	}
	defer u.Close()
	_ = u.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(u, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		return
	}
	br := bufio.NewReader(u)
	if !connectEstablished(br) {
		return
	}
	_ = u.SetDeadline(time.Time{})
	join(c, u, br)
}

// maxConnectReply bounds the proxy's answer to a CONNECT (status line and
// header); a longer one is refused. The proxy's own is one line.
const maxConnectReply = 64 << 10

// connectEstablished reads the proxy's answer to a CONNECT up to the end
// of its header and reports whether it is a 200 of HTTP/1.0 or 1.1. What
// follows the header stays in br: it is the tunnel's first bytes (a 2xx
// answer to CONNECT has no content, whatever its header says). Read by
// hand rather than with net/http, which the namespace backend's sandbox
// init (a caller of Tunnel) would otherwise link, and pay the package
// initialisation of, at every sandbox start.
func connectEstablished(br *bufio.Reader) bool {
	total := 0
	line := func() (string, bool) {
		var b []byte
		for {
			chunk, err := br.ReadSlice('\n')
			total += len(chunk)
			if total > maxConnectReply {
				return "", false
			}
			b = append(b, chunk...)
			if err == nil {
				return strings.TrimRight(string(b), "\r\n"), true
			}
			if err != bufio.ErrBufferFull {
				return "", false
			}
		}
	}
	status, ok := line()
	if !ok {
		return false
	}
	proto, rest, _ := strings.Cut(status, " ")
	code, _, _ := strings.Cut(rest, " ")
	if (proto != "HTTP/1.1" && proto != "HTTP/1.0") || code != "200" {
		return false
	}
	for {
		h, ok := line()
		if !ok {
			return false
		}
		if h == "" {
			return true
		}
	}
}
