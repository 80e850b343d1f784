package bridge

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sockFile is a raw stream socket served by the runtime's poller.
type sockFile struct{ *os.File }

// CloseWrite shuts the socket down for writing: the peer reads EOF.
func (s sockFile) CloseWrite() error {
	rc, err := s.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	return serr
}

// dialUnix connects to the Unix socket sock.
func dialUnix(sock string) (conn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, &os.SyscallError{Syscall: "socket", Err: err}
	}
	c, err := connect(fd, &unix.SockaddrUnix{Name: sock}, sock)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", sock, err)
	}
	return c, nil
}

// Connect connects the stream socket fd, made blocking, to sa and
// returns it as a connection the runtime's poller serves, which can be
// half-closed (CloseWrite) and given deadlines; name names it in errors.
// On failure fd is closed. The connect itself blocks (a non-blocking one
// would fail with EAGAIN on a full backlog instead of waiting its turn);
// the socket is made non-blocking after it, so that os.NewFile gives it
// to the poller.
func Connect(fd int, sa unix.Sockaddr, name string) (io.ReadWriteCloser, error) {
	c, err := connect(fd, sa, name)
	if err != nil {
		return nil, err // not a nil sockFile in an interface
	}
	return c, nil
}

func connect(fd int, sa unix.Sockaddr, name string) (sockFile, error) {
	var err error
	for {
		err = unix.Connect(fd, sa)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		unix.Close(fd)
		return sockFile{}, err
	}
	return sockFile{os.NewFile(uintptr(fd), name)}, nil
}

// Listener is a TCP listener on a loopback address of the calling
// thread's network namespace, made with raw sockets.
type Listener struct{ f *os.File }

// ListenLoopback listens on addr, which must be 127.0.0.1:PORT. The
// socket is close-on-exec: a command started later does not inherit it.
func ListenLoopback(addr string) (*Listener, error) {
	host, port, ok := strings.Cut(addr, ":")
	p, err := strconv.Atoi(port)
	if !ok || host != "127.0.0.1" || err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("bridge: listen address %q: want 127.0.0.1:PORT", addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, &os.SyscallError{Syscall: "socket", Err: err}
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bridge: listen on %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bridge: listen on %s: %w", addr, err)
	}
	return &Listener{f: os.NewFile(uintptr(fd), addr)}, nil
}

// Accept waits for the next connection (on the poller, not a blocked
// thread) and returns it close-on-exec.
func (l *Listener) Accept() (io.ReadWriteCloser, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var aerr error
	err = rc.Read(func(fd uintptr) bool {
		nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		// EAGAIN: wait until readable. ECONNABORTED: a connection reset
		// in the queue, try the next one.
		return !errors.Is(aerr, unix.EAGAIN) && !errors.Is(aerr, unix.ECONNABORTED) && !errors.Is(aerr, unix.EINTR)
	})
	if err != nil {
		return nil, err
	}
	if aerr != nil {
		return nil, &os.SyscallError{Syscall: "accept4", Err: aerr}
	}
	return sockFile{os.NewFile(uintptr(nfd), "conn")}, nil
}

// Serve accepts connections until the listener is closed and runs fn on
// each, in a goroutine of its own.
func (l *Listener) Serve(fn func(io.ReadWriteCloser)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go fn(c)
	}
}

// Close stops the listener.
func (l *Listener) Close() error { return l.f.Close() }
