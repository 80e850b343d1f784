// Package bridge joins a connection accepted inside a sandbox's network
// namespace to the egress proxy's Unix socket outside it. The namespace
// init, the in-box runtime and the Docker and gVisor backends all bridge
// this way; the copy lives here once.
//
// On Linux the package does not link package net: it runs in the
// sandbox inits (the namespace init and the in-box runtime, one static
// program), which must not need cgo whatever builds them, and whose
// start-up should not pay net's initialisation. It dials and listens
// with raw sockets wrapped in *os.File, which the runtime's poller
// serves as it serves net's connections.
package bridge

import (
	"io"
	"time"
)

// conn is a connection this package dials: a stream it can half-close
// and put a deadline on (*net.UnixConn, or a raw socket as *os.File).
type conn interface {
	io.ReadWriteCloser
	CloseWrite() error
	SetDeadline(time.Time) error
}

// ToUnix copies c both ways to a new connection to the Unix socket sock,
// half-closing each direction as it ends so request/response protocols
// see EOF, and closes both when both directions are done. A socket that
// cannot be dialled closes c at once: the command sees a reset, never a
// route around the proxy.
func ToUnix(c io.ReadWriteCloser, sock string) {
	defer c.Close()
	u, err := dialUnix(sock)
	if err != nil {
		return
	}
	defer u.Close()
	join(c, u, u)
}

// closeWrite half-closes c where it can be (a TCP or Unix connection, a
// raw socket); anything else is closed when both directions are done.
func closeWrite(c io.Writer) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// join copies c to u and r (what is read from u) to c, half-closing each
// direction as it ends, until both are done.
func join(c io.ReadWriter, u io.Writer, r io.Reader) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(u, c)
		closeWrite(u)
		close(done)
	}()
	_, _ = io.Copy(c, r)
	closeWrite(c)
	<-done
}
