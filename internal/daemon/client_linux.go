package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Client errors. Every one but ErrLost means the command did not run: the
// caller runs it itself.
var (
	// ErrNotRunning: no daemon listens for the name; Start starts one.
	ErrNotRunning = errors.New("daemon: not running")
	// ErrUnavailable: the daemon could not be asked (a socket path too
	// long, a request too large, a daemon that did not answer).
	ErrUnavailable = errors.New("daemon: unavailable")
	// ErrRefused: the daemon refused the request.
	ErrRefused = errors.New("daemon: refused")
	// ErrLost: the daemon accepted the request and ended before it said
	// how the command ended. The command may have run in part.
	ErrLost = errors.New("the pulse daemon that ran the command ended before the command did")
)

// replyWait bounds how long a client waits for a daemon to accept its
// request: longer, and it runs the command itself.
const replyWait = 5 * time.Second

// Run hands req (an OpRun) to the daemon name in dir, with stdio as the
// command's stdin, stdout and stderr, and waits for its exit code. Each
// signal from signals is forwarded to the command; on the first, the
// code returned is 128+N, as a shell reports a command a signal ended; a
// second one returns at once (the caller then exits, which cancels the
// command in the daemon).
func Run(dir, name string, req *Request, stdio [3]*os.File, signals <-chan os.Signal) (int, error) {
	return RunFor("/proc/self/exe", dir, name, req, stdio, signals)
}

// RunFor is Run from a client that is not the daemon's executable exe
// (a front end that only hands commands over).
func RunFor(exe, dir, name string, req *Request, stdio [3]*os.File, signals <-chan os.Signal) (int, error) {
	c, pid, err := dial(exe, dir, name)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	req.V, req.Op = Version, OpRun
	data, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	if len(data) > MaxMessage {
		return 0, fmt.Errorf("%w: request of %d bytes", ErrUnavailable, len(data))
	}
	fds := make([]int, 3)
	for i, f := range stdio {
		if f == nil {
			return 0, fmt.Errorf("%w: descriptor %d missing", ErrUnavailable, i)
		}
		fds[i] = int(f.Fd())
	}
	_ = c.SetDeadline(time.Now().Add(replyWait))
	if _, _, err := c.WriteMsgUnix(data, unix.UnixRights(fds...), nil); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	rep, err := readReply(c)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !rep.Accepted {
		return 0, fmt.Errorf("%w: %s", ErrRefused, rep.Refused)
	}
	_ = c.SetDeadline(time.Time{})
	replies := make(chan Reply, 1)
	errs := make(chan error, 1)
	go func() {
		r, err := readReply(c)
		if err != nil {
			errs <- err
			return
		}
		replies <- r
	}()
	got := 0
	for {
		select {
		case s := <-signals:
			n := int(s.(syscall.Signal))
			if got != 0 {
				return 128 + got, nil
			}
			got = n
			msg, _ := json.Marshal(signalMsg{Signal: n})
			_, _ = c.Write(msg)
		case r := <-replies:
			if r.Exit == nil {
				return 0, fmt.Errorf("%w (pid %d): it sent no exit code", ErrLost, pid)
			}
			if got != 0 {
				return 128 + got, nil
			}
			return *r.Exit, nil
		case err := <-errs:
			if got != 0 {
				return 128 + got, fmt.Errorf("%w (pid %d): %w", ErrLost, pid, err)
			}
			return 0, fmt.Errorf("%w (pid %d): %w", ErrLost, pid, err)
		}
	}
}

// Ask sends an OpStatus or OpStop to the daemon name in dir and returns
// its reply.
func Ask(dir, name string, req *Request) (*Reply, error) {
	c, _, err := dial("/proc/self/exe", dir, name)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	req.V = Version
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(replyWait))
	if _, err := c.Write(data); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	rep, err := readReply(c)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if rep.Refused != "" {
		return nil, fmt.Errorf("%w: %s", ErrRefused, rep.Refused)
	}
	return &rep, nil
}

// dial connects to the daemon name in dir and checks it is this user's,
// running the executable exe.
func dial(exe, dir, name string) (*net.UnixConn, int, error) {
	if name == "" {
		return nil, 0, fmt.Errorf("%w: no name", ErrUnavailable)
	}
	if err := CheckDir(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, 0, ErrNotRunning
		}
		return nil, 0, err
	}
	sock := socketPath(dir, name)
	if sock == "" {
		return nil, 0, fmt.Errorf("%w: socket path too long", ErrUnavailable)
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
			return nil, 0, ErrNotRunning
		}
		return nil, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	raw, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, 0, err
	}
	var pid int
	var perr error
	if err := raw.Control(func(fd uintptr) { pid, perr = checkPeer(int(fd), exe) }); err != nil || perr != nil {
		c.Close()
		return nil, 0, errors.Join(err, perr)
	}
	return c, pid, nil
}

func readReply(c *net.UnixConn) (Reply, error) {
	buf := make([]byte, 64<<10)
	n, err := c.Read(buf)
	if err != nil {
		return Reply{}, err
	}
	var r Reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return Reply{}, err
	}
	return r, nil
}

// Start starts this executable with args as a daemon, detached (its own
// session, stdio on /dev/null), in this process's working directory and
// environment, which make its name. It does not wait: a daemon already
// serving the name keeps it, and the new one exits.
func Start(args ...string) error {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	cmd := exec.Command("/proc/self/exe", args...)
	// The environment and directory as they are: both make the name,
	// and exec.Cmd would set PWD were Env left nil.
	cmd.Env = os.Environ()
	if wd, err := os.Getwd(); err == nil {
		cmd.Dir = wd
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Not waited for: it outlives this process.
	return cmd.Process.Release()
}
