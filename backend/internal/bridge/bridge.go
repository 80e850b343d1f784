// Package bridge joins a connection accepted inside a sandbox's network
// namespace to the egress proxy's Unix socket outside it. The namespace
// and Docker backends both bridge this way; the copy lives here once.
package bridge

import (
	"net"
)

// ToUnix copies c both ways to a new connection to the Unix socket sock,
// half-closing each direction as it ends so request/response protocols
// see EOF, and closes both when both directions are done. A socket that
// cannot be dialled closes c at once: the command sees a reset, never a
// route around the proxy.
func ToUnix(c net.Conn, sock string) {
	defer c.Close()
	u, err := net.Dial("unix", sock)
	if err != nil {
		return
	}
	defer u.Close()
	join(c, u, u)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}
