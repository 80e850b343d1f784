package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/flock"
)

// ErrRunning: another daemon serves the name already.
var ErrRunning = errors.New("daemon: another daemon serves this name")

// Handler runs one request's command with the client's stdin, stdout and
// stderr and returns its exit code. ctx is cancelled when the client
// forwards a signal (its cause is then a Signaled) or goes away
// (ErrClientGone).
type Handler func(ctx context.Context, req *Request, stdio [3]*os.File) int

// Signaled is the cause of a request's cancellation by a signal the
// client forwarded.
type Signaled int

func (s Signaled) Error() string { return fmt.Sprintf("daemon: the client got signal %d", int(s)) }

// ErrClientGone is the cause of a request's cancellation when its client
// went away.
var ErrClientGone = errors.New("daemon: the client went away")

// Server is a daemon: it serves the requests of clients in its own
// directory and environment (Name) on a socket in Dir.
type Server struct {
	// Dir is the socket directory (Dir()); Name the daemon's name
	// (Name(cwd, environ)).
	Dir, Name string
	// Idle is how long the daemon waits without a request before it
	// exits.
	Idle time.Duration
	// Handle runs a command.
	Handle Handler
	// Logger gets a line for each connection; nil: discard.
	Logger *slog.Logger

	served   atomic.Int64
	mu       sync.Mutex
	running  int
	last     time.Time
	stop     chan struct{}
	stopping bool
}

// Serve runs the daemon until it has been idle for s.Idle, ctx ends, a
// client asks it to stop, or its socket is removed or replaced. It
// returns ErrRunning when another daemon serves the name.
func (s *Server) Serve(ctx context.Context) error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	stop := s.stopped()
	if err := makeDir(s.Dir); err != nil {
		return err
	}
	sock := socketPath(s.Dir, s.Name)
	if sock == "" {
		return fmt.Errorf("daemon: socket path in %s too long", s.Dir)
	}
	lock, err := os.OpenFile(filepath.Join(s.Dir, s.Name+".lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if flock.TryLock(lock) != nil {
		return ErrRunning
	}
	// The socket is bound and listening under a name of its own, then
	// renamed over the real one (whatever is there is a dead daemon's: the
	// lock is ours). Between bind and listen a socket refuses connections,
	// which a client takes for no daemon; so the name appears only once it
	// accepts. The temporary name is shorter than the real one, so it fits
	// wherever socketPath does.
	tmp := filepath.Join(s.Dir, "."+s.Name)
	_ = os.Remove(tmp)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	if err != nil {
		return err
	}
	ln.SetUnlinkOnClose(false)
	// The directory is the user's alone already; the socket too, should
	// the directory's mode ever be widened.
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, sock); err != nil {
		ln.Close()
		os.Remove(tmp)
		return err
	}
	st, err := os.Stat(sock)
	if err != nil {
		ln.Close()
		return err
	}
	s.Logger.Info("daemon: listening", slog.String("socket", sock), slog.Int("pid", os.Getpid()))
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	s.last = time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.serve(ctx, c)
			}()
		}
	}()
	tick := time.NewTicker(250 * time.Millisecond)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-stop:
			break loop
		case <-tick.C:
		}
		if now, err := os.Stat(sock); err != nil || !os.SameFile(now, st) {
			break // removed or replaced: the directory is not ours any more
		}
		s.mu.Lock()
		idle := s.running == 0 && time.Since(s.last) > s.Idle
		s.mu.Unlock()
		if idle {
			break
		}
	}
	tick.Stop()
	ln.Close()
	if now, err := os.Stat(sock); err == nil && os.SameFile(now, st) {
		os.Remove(sock)
	}
	// Commands running still are cancelled by a stop or a signal, and
	// finish (then reply) on idle, which only comes with none running.
	cancel()
	wg.Wait()
	// Last, and only while it is still this daemon's.
	if held, err := lock.Stat(); err == nil {
		if now, err := os.Stat(lock.Name()); err == nil && os.SameFile(now, held) {
			os.Remove(lock.Name())
		}
	}
	s.Logger.Info("daemon: exiting", slog.Int64("served", s.served.Load()))
	return nil
}

// Stop makes Serve return; a Serve not started yet returns at once.
func (s *Server) Stop() {
	ch := s.stopped()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopping {
		s.stopping = true
		close(ch)
	}
}

func (s *Server) stopped() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop == nil {
		s.stop = make(chan struct{})
	}
	return s.stop
}

// requestBufs holds the buffers requests are read into: one of
// MaxMessage bytes per connection, made afresh, was a large allocation
// the runtime zeroes and the kernel faults in, a tenth of the daemon's
// CPU for a `true` (perf, 40 requests).
var requestBufs = sync.Pool{New: func() any {
	b := make([]byte, MaxMessage+1)
	return &b
}}

func (s *Server) serve(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var pid int
	var perr error
	if err := raw.Control(func(fd uintptr) { pid, perr = checkPeer(int(fd), "") }); err != nil || perr != nil {
		s.Logger.Warn("daemon: refused a client", slog.Any("err", perr))
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	bp := requestBufs.Get().(*[]byte)
	buf := *bp
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		requestBufs.Put(bp)
		return
	}
	var files []*os.File
	if oobn > 0 {
		fds, err := parseRights(oob[:oobn])
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "client"))
		}
		if err != nil {
			closeAll(files)
			return
		}
	}
	defer closeAll(files)
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		requestBufs.Put(bp)
		s.reply(c, Reply{Refused: "request too large"})
		return
	}
	req, err := DecodeRequest(buf[:n])
	// DecodeRequest keeps nothing of buf (json copies what it decodes).
	requestBufs.Put(bp)
	if err != nil {
		s.reply(c, Reply{Refused: err.Error()})
		return
	}
	// Only requests from the daemon's own directory and environment:
	// anything the command resolves against them resolves as it would
	// in the client.
	if why := s.foreign(req); why != "" {
		s.Logger.Info("daemon: refused a request", slog.Int("client", pid), slog.String("why", why))
		s.reply(c, Reply{Refused: why})
		return
	}
	switch req.Op {
	case OpStatus:
		s.mu.Lock()
		st := &Status{Pid: os.Getpid(), Dir: req.Dir, Served: s.served.Load(), Running: s.running, Idle: s.Idle.String()}
		s.mu.Unlock()
		s.reply(c, Reply{Status: st})
		return
	case OpStop:
		s.reply(c, Reply{Accepted: true, Pid: os.Getpid()})
		s.Stop()
		return
	}
	if len(files) != 3 {
		s.reply(c, Reply{Refused: fmt.Sprintf("%d descriptors, want 3", len(files))})
		return
	}
	s.mu.Lock()
	s.running++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running--
		s.last = time.Now()
		s.mu.Unlock()
	}()
	if !s.reply(c, Reply{Accepted: true, Pid: os.Getpid()}) {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	replied := make(chan struct{})
	defer close(replied)
	rctx, cancel := context.WithCancelCause(context.WithValue(ctx, repliedKey{}, (<-chan struct{})(replied)))
	defer cancel(nil)
	go func() {
		// The client's messages: signals, until it closes (it exits,
		// or it was killed): either way the command is cancelled.
		b := make([]byte, 4096)
		for {
			n, err := c.Read(b)
			if err != nil {
				cancel(ErrClientGone)
				return
			}
			var m signalMsg
			if json.Unmarshal(b[:n], &m) == nil && m.Signal > 0 && m.Signal < 65 {
				cancel(Signaled(m.Signal))
			}
		}
	}()
	s.Logger.Info("daemon: running", slog.Int("client", pid), slog.String("command", req.Args[0]))
	t0 := time.Now()
	code := s.Handle(rctx, req, [3]*os.File(files))
	s.served.Add(1)
	s.Logger.Info("daemon: done", slog.Int("client", pid), slog.Int("exit", code), slog.Duration("took", time.Since(t0)))
	closeAll(files)
	files = nil
	s.reply(c, Reply{Exit: &code})
}

type repliedKey struct{}

// Replied returns, for the ctx a Handler is given, a channel closed once
// the client has been sent the command's exit code (or could not be):
// work a command leaves for later (starting what the next one takes)
// can wait for it instead of competing with the client's exit. Nil for
// any other ctx.
func Replied(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(repliedKey{}).(<-chan struct{})
	return ch
}

// foreign says why req is not this daemon's to serve ("" when it is).
func (s *Server) foreign(req *Request) string {
	if Name(req.Dir, req.Env) != s.Name {
		return "another directory or environment"
	}
	here, err1 := os.Stat(".")
	there, err2 := os.Stat(req.Dir)
	if err1 != nil || err2 != nil || !os.SameFile(here, there) {
		return "the directory is not the daemon's"
	}
	return ""
}

func (s *Server) reply(c *net.UnixConn, r Reply) bool {
	data, err := json.Marshal(r)
	if err != nil {
		return false
	}
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Write(data)
	_ = c.SetWriteDeadline(time.Time{})
	return err == nil
}

// parseRights returns the descriptors of SCM_RIGHTS messages, close on
// exec.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, err
		}
		for _, fd := range f {
			unix.CloseOnExec(fd)
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}
