package nsinit

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DialFd is the init's end of the dial socket pair on which the backend
// asks for connections to ports inside the sandbox's network (package
// namespace's Expose). Protocol, one SOCK_SEQPACKET message each way:
// "SEQ PORT" asks; "SEQ ok" with the connected socket (SCM_RIGHTS), or
// "SEQ error TEXT", answers.
const DialFd = 5

// serveDials is the init's side: it answers the backend's requests until
// the pair closes. It runs on a thread of its own, not the one the
// command's restrictions are set on; the connect happens in the sandbox's
// network (the init's), to its loopback only.
func serveDials(fd int) {
	buf := make([]byte, 64)
	for {
		n, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		seq, p, _ := strings.Cut(string(buf[:n]), " ")
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			_ = unix.Sendmsg(fd, []byte(seq+" error bad port"), nil, nil, 0)
			continue
		}
		s, err := connectLoopback(port)
		if err != nil {
			_ = unix.Sendmsg(fd, []byte(seq+" error "+err.Error()), nil, nil, 0)
			continue
		}
		_ = unix.Sendmsg(fd, []byte(seq+" ok"), unix.UnixRights(s), nil, 0)
		unix.Close(s)
	}
}

// connectLoopback connects a new TCP socket to 127.0.0.1:port.
func connectLoopback(port int) (int, error) {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	for {
		err = unix.Connect(s, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(s)
		return -1, fmt.Errorf("connect 127.0.0.1:%d: %w", port, err)
	}
	return s, nil
}
