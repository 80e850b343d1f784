package boxrt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/bridge"
	"github.com/pulse-agent/pulse/internal/pty"
)

// Paths in a warm gVisor sandbox, made by the backend in its root.
const (
	// GVViews is where the host's views directory is bound: one
	// directory per running command, holding its workspace and caches.
	GVViews = "/.pulse-views"
	// GVNewRoot is the mount point of each command's own root.
	GVNewRoot = "/.pulse-root"
)

// gvSystemDirs are what a command's root takes from the sandbox's (the
// host's, read-only, with secrets masked).
var gvSystemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev"}

// runGVServe is the serve step: the warm sandbox's init. It reads frames
// on stdin and starts each request as the gvcmd step, in pid, mount,
// network and IPC namespaces of its own, so that a command sees only its
// own processes, workspace view and loopback, and all of its processes
// end with it (the namespace's init, the gvcmd step, ends when the
// command does). The
// step keeps its capabilities; commands have none.
func runGVServe(a []string) int {
	if len(a) != 0 {
		return usage()
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s gvserve: %v\n", Name, err)
		return 1
	}
	// SIGPIPE on a closed stdout would kill the server: an error is
	// enough (the host is gone).
	signal.Ignore(syscall.SIGPIPE)
	s := &gvServer{self: self, out: &lockedWriter{w: os.Stdout}, procs: map[uint32]*gvProc{}}
	if err := s.out.frame(FrameHello, 0, []byte(Identity())); err != nil {
		return 1
	}
	s.refill()
	for {
		kind, id, p, err := ReadFrame(os.Stdin)
		if err != nil {
			// The host is gone or broken: the sandbox ends with this
			// init, and every command with it.
			if !errors.Is(err, io.EOF) {
				fmt.Fprintf(os.Stderr, "%s gvserve: %v\n", Name, err)
			}
			return 0
		}
		s.handle(kind, id, p)
	}
}

type gvServer struct {
	self  string
	out   *lockedWriter
	mu    sync.Mutex
	procs map[uint32]*gvProc
	spare *gvProc // started ahead, waiting for a request
	// pending is closed when the spare being started is there; nil
	// when none is being started.
	pending chan struct{}
}

// gvProc is one gvcmd step: started ahead of its request, which it reads
// from req (fd 4); it writes how its command ended to status (fd 3), and
// reads its terminal's resizes from ctl (fd 5).
type gvProc struct {
	cmd    *exec.Cmd
	output sync.WaitGroup // the copies of stdout and stderr
	req    *os.File       // the write end
	status *os.File       // the read end
	ctlMu  sync.Mutex
	ctl    *os.File // the write end; nil once closed
	tty    bool     // the command runs on a terminal: resizes go to ctl
	view   string   // the command's view directory under GVViews
	stdin  io.WriteCloser
	queue  *inQueue
	out    *frameWriter
	errw   *frameWriter
}

// spawn starts a gvcmd step, in new pid, mount, network and IPC
// namespaces, that waits
// for its request: a command then pays for none of the step's start.
func (s *gvServer) spawn() (*gvProc, error) {
	rr, rw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		rr.Close()
		rw.Close()
		return nil, err
	}
	cr, cw, err := os.Pipe()
	if err != nil {
		rr.Close()
		rw.Close()
		sr.Close()
		sw.Close()
		return nil, err
	}
	pr := &gvProc{req: rw, status: sr, ctl: cw, out: &frameWriter{out: s.out, kind: FrameStdout}, errw: &frameWriter{out: s.out, kind: FrameStderr}}
	var closers []*os.File
	defer func() {
		for _, f := range closers {
			f.Close()
		}
	}()
	closers = append(closers, rr, sw, cr)
	cmd := exec.Command(s.self, "gvcmd")
	cmd.Env = []string{}
	// No Pdeathsig: gVisor sends it when the forking thread ends, which
	// any of the Go runtime's may.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC}
	cmd.ExtraFiles = []*os.File{sw, rr, cr}
	// Pipes of its own rather than exec's copies: the step's status is
	// sent once both reach their end, without waiting for the step to
	// be reaped.
	var readers []*os.File
	ir, iw, err := os.Pipe()
	if err != nil {
		rw.Close()
		sr.Close()
		cw.Close()
		return nil, err
	}
	cmd.Stdin, pr.stdin = ir, iw
	closers = append(closers, ir)
	for _, fw := range []*frameWriter{pr.out, pr.errw} {
		r, w, err := os.Pipe()
		if err != nil {
			break
		}
		closers = append(closers, w)
		readers = append(readers, r)
		if fw == pr.out {
			cmd.Stdout = w
		} else {
			cmd.Stderr = w
		}
	}
	if len(readers) == 2 {
		err = cmd.Start()
	} else {
		err = errors.New("output pipes")
	}
	if err != nil {
		for _, r := range readers {
			r.Close()
		}
		iw.Close()
		rw.Close()
		sr.Close()
		cw.Close()
		return nil, err
	}
	for i, fw := range []*frameWriter{pr.out, pr.errw} {
		pr.output.Add(1)
		go func(r *os.File, fw *frameWriter) {
			defer pr.output.Done()
			defer r.Close()
			_, _ = io.Copy(fw, r)
		}(readers[i], fw)
	}
	pr.cmd = cmd
	return pr, nil
}

func (s *gvServer) handle(kind byte, id uint32, p []byte) {
	s.mu.Lock()
	pr := s.procs[id]
	s.mu.Unlock()
	switch kind {
	case FrameRequest:
		if pr != nil {
			return
		}
		s.start(id, p)
	case FrameStdin:
		if pr != nil && pr.queue != nil {
			pr.queue.put(p)
		}
	case FrameEOF:
		if pr != nil && pr.queue != nil {
			pr.queue.close()
		}
	case FrameSignal:
		if pr != nil && len(p) == 1 {
			_ = pr.cmd.Process.Signal(syscall.Signal(p[0]))
		}
	case FrameKill:
		if pr != nil {
			// The namespace's init: the kernel kills the rest with it.
			_ = pr.cmd.Process.Kill()
		}
	case FrameDial:
		if pr != nil && len(p) == 6 {
			go pr.dial(binary.BigEndian.Uint32(p[:4]), int(binary.BigEndian.Uint16(p[4:])))
		}
	case FrameResize:
		if pr != nil && pr.tty && len(p) == 4 {
			// Not on this loop: a step that does not read its control
			// pipe must not stall every other command's frames.
			go pr.resize(p)
		}
	}
}

// dial connects to 127.0.0.1:port in the command's network namespace and
// hands the connection to the host through the view's dial socket
// (GVDialSocket), or tells it the port refused.
func (pr *gvProc) dial(n uint32, port int) {
	if pr.view == "" || strings.Contains(pr.view, "/") || pr.view == "." || pr.view == ".." {
		return
	}
	c := &dialConn{hdr: make([]byte, 5)}
	binary.BigEndian.PutUint32(c.hdr, n)
	fd, err := netnsSocket(pr.cmd.Process.Pid)
	if err == nil {
		c.c, err = bridge.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}, "port")
	}
	if err != nil {
		c.hdr[4] = GVDialRefused
	}
	bridge.ToUnix(c, filepath.Join(GVViews, pr.view, GVDialSocket))
}

// dialConn is a connection to a port of the command's loopback (nil c:
// refused) whose reads begin with the dial's header.
type dialConn struct {
	hdr []byte
	c   io.ReadWriteCloser
}

func (c *dialConn) Read(p []byte) (int, error) {
	if len(c.hdr) > 0 {
		n := copy(p, c.hdr)
		c.hdr = c.hdr[n:]
		return n, nil
	}
	if c.c == nil {
		return 0, io.EOF
	}
	return c.c.Read(p)
}

func (c *dialConn) Write(p []byte) (int, error) {
	if c.c == nil {
		return len(p), nil
	}
	return c.c.Write(p)
}

// CloseWrite half-closes the connection: the server reads EOF.
func (c *dialConn) CloseWrite() error {
	if cw, ok := c.c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *dialConn) Close() error {
	if c.c == nil {
		return nil
	}
	return c.c.Close()
}

// netnsSocket makes a TCP socket in the network namespace of process pid
// (the command's loopback, not the serve step's), from a thread that
// enters it and comes back; a thread that cannot come back is never used
// again (it ends with its goroutine).
func netnsSocket(pid int) (int, error) {
	runtime.LockOSThread()
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	defer unix.Close(self)
	ns, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	defer unix.Close(ns)
	if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("enter the command's network: %w", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if unix.Setns(self, unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread()
	}
	if err != nil {
		return -1, err
	}
	return fd, nil
}

// resize passes a terminal's new size to the step.
func (pr *gvProc) resize(p []byte) {
	pr.ctlMu.Lock()
	defer pr.ctlMu.Unlock()
	if pr.ctl != nil {
		_, _ = pr.ctl.Write(p)
	}
}

// closeCtl closes the control pipe's write end.
func (pr *gvProc) closeCtl() {
	pr.ctlMu.Lock()
	defer pr.ctlMu.Unlock()
	if pr.ctl != nil {
		pr.ctl.Close()
		pr.ctl = nil
	}
}

func (s *gvServer) done(id uint32, d GVDone) {
	b, _ := json.Marshal(d)
	_ = s.out.frame(FrameDone, id, b)
}

func (s *gvServer) start(id uint32, p []byte) {
	var req GVRequest
	if err := json.Unmarshal(p, &req); err != nil {
		s.done(id, GVDone{Exit: -1, Err: "request: " + err.Error()})
		return
	}
	s.mu.Lock()
	pr, pending := s.spare, s.pending
	s.spare = nil
	s.mu.Unlock()
	if pr == nil && pending != nil {
		<-pending
		s.mu.Lock()
		pr, s.spare = s.spare, nil
		s.mu.Unlock()
	}
	var err error
	for try := 0; ; try++ {
		if pr == nil {
			if pr, err = s.spawn(); err != nil {
				s.done(id, GVDone{Exit: -1, Err: err.Error()})
				return
			}
		}
		pr.out.setID(id)
		pr.errw.setID(id)
		_, err = pr.req.Write(p)
		pr.req.Close()
		if err == nil || try > 0 {
			break
		}
		// A spare that died while it waited: start one now.
		_ = pr.cmd.Process.Kill()
		_ = pr.cmd.Wait()
		pr.status.Close()
		pr.closeCtl()
		pr = nil
	}
	if err != nil {
		_ = pr.cmd.Process.Kill()
	}
	if req.Stdin {
		pr.queue = newInQueue(pr.stdin)
	} else {
		pr.stdin.Close()
	}
	pr.tty = req.TTY != nil
	pr.view = req.View
	s.mu.Lock()
	s.procs[id] = pr
	s.mu.Unlock()
	go func() {
		status, _ := io.ReadAll(pr.status)
		pr.status.Close()
		pr.output.Wait()
		if pr.queue != nil {
			pr.queue.close()
		}
		var d GVDone
		var werr error
		if err := json.Unmarshal(status, &d); err == nil && (d.Started || d.Err != "") {
			go func() { _ = pr.cmd.Wait() }()
		} else {
			werr = pr.cmd.Wait()
			// The step died before it wrote how the command ended:
			// killed (FrameKill), or out of memory.
			d = GVDone{Exit: -1, Signal: int(syscall.SIGKILL), Err: d.Err}
			if ws, ok := pr.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				d.Signal = int(ws.Signal())
			} else if werr != nil && d.Err == "" {
				d.Err = werr.Error()
			}
			d.Started = true
		}
		s.mu.Lock()
		delete(s.procs, id)
		s.mu.Unlock()
		pr.closeCtl()
		s.done(id, d)
		s.refill()
	}()
}

// refill starts the next spare step where there is none and none is
// being started. It runs once a command has ended, not when it starts, so
// that the spare's start does not slow the command down.
func (s *gvServer) refill() {
	s.mu.Lock()
	if s.spare != nil || s.pending != nil {
		s.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	s.pending = ch
	s.mu.Unlock()
	go func() {
		pr, err := s.spawn()
		s.mu.Lock()
		if err == nil && s.spare == nil {
			s.spare, pr = pr, nil
		}
		s.pending = nil
		close(ch)
		s.mu.Unlock()
		if err == nil && pr != nil {
			pr.req.Close()
			_ = pr.cmd.Wait()
			pr.status.Close()
			pr.closeCtl()
		}
	}()
}

// lockedWriter writes whole frames, one at a time.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) frame(kind byte, id uint32, p []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return WriteFrame(l.w, kind, id, p)
}

type frameWriter struct {
	out  *lockedWriter
	mu   sync.Mutex
	id   uint32 // 0 until the step has its request
	kind byte
}

func (f *frameWriter) setID(id uint32) {
	f.mu.Lock()
	f.id = id
	f.mu.Unlock()
}

func (f *frameWriter) Write(p []byte) (int, error) {
	n := len(p)
	f.mu.Lock()
	id := f.id
	f.mu.Unlock()
	for len(p) > 0 {
		c := p[:min(len(p), 64<<10)]
		if err := f.out.frame(f.kind, id, c); err != nil {
			return 0, err
		}
		p = p[len(c):]
	}
	return n, nil
}

// inQueue hands stdin frames to a command without ever blocking the
// server's read loop on a command that does not read.
type inQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	bufs   [][]byte
	closed bool
}

func newInQueue(w io.WriteCloser) *inQueue {
	q := &inQueue{}
	q.cond = sync.NewCond(&q.mu)
	go func() {
		defer w.Close()
		for {
			q.mu.Lock()
			for len(q.bufs) == 0 && !q.closed {
				q.cond.Wait()
			}
			if len(q.bufs) == 0 {
				q.mu.Unlock()
				return
			}
			b := q.bufs[0]
			q.bufs = q.bufs[1:]
			q.mu.Unlock()
			if _, err := w.Write(b); err != nil {
				// The command closed its stdin or ended.
				q.mu.Lock()
				q.bufs, q.closed = nil, true
				q.mu.Unlock()
				return
			}
		}
	}()
	return q
}

func (q *inQueue) put(b []byte) {
	q.mu.Lock()
	if !q.closed {
		q.bufs = append(q.bufs, b)
	}
	q.mu.Unlock()
	q.cond.Signal()
}

func (q *inQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Signal()
}

// runGVCmd is the gvcmd step: the init of one command's pid, mount,
// network and IPC namespaces. It builds the command's root (the sandbox's system
// directories, fresh /tmp and /root, the workspace view and caches the
// host mounted under GVViews), leaves GVViews behind, drops every
// capability, starts the command and writes how it ended, as GVDone, to
// fd 3. When it returns, the kernel kills whatever the command left.
func runGVCmd(a []string) int {
	status, reqf, ctl := os.NewFile(3, "status"), os.NewFile(4, "request"), os.NewFile(5, "control")
	if len(a) != 0 || status == nil || reqf == nil || ctl == nil {
		return usage()
	}
	// Inherited without close-on-exec: the command must not get them (it
	// could write a status of its choosing).
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	syscall.CloseOnExec(5)
	// Capabilities are a thread's: this one drops the bounding set now,
	// before the request (mounting needs only the effective set), and
	// the rest once the command's root is made, and starts the command,
	// so that the command's process is forked from a thread with none
	// (and no way to gain any: no_new_privs).
	runtime.LockOSThread()
	baseErr := gvBase()
	if baseErr == nil {
		baseErr = dropBounding()
	}
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 1 << 20, Max: 1 << 20})
	// Every signal the step gets goes to its command. Asked for now,
	// before the request: under the Sentry this costs about as much as
	// starting the command (a handler per signal, and a thread), and no
	// one signals a step before its command starts (the server signals
	// only steps that have one), so nothing is caught early.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs)
	gvPrewarm()
	p, err := io.ReadAll(io.LimitReader(reqf, MaxFrame))
	reqf.Close()
	if err != nil || len(p) == 0 {
		return 0 // not needed: the server ends
	}
	report := func(d GVDone) int {
		b, _ := json.Marshal(d)
		_, _ = status.Write(b)
		status.Close()
		return 0
	}
	var req GVRequest
	if err := json.Unmarshal(p, &req); err != nil {
		return report(GVDone{Exit: -1, Err: "request: " + err.Error()})
	}
	if len(req.Args) == 0 {
		return report(GVDone{Exit: -1, Err: "no command"})
	}
	if baseErr != nil {
		return report(GVDone{Exit: -1, Err: baseErr.Error()})
	}
	if err := gvView(&req); err != nil {
		return report(GVDone{Exit: -1, Err: err.Error()})
	}
	// On a terminal: a new one of this namespace's own devpts instance
	// (gvBase), which no other command's can open.
	var tty *gvTTY
	if req.TTY != nil {
		if req.TTY.Rows == 0 || req.TTY.Cols == 0 {
			return report(GVDone{Exit: -1, Err: "terminal size"})
		}
		if tty, err = openGVTTY(req.TTY, req.Stdin, ctl); err != nil {
			return report(GVDone{Exit: -1, Err: err.Error()})
		}
	} else {
		ctl.Close()
	}
	if req.FSize > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: uint64(req.FSize), Max: uint64(req.FSize)}); err != nil {
			return report(GVDone{Exit: -1, Err: "file size limit: " + err.Error()})
		}
	}
	if err := dropCaps(); err != nil {
		return report(GVDone{Exit: -1, Err: err.Error()})
	}
	if req.Egress != nil {
		if err := gvRelay(req.Egress); err != nil {
			return report(GVDone{Exit: -1, Err: err.Error()})
		}
	}
	if err := unix.Chdir(req.Cwd); err != nil {
		return report(GVDone{Exit: -1, Err: "working directory: " + err.Error()})
	}
	prog := req.Args[0]
	if req.Lookup {
		// As sh would: a program not found is status 127, one that
		// cannot run 126.
		var code int
		if prog, code = lookPath(req.Args[0], req.Env); code != 0 {
			fmt.Fprintf(os.Stderr, "%s: %s\n", req.Args[0], map[int]string{126: "Permission denied", 127: "command not found"}[code])
			return report(GVDone{Started: true, Exit: code})
		}
	}
	cmd := &exec.Cmd{Path: prog, Args: req.Args, Env: req.Env}
	setIO := func(c *exec.Cmd) {
		switch {
		case tty != nil:
			c.Stdin, c.Stdout, c.Stderr = tty.slave, tty.slave, tty.slave
			// It leads a session whose controlling terminal this is.
			c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		case req.Stdin:
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
		default:
			c.Stdout, c.Stderr = os.Stdout, os.Stderr
		}
	}
	setIO(cmd)
	if !req.Stdin {
		os.Stdin.Close()
	}
	if err := cmd.Start(); err != nil {
		if !req.Lookup {
			return report(GVDone{Exit: -1, Err: "start: " + err.Error()})
		}
		// A script without #! runs under sh, as sh runs it; any
		// other failure is sh's too.
		code := 126
		if errors.Is(err, unix.ENOEXEC) {
			cmd = &exec.Cmd{Path: "/bin/sh", Args: append([]string{"sh"}, req.Args...), Env: req.Env}
			setIO(cmd)
			err = cmd.Start()
		} else if errors.Is(err, unix.ENOENT) {
			code = 127
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", req.Args[0], err)
			return report(GVDone{Started: true, Exit: code})
		}
	}
	if tty != nil {
		// The master sees the end of the terminal once no process
		// holds its slave.
		tty.slave.Close()
	}
	go func() {
		for s := range sigs {
			if s == syscall.SIGCHLD || s == syscall.SIGURG {
				continue
			}
			_ = cmd.Process.Signal(s)
		}
	}()
	_ = cmd.Wait()
	// What the command left ends now, as a cold sandbox's does with
	// it (this step is the namespace's init: -1 is all the rest), and
	// the output pipes close with it, so the host has all output before
	// the status.
	_ = unix.Kill(-1, unix.SIGKILL)
	if tty != nil {
		tty.drain()
	}
	os.Stdout.Close()
	os.Stderr.Close()
	d := GVDone{Started: true}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		d.Exit, d.Signal = -1, int(ws.Signal())
	} else {
		d.Exit = cmd.ProcessState.ExitCode()
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru != nil {
		d.UserNs, d.SysNs = ru.Utime.Nano(), ru.Stime.Nano()
	}
	return report(d)
}

// gvPrewarm runs, while the step waits for its request, the code its
// request will run first, so that the pages it touches are faulted in
// ahead (a first touch costs a trip through the Sentry).
func gvPrewarm() {
	var req GVRequest
	_ = json.Unmarshal([]byte(`{"view":"v","workspace":"/w","caches":[{"src":"c0","path":"/c"}],"cwd":"/w","env":["A=b"],"args":["true"],"lookup":true}`), &req)
	_, _ = json.Marshal(GVDone{Started: true})
	_, _ = lookPath("true", []string{"PATH=/usr/bin:/bin"})
	// os/exec's first start checks, once per process, that pidfds work,
	// and that check starts a child of its own: FindProcess makes it now.
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Release()
	}
}

// gvTTY is a command's terminal: the step copies its master to stdout,
// stdin to it, and applies the resizes it reads on its control pipe.
type gvTTY struct {
	master int
	slave  *os.File
	out    chan struct{} // closed once the master's output is all copied
}

// openGVTTY opens the terminal and starts its copies.
func openGVTTY(sz *GVTTY, stdin bool, ctl *os.File) (*gvTTY, error) {
	m, sl, err := pty.Open(sz.Rows, sz.Cols)
	if err != nil {
		return nil, err
	}
	t := &gvTTY{master: m, slave: os.NewFile(uintptr(sl), "tty"), out: make(chan struct{})}
	go func() {
		defer close(t.out)
		pty.CopyOut(os.Stdout, m)
	}()
	if stdin {
		go pty.CopyIn(m, os.Stdin)
	}
	go func() {
		defer ctl.Close()
		var b [4]byte
		for {
			if _, err := io.ReadFull(ctl, b[:]); err != nil {
				return
			}
			ws := &unix.Winsize{Row: binary.BigEndian.Uint16(b[:2]), Col: binary.BigEndian.Uint16(b[2:])}
			if ws.Row != 0 && ws.Col != 0 {
				_ = unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, ws)
			}
		}
	}()
	return t, nil
}

// drain waits, a bounded time, for the terminal's output to be copied
// once every process holding it is dead.
func (t *gvTTY) drain() {
	select {
	case <-t.out:
	case <-time.After(2 * time.Second):
	}
}

// lookPath finds name as sh does, in env's PATH: the program, or 127 (not
// found) or 126 (found, not executable).
func lookPath(name string, env []string) (string, int) {
	if strings.Contains(name, "/") {
		st, err := os.Stat(name)
		switch {
		case err != nil:
			return "", 127
		case st.IsDir() || unix.Access(name, unix.X_OK) != nil:
			return "", 126
		}
		return name, 0
	}
	pathVar := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathVar = v
		}
	}
	code := 127
	for _, d := range filepath.SplitList(pathVar) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		st, err := os.Stat(p)
		if err != nil || st.IsDir() {
			continue
		}
		if unix.Access(p, unix.X_OK) != nil {
			code = 126
			continue
		}
		return p, 0
	}
	return "", code
}

// gvBase makes what every command's root at GVNewRoot holds; it runs
// before the step has its request.
func gvBase() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private mounts: %w", err)
	}
	nr := GVNewRoot
	if err := unix.Mount("tmpfs", nr, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	for _, d := range gvSystemDirs {
		st, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case st.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(d)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, nr+d); err != nil {
				return err
			}
		case st.IsDir():
			if err := os.Mkdir(nr+d, 0o755); err != nil {
				return err
			}
			if err := unix.Mount(d, nr+d, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("bind %s: %w", d, err)
			}
		}
	}
	// A devpts instance of the command's own: the terminals of other
	// commands (the sandbox's instance) are not there to open.
	if err := unix.Mount("devpts", nr+"/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666"); err != nil {
		return fmt.Errorf("devpts: %w", err)
	}
	if err := os.Mkdir(nr+"/proc", 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", nr+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("proc: %w", err)
	}
	for _, d := range []string{"/tmp", "/root"} {
		if err := os.Mkdir(nr+d, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", nr+d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("tmpfs %s: %w", d, err)
		}
	}
	return nil
}

// gvView mounts req's view and caches in the root gvBase made, leaves
// the views and enters the root.
func gvView(req *GVRequest) error {
	nr := GVNewRoot
	bind := func(src, dst string) error {
		if !filepath.IsAbs(dst) || filepath.Clean(dst) != dst || dst == "/" {
			return fmt.Errorf("mount point %q", dst)
		}
		if strings.Contains(src, "..") {
			return fmt.Errorf("view %q", src)
		}
		if err := os.MkdirAll(nr+dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(filepath.Join(GVViews, req.View, src), nr+dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dst, err)
		}
		return unix.Mount("", nr+dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, "")
	}
	if err := bind("ws", req.Workspace); err != nil {
		return err
	}
	for _, c := range req.Caches {
		if err := bind(c.Src, c.Path); err != nil {
			return err
		}
	}
	if e := req.Egress; e != nil {
		if err := gvEgressMounts(req.View, e); err != nil {
			return err
		}
	}
	// Every other command's view is under GVViews: gone from this
	// namespace, not merely out of the root.
	if err := unix.Unmount(GVViews, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("leave the views: %w", err)
	}
	if err := unix.Mount("", nr, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		if err := unix.Mount("", nr, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("root read-only: %w", err)
		}
	}
	if err := unix.Chroot(nr); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// gvEgressMounts binds the proxy's socket and CA bundle from the view
// into the root at GVEgressDir, the bundle also over the system trust
// store (regular files only: a symlink would be followed to the host's).
func gvEgressMounts(view string, e *GVEgress) error {
	nr := GVNewRoot
	if err := os.MkdirAll(nr+GVEgressDir, 0o755); err != nil {
		return err
	}
	file := func(src, dst string, create bool) error {
		if strings.Contains(src, "/") || src == "" || src == "." || src == ".." {
			return fmt.Errorf("egress file %q", src)
		}
		if create {
			if err := os.WriteFile(dst, nil, 0o444); err != nil {
				return err
			}
		}
		if err := unix.Mount(filepath.Join(GVViews, view, src), dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dst, err)
		}
		return unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
	}
	if err := file(e.Socket, nr+GVEgressSocket, true); err != nil {
		return err
	}
	for _, f := range e.Forward {
		if err := file(f.Socket, nr+GVEgressDir+"/"+f.Socket, true); err != nil {
			return err
		}
	}
	if e.CA == "" {
		return nil
	}
	if err := file(e.CA, nr+GVEgressCA, true); err != nil {
		return err
	}
	for _, p := range gvSystemCA {
		if st, err := os.Lstat(nr + p); err == nil && st.Mode().IsRegular() {
			if err := file(e.CA, nr+p, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// gvRelay listens on 127.0.0.1:Port in the command's network namespace
// (its loopback, nothing else) and relays each connection to the proxy's
// socket, and on each loopback target to its tunnel's socket. The
// listeners are close-on-exec: the command does not inherit them.
func gvRelay(e *GVEgress) error {
	if err := gvListen("127.0.0.1:"+strconv.Itoa(e.Port), GVEgressSocket); err != nil {
		return err
	}
	for _, f := range e.Forward {
		if err := gvListen(f.Addr, GVEgressDir+"/"+f.Socket); err != nil {
			return err
		}
	}
	return nil
}

// gvListen listens on addr (127.0.0.1:PORT) and relays each connection
// to the unix socket sock (internal/bridge: raw sockets, not package net,
// which the runtime must not link: TestRuntimeLinksNoCgo).
func gvListen(addr, sock string) error {
	l, err := bridge.ListenLoopback(addr)
	if err != nil {
		return fmt.Errorf("egress relay: %w", err)
	}
	go l.Serve(func(c io.ReadWriteCloser) { bridge.ToUnix(c, sock) })
	return nil
}

// dropBounding empties this thread's capability bounding set.
func dropBounding() error {
	for c := 0; c <= 63; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	return nil
}

// dropCaps gives this thread the one supplementary group commandGID,
// empties its capability sets (dropBounding emptied the bounding set)
// and sets no_new_privs.
//
// The group: a cache's files are shared between backends by POSIX ACLs
// (backend/internal/cacheshare) that give the group commandGID what the
// owner has; the Sentry checks the mode bits alone, whose group class
// shows the ACL's mask, so a command here writes a file a Docker command
// made (owner its own uid, group commandGID) as a member of that group.
// The raw call: credentials are a thread's, and the command is forked
// from this one.
func dropCaps() error {
	g := [1]uint32{commandGID}
	if _, _, e := unix.RawSyscall(sysSetgroups, 1, uintptr(unsafe.Pointer(&g[0])), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	_ = unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}
