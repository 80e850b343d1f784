package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

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
//
// The client is all of a front end's work, so it is kept to what the
// exchange needs: the socket in an os.File rather than a net.Conn, the
// request written by appendRequest rather than by reflection, and the
// exit read in the calling goroutine; only the forwarding of signals has
// a goroutine of its own, started once the daemon has accepted. Each
// goroutine more was a thread more, or a wake-up, in a process that
// lives a few milliseconds (docs/benchmarks.md).
func RunFor(exe, dir, name string, req *Request, stdio [3]*os.File, signals <-chan os.Signal) (int, error) {
	c, pid, err := dial(exe, dir, name)
	if err != nil {
		return 0, err
	}
	defer c.close()
	req.V, req.Op = Version, OpRun
	data := appendRequest(make([]byte, 0, 4096), req)
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
	if err := c.setTimeout(replyWait); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := c.send(data, unix.UnixRights(fds...)); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	rep, err := c.readReply()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !rep.Accepted {
		return 0, fmt.Errorf("%w: %s", ErrRefused, rep.Refused)
	}
	if err := c.setTimeout(0); err != nil {
		return 0, fmt.Errorf("%w (pid %d): %w", ErrLost, pid, err)
	}
	// got is the first signal forwarded; twice is set by a second one,
	// which also shuts the socket's reading side, so that the read
	// below returns at once.
	var got atomic.Int32
	var twice atomic.Bool
	if signals != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case s := <-signals:
					n := int32(s.(syscall.Signal))
					if got.Load() != 0 {
						twice.Store(true)
						c.shutRead()
						return
					}
					got.Store(n)
					_ = c.send(fmt.Appendf(nil, `{"signal":%d}`, n), nil)
				case <-done:
					return
				}
			}
		}()
	}
	r, err := c.readReply()
	n := int(got.Load())
	switch {
	case twice.Load():
		return 128 + n, nil
	case err != nil && n != 0:
		return 128 + n, fmt.Errorf("%w (pid %d): %w", ErrLost, pid, err)
	case err != nil:
		return 0, fmt.Errorf("%w (pid %d): %w", ErrLost, pid, err)
	case r.Exit == nil:
		return 0, fmt.Errorf("%w (pid %d): it sent no exit code", ErrLost, pid)
	case n != 0:
		return 128 + n, nil
	}
	return *r.Exit, nil
}

// Ask sends an OpStatus or OpStop to the daemon name in dir and returns
// its reply.
func Ask(dir, name string, req *Request) (*Reply, error) {
	c, _, err := dial("/proc/self/exe", dir, name)
	if err != nil {
		return nil, err
	}
	defer c.close()
	req.V = Version
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if err := c.setTimeout(replyWait); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := c.send(data, nil); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	rep, err := c.readReply()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if rep.Refused != "" {
		return nil, fmt.Errorf("%w: %s", ErrRefused, rep.Refused)
	}
	return &rep, nil
}

// conn is a client's connection to a daemon: the socket's descriptor in
// an os.File, which waits in the runtime's poller (see RunFor).
type conn struct{ f *os.File }

func (c *conn) close() { c.f.Close() }

// shutRead ends the reading side: a read under way returns io.EOF. Through
// the file, so that a connection closed meanwhile is left alone.
func (c *conn) shutRead() {
	if raw, err := c.f.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RD) })
	}
}

// setTimeout bounds each later send and read (0: no bound).
func (c *conn) setTimeout(d time.Duration) error {
	if d == 0 {
		return c.f.SetDeadline(time.Time{})
	}
	return c.f.SetDeadline(time.Now().Add(d))
}

// send writes one message, with oob's descriptors.
func (c *conn) send(data, oob []byte) error {
	raw, err := c.f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), data, oob, nil, 0)
		return serr != unix.EAGAIN
	})
	return errors.Join(err, serr)
}

// readReply reads and decodes one message. A daemon's reply is a few
// dozen bytes; a larger one is cut and fails to decode.
func (c *conn) readReply() (Reply, error) {
	var buf [4096]byte
	n, err := c.f.Read(buf[:])
	if err != nil {
		return Reply{}, err // io.EOF: the daemon closed the connection, or a second signal shut it
	}
	var r Reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return Reply{}, err
	}
	return r, nil
}

// dial connects to the daemon name in dir and checks it is this user's,
// running the executable exe.
func dial(exe, dir, name string) (*conn, int, error) {
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
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: sock})
		if err != unix.EINTR {
			break
		}
	}
	if err == nil {
		// Non-blocking from here: os.NewFile then waits for it in the
		// runtime's poller, where a wait leaves every processor idle
		// and Go's monitor thread asleep; a blocking read keeps one in
		// a system call, which that thread polls every 20 µs.
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
			return nil, 0, ErrNotRunning
		}
		return nil, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	c := &conn{f: os.NewFile(uintptr(fd), "daemon")}
	pid, err := checkPeer(fd, exe)
	if err != nil {
		c.close()
		return nil, 0, err
	}
	return c, pid, nil
}

// appendRequest appends r as JSON, as json.Marshal writes it
// (FuzzAppendRequest holds the two to the same bytes).
func appendRequest(b []byte, r *Request) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.V), 10)
	b = append(b, `,"op":`...)
	b = appendString(b, r.Op)
	if len(r.Args) > 0 {
		b = append(b, `,"args":`...)
		b = appendStrings(b, r.Args)
	}
	if r.Prog != "" {
		b = append(b, `,"prog":`...)
		b = appendString(b, r.Prog)
	}
	b = append(b, `,"dir":`...)
	b = appendString(b, r.Dir)
	if len(r.Env) > 0 {
		b = append(b, `,"env":`...)
		b = appendStrings(b, r.Env)
	}
	return append(b, '}')
}

func appendStrings(b []byte, list []string) []byte {
	b = append(b, '[')
	for i, s := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

// appendString appends s as a JSON string, escaped as encoding/json
// escapes it: its short escapes, \u00XX for the other control
// characters and for <, > and &, U+2028 and U+2029 escaped, and each
// byte that is not UTF-8 as U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\\' || c == '"':
				b = append(b, '\\', c)
			case c == '\b':
				b = append(b, '\\', 'b')
			case c == '\f':
				b = append(b, '\\', 'f')
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
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
