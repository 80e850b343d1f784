package bridge

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Tunnel joins c to target through the HTTP proxy on the Unix socket
// sock: it asks the proxy for a CONNECT to target and, once the proxy
// answers 200, copies both ways as ToUnix does. A refusal, or a proxy
// that cannot be reached or does not answer in time, closes c: the
// command sees a reset, never a route around the proxy.
func Tunnel(c net.Conn, sock, target string) {
	defer c.Close()
	u, err := net.Dial("unix", sock)
	if err != nil {
		return
	}
	defer u.Close()
	_ = u.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(u, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		return
	}
	br := bufio.NewReader(u)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	_ = u.SetDeadline(time.Time{})
	join(c, u, br)
}

// join copies c to u and r (what is read from u) to c, half-closing each
// direction as it ends, until both are done.
func join(c, u net.Conn, r io.Reader) {
	done := make(chan struct{})
	go func() {
		io.Copy(u, c)
		closeWrite(u)
		close(done)
	}()
	io.Copy(c, r)
	closeWrite(c)
	<-done
}
