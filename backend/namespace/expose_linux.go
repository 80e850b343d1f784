package namespace

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// Expose reaches a port inside a sandbox with a network of its own
// through the sandbox's init, which lives in that network: the backend
// asks on a socket pair the init got at its start (nsinit.DialFd), the init
// connects to 127.0.0.1:PORT from inside and hands the connected socket
// back (SCM_RIGHTS). A socket keeps the network namespace it was made in,
// so the backend then uses it as any other connection. Entering the
// namespace from the backend instead (setns) takes CAP_SYS_ADMIN in the
// caller's own user namespace, which an unprivileged caller does not
// have; a user namespace cannot be joined by a multithreaded process.
// So one way works for every caller.
//
// Protocol, one SOCK_SEQPACKET message each way: "SEQ PORT" asks; "SEQ
// ok" with the socket, or "SEQ error TEXT", answers. SEQ pairs a reply
// with its request, so that the reply to a request whose caller gave up
// (its ctx ended) is dropped, never taken for the next one's.

// newDialPair makes the socket pair: the init's end, and the backend's.
func newDialPair() (child *os.File, parent *initDialer, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("dial socket pair: %w", err)
	}
	pf := os.NewFile(uintptr(fds[0]), "dial")
	c, err := net.FileConn(pf)
	pf.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("dial socket pair: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		unix.Close(fds[1])
		return nil, nil, errors.New("dial socket pair: not a unix socket")
	}
	return os.NewFile(uintptr(fds[1]), "dial"), &initDialer{c: uc}, nil
}

// initDialer is the backend's end: one request at a time.
type initDialer struct {
	mu  sync.Mutex
	c   *net.UnixConn
	seq uint64
}

// close ends the pair; a dial in flight fails.
func (d *initDialer) close() {
	if d != nil {
		d.c.Close()
	}
}

// dial asks the init for a connection to 127.0.0.1:port of its network.
func (d *initDialer) dial(ctx context.Context, port int) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	seq := strconv.FormatUint(d.seq, 10)
	deadline := time.Now().Add(30 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = d.c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = d.c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := d.c.Write([]byte(seq + " " + strconv.Itoa(port))); err != nil {
		return nil, d.failed(ctx, err)
	}
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := d.c.ReadMsgUnix(buf, oob)
		if err != nil {
			return nil, d.failed(ctx, err)
		}
		if n == 0 {
			return nil, backend.ErrProcessDone // the init is gone
		}
		f := receivedFile(oob[:oobn])
		rseq, rest, _ := strings.Cut(string(buf[:n]), " ")
		if rseq != seq {
			if f != nil {
				f.Close() // the late answer to a request given up
			}
			continue
		}
		if rest != "ok" || f == nil {
			if f != nil {
				f.Close()
			}
			return nil, fmt.Errorf("namespace: expose: in the sandbox: %s", strings.TrimPrefix(rest, "error "))
		}
		conn, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("namespace: expose: %w", err)
		}
		return conn, nil
	}
}

func (d *initDialer) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("namespace: expose: %w", ctx.Err())
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("namespace: expose: the sandbox's init did not answer: %w", err)
	}
	return backend.ErrProcessDone // the pair is closed: the sandbox ended
}

// receivedFile is the descriptor an SCM_RIGHTS message carried, if any.
func receivedFile(oob []byte) *os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var f *os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if f == nil {
				f = os.NewFile(uintptr(fd), "conn")
			} else {
				unix.Close(fd)
			}
		}
	}
	return f
}
