//go:build linux

package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/internal/cacheshare"
	"github.com/pulse-agent/pulse/internal/boxrt"
	"github.com/pulse-agent/pulse/internal/bridge"
	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/policy"
)

// A warm sandbox: one runsc sandbox started once and kept for the
// Backend's life (until Close), in which every command runs. Its init is
// the runtime's gvserve step, which reads framed requests on its stdin and
// answers on its stdout (internal/boxrt/gvisor.go). Per command the host
// mounts the workspace view (the same overlay as a cold command's) and
// binds the caches under views/ID/, a directory bound into the sandbox
// once at boxrt.GVViews as a shared mount, so that what the host mounts
// in it later propagates to runsc (its gofer and sentry make their copies
// slaves). In the sandbox the runtime gives each command pid, mount,
// network and IPC namespaces of its own, a root of its own (the system directories, fresh
// /tmp and /root, its view at the workspace's path, its caches) without
// the views, and no capabilities; when the command's main process ends,
// the runtime ends and the kernel (gVisor's) kills every process the
// command left, as a cold sandbox's end does. The host then reads the
// upper layer back exactly as for a cold command.
//
// A warm sandbox's directory, under the state dir, is named warmPrefix
// and a random id; it holds:
//
//	lock         flocked while the sandbox is this Backend's
//	views/       bound onto itself and shared: one directory per command
//	rootfs/      the sandbox's empty root, with its mount points
//	rt           the runtime program, bound at boxrt.GVRuntime
//	config.json  the bundle's spec
//
// What a warm sandbox costs: the sandbox is in one memory cgroup (and
// one cpu cgroup) of the limits for all of its commands together (one
// sandbox per memory and cpus limits), and
// gVisor keeps the host file descriptors of a finished command's view in
// its dentry cache for a while, so that the view's memory (its scratch
// tmpfs) is freed once runsc drops them, or when the sandbox is retired
// (after warmMaxCommands commands) or closed.
const (
	warmPrefix = "w-"
	// warmRuntime is where the runtime program is in the sandbox.
	warmRuntime = "/.pulse-rt"
	// warmMaxCommands retires a sandbox after this many commands: a new
	// one serves the next, and the old one ends with its last command.
	warmMaxCommands = 500
	// warmStartTimeout bounds a warm sandbox's start (its hello).
	warmStartTimeout = time.Minute
)

// warm is one running warm sandbox.
type warm struct {
	b     *Backend
	dir   string
	views string
	id    string
	key   cgLimits
	cmd   *exec.Cmd
	lock  *os.File

	inMu sync.Mutex
	in   io.WriteCloser

	mu       sync.Mutex
	cmds     map[uint32]*warmCmd
	next     uint32
	served   int
	retired  bool
	inflight int

	gone    chan struct{} // closed when the sandbox's stdout ended
	goneErr error
	stderr  bytes.Buffer // runsc's and the runtime's own words, bounded
	exited  chan struct{}
}

type warmCmd struct {
	stdout, stderr io.Writer
	done           chan boxrt.GVDone
}

// warmFor returns the warm sandbox for cg, starting it the first
// time; nil when commands must run cold (WithCold, or no warm sandbox
// can start here: the reason is logged once and kept for the doctor).
func (b *Backend) warmFor(ctx context.Context, bin, platform string, cg cgLimits) *warm {
	if b.o.cold {
		return nil
	}
	b.warmMu.Lock()
	defer b.warmMu.Unlock()
	if b.warmErr != nil {
		return nil
	}
	if w := b.warms[cg]; w != nil {
		select {
		case <-w.gone:
			delete(b.warms, cg)
			w.retire()
		default:
			w.mu.Lock()
			full := w.served >= warmMaxCommands
			if !full {
				w.served++
				w.inflight++
			}
			w.mu.Unlock()
			if !full {
				return w
			}
			delete(b.warms, cg)
			w.retire()
		}
	}
	w, err := b.startWarm(ctx, bin, platform, cg)
	if err != nil {
		if ctx.Err() == nil {
			b.warmErr = err
			b.log.Warn("no warm gVisor sandbox here: each command starts a sandbox of its own", "error", err)
		}
		return nil
	}
	if b.warms == nil {
		b.warms = map[cgLimits]*warm{}
	}
	b.warms[cg] = w
	w.served, w.inflight = 1, 1
	return w
}

// release ends a command's hold on w (taken by warmFor).
func (w *warm) release() {
	w.mu.Lock()
	w.inflight--
	stop := w.retired && w.inflight == 0
	w.mu.Unlock()
	if stop {
		go w.stop()
	}
}

func (b *Backend) coldReason() error {
	_, err := b.Warm()
	return err
}

// Warm reports whether commands run in a warm sandbox (after the first
// command tried), and why not.
func (b *Backend) Warm() (bool, error) {
	if b.o.cold {
		return false, errors.New("cold mode asked for (WithCold)")
	}
	b.warmMu.Lock()
	defer b.warmMu.Unlock()
	return b.warmErr == nil, b.warmErr
}

func (b *Backend) startWarm(ctx context.Context, bin, platform string, cg cgLimits) (_ *warm, err error) {
	rt, err := runtimeBytes(b.o.runtime)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(b.o.stateDir, warmPrefix)
	if err != nil {
		return nil, err
	}
	lf, err := os.Create(filepath.Join(dir, lockName))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := flock.TryLock(lf); err != nil {
		lf.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	w := &warm{b: b, dir: dir, views: filepath.Join(dir, "views"), id: filepath.Base(dir), key: cg, lock: lf,
		cmds: map[uint32]*warmCmd{}, gone: make(chan struct{}), exited: make(chan struct{})}
	defer func() {
		if err != nil {
			w.cleanup()
		}
	}()
	if err := os.Mkdir(w.views, 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount(w.views, w.views, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind views: %w", err)
	}
	if err := unix.Mount("", w.views, "", unix.MS_SHARED, ""); err != nil {
		return nil, fmt.Errorf("share views: %w", err)
	}
	rtPath := filepath.Join(dir, "rt")
	if err := os.WriteFile(rtPath, rt, 0o555); err != nil {
		return nil, err
	}
	s, mkpoint, err := baseSpec(dir, w.id, cg)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"/tmp", boxrt.GVViews, boxrt.GVNewRoot} {
		if err := mkpoint(d); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "rootfs", warmRuntime), nil, 0o555); err != nil {
		return nil, err
	}
	s.Mounts = append(s.Mounts,
		mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		mount{Destination: warmRuntime, Type: "bind", Source: rtPath, Options: []string{"bind", "ro", "nodev"}},
		mount{Destination: boxrt.GVViews, Type: "bind", Source: w.views, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	p := &s.Process
	p.Args = []string{warmRuntime, "gvserve"}
	p.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	p.Cwd = "/"
	p.NoNewPrivileges = true
	// The runtime's own: mount namespaces and chroot for each command's
	// root, dropping the bounding set, signalling commands, giving a
	// command the caches' sharing group. Commands have none (runtime's
	// dropCaps).
	caps := []string{"CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_SETPCAP", "CAP_KILL", "CAP_SETGID"}
	p.Capabilities = map[string]any{"bounding": caps, "effective": caps, "inheritable": []string{}, "permitted": caps, "ambient": []string{}}
	p.Rlimits = append(p.Rlimits, rlimit{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20})
	js, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), js, 0o600); err != nil {
		return nil, err
	}

	root := b.runscRoot()
	// --host-uds=open: the runtime relays allowlist commands' connections
	// to the egress proxy's socket, a host socket mounted in the view.
	cmd := exec.Command(bin, "--root", root, "--network=none", "--host-uds=open", "--platform="+platform, "run", "--bundle", dir, w.id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = &boundedWriter{w: &w.stderr, mu: &w.mu, n: 64 << 10}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start runsc: %w", err)
	}
	w.cmd, w.in = cmd, in
	br := bufio.NewReaderSize(out, 64<<10)
	hello := make(chan error, 1)
	go func() {
		kind, _, p, err := boxrt.ReadFrame(br)
		switch {
		case err != nil:
			hello <- err
		case kind != boxrt.FrameHello || string(p) != boxrt.Identity():
			hello <- fmt.Errorf("%w: first frame %q", boxrt.ErrFrame, kind)
		default:
			hello <- nil
			w.read(br)
			return
		}
		close(w.gone)
	}()
	go func() {
		_ = cmd.Wait()
		close(w.exited)
	}()
	timer := time.NewTimer(warmStartTimeout)
	defer timer.Stop()
	select {
	case err = <-hello:
	case <-timer.C:
		err = errors.New("no answer")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		w.mu.Lock()
		msg := bytes.TrimSpace(w.stderr.Bytes())
		w.mu.Unlock()
		return nil, fmt.Errorf("warm sandbox did not start: %w: %s", err, msg)
	}
	return w, nil
}

// read demultiplexes the sandbox's frames until its stdout ends; then
// every command still waiting learns the sandbox is gone.
func (w *warm) read(r io.Reader) {
	var err error
	for {
		var kind byte
		var id uint32
		var p []byte
		kind, id, p, err = boxrt.ReadFrame(r)
		if err != nil {
			break
		}
		w.mu.Lock()
		c := w.cmds[id]
		w.mu.Unlock()
		if c == nil {
			continue
		}
		switch kind {
		case boxrt.FrameStdout:
			if c.stdout != nil {
				_, _ = c.stdout.Write(p)
			}
		case boxrt.FrameStderr:
			if c.stderr != nil {
				_, _ = c.stderr.Write(p)
			}
		case boxrt.FrameDone:
			var d boxrt.GVDone
			if err := json.Unmarshal(p, &d); err != nil {
				d = boxrt.GVDone{Exit: -1, Err: "done: " + err.Error()}
			}
			w.mu.Lock()
			delete(w.cmds, id)
			w.mu.Unlock()
			c.done <- d
		}
	}
	w.mu.Lock()
	w.goneErr = err
	w.mu.Unlock()
	close(w.gone)
}

// send writes one frame to the sandbox.
func (w *warm) send(kind byte, id uint32, p []byte) error {
	w.inMu.Lock()
	defer w.inMu.Unlock()
	return boxrt.WriteFrame(w.in, kind, id, p)
}

// retire ends the sandbox once no command runs in it.
func (w *warm) retire() {
	w.mu.Lock()
	w.retired = true
	idle := w.inflight == 0
	w.mu.Unlock()
	if idle {
		w.stop()
	}
}

// stop ends the sandbox: its init reads the end of its stdin and returns,
// and the sandbox ends with it; then its directory goes.
func (w *warm) stop() {
	w.inMu.Lock()
	w.in.Close()
	w.inMu.Unlock()
	select {
	case <-w.exited:
	case <-time.After(10 * time.Second):
		w.kill()
		<-w.exited
	}
	w.cleanup()
}

// kill ends the sandbox at once.
func (w *warm) kill() {
	bin, root := w.b.runscBin(), w.b.runscRoot()
	_ = exec.Command(bin, "--root", root, "kill", w.id, "KILL").Run()
	if w.cmd != nil && w.cmd.Process != nil {
		_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// cleanup removes what a warm sandbox left: its container, its views
// mount and directory.
func (w *warm) cleanup() {
	if w.cmd != nil {
		_ = exec.Command(w.b.runscBin(), "--root", w.b.runscRoot(), "delete", "--force", w.id).Run()
	}
	warmTeardown(w.dir)
	_ = os.RemoveAll(w.dir)
	w.lock.Close()
}

// warmTeardown unmounts a warm sandbox's views (what commands left
// mounted there with it).
func warmTeardown(dir string) {
	_ = unix.Unmount(filepath.Join(dir, "views"), unix.MNT_DETACH)
}

// runWarm runs req in w, its view mounted at views/vid; it returns once
// the command and every process it left have ended.
func (b *Backend) runWarm(ctx context.Context, w *warm, req *backend.Request, limits policy.ResourceLimits, vid, dir string, caches []boxrt.GVCache, egress *boxrt.GVEgress, onStart func(backend.Control)) (*backend.Result, error) {
	capHit := make(chan struct{})
	var capOnce sync.Once
	onCap := func() { capOnce.Do(func() { close(capHit) }) }
	stdout := &capWriter{w: req.Stdout, limit: limits.OutputBytes, onCap: onCap}
	stderr := &capWriter{w: req.Stderr, limit: limits.OutputBytes, onCap: onCap}
	c := &warmCmd{done: make(chan boxrt.GVDone, 1)}
	if req.Stdout != nil {
		c.stdout = stdout
	}
	if req.Stderr != nil {
		c.stderr = stderr
	}
	env, args := commandLine(req)
	if egress != nil {
		ca := ""
		if egress.CA != "" {
			ca = boxrt.GVEgressCA
		}
		// The proxy's variables win over the request's: nothing is
		// reachable but through it.
		px := backend.ProxyEnv("http://127.0.0.1:"+strconv.Itoa(egress.Port), ca)
		kept := env[:0:0]
		for _, kv := range env {
			k, _, _ := strings.Cut(kv, "=")
			if _, ok := px[k]; !ok {
				kept = append(kept, kv)
			}
		}
		for k, v := range px {
			kept = append(kept, k+"="+v)
		}
		env = kept
	}
	gr := boxrt.GVRequest{View: vid, Workspace: req.Workspace, Caches: caches, Cwd: path.Join(req.Workspace, dir),
		Env: env, Args: args, FSize: limits.FileSizeBytes, Stdin: req.Stdin != nil, Egress: egress}
	if req.TTY != nil {
		gr.TTY = &boxrt.GVTTY{Rows: req.TTY.Rows, Cols: req.TTY.Cols}
	}
	if req.Shell == "" {
		// The runtime finds the program as sh would, without the
		// shell a cold sandbox runs it through: one program start
		// less.
		gr.Args, gr.Lookup = req.Args, true
	}
	js, err := json.Marshal(&gr)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %w", backend.ErrInvalidRequest, err)
	}
	w.mu.Lock()
	w.next++
	id := w.next
	w.cmds[id] = c
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.cmds, id)
		w.mu.Unlock()
	}()
	start := time.Now()
	// A sandbox gone already is seen below (w.gone).
	_ = w.send(boxrt.FrameRequest, id, js)
	if req.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := req.Stdin.Read(buf)
				if n > 0 {
					if w.send(boxrt.FrameStdin, id, append([]byte(nil), buf[:n]...)) != nil {
						return
					}
				}
				if err != nil {
					_ = w.send(boxrt.FrameEOF, id, nil)
					return
				}
			}
		}()
	}
	ended := make(chan struct{})
	if onStart != nil {
		wc := &warmControl{w: w, id: id, ended: ended}
		// The socket the runtime hands DialPort's connections to.
		ln, err := net.Listen("unix", filepath.Join(w.views, vid, boxrt.GVDialSocket))
		if err != nil {
			b.log.Warn("no dial socket: DialPort will fail", "error", err)
		} else {
			defer ln.Close()
			wc.dialer = newWarmDialer(ln)
		}
		if req.TTY != nil {
			onStart(&warmTTYControl{wc})
		} else {
			onStart(wc)
		}
	}
	defer close(ended)

	timer := time.NewTimer(limits.Timeout)
	defer timer.Stop()
	var reason backend.TerminationReason
	var d boxrt.GVDone
	gone := false
	select {
	case d = <-c.done:
	case <-w.gone:
		gone = true
	case <-timer.C:
		reason = backend.Timeout
	case <-ctx.Done():
		reason = backend.Cancelled
	case <-b.closing:
		reason = backend.Cancelled
	case <-capHit:
		reason = backend.OutputLimit
	}
	if reason != "" {
		_ = w.send(boxrt.FrameKill, id, nil)
		t := time.NewTimer(10 * time.Second)
		select {
		case d = <-c.done:
		case <-w.gone:
		case <-t.C:
			// The command's processes did not end: the whole sandbox
			// goes, and with it every command in it.
			b.log.Warn("a command of the warm sandbox did not end when killed; ending the sandbox", "sandbox", w.id)
			w.kill()
			<-w.gone
		}
		t.Stop()
	}
	if req.Stdin != nil {
		closeReader(req.Stdin)
	}
	res := &backend.Result{Duration: time.Since(start), Truncated: stdout.truncated() || stderr.truncated()}
	switch {
	case reason != "":
		res.Termination, res.ExitCode = reason, -1
	case gone:
		// The sandbox ended under the command: out of memory (its
		// cgroup kills it whole) or runsc failed.
		res.Termination, res.ExitCode = backend.Signaled, -1
		w.mu.Lock()
		b.log.Warn("the warm sandbox ended while a command ran", "sandbox", w.id, "error", w.goneErr, "stderr", string(bytes.TrimSpace(w.stderr.Bytes())))
		w.mu.Unlock()
	case !d.Started:
		return nil, fmt.Errorf("gvisor: %w: the command could not start: %s", backend.ErrUnavailable, d.Err)
	case d.Signal != 0:
		res.Termination, res.ExitCode = backend.Signaled, -1
	default:
		res.Termination, res.ExitCode = backend.Exited, d.Exit
	}
	res.TimedOut = res.Termination == backend.Timeout
	res.Metrics.UserCPU = time.Duration(d.UserNs)
	res.Metrics.SystemCPU = time.Duration(d.SysNs)
	return res, nil
}

// warmControl signals a command of a warm sandbox and dials its ports.
type warmControl struct {
	w      *warm
	id     uint32
	ended  <-chan struct{}
	dialer *warmDialer // nil: no dial socket
}

// DialPort implements backend.PortDialer: the runtime connects to
// 127.0.0.1:port in the command's network namespace and hands the
// connection to the host through the view's dial socket.
func (c *warmControl) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("gvisor: %w: port %d", backend.ErrInvalidRequest, port)
	}
	select {
	case <-c.ended:
		return nil, backend.ErrProcessDone
	default:
	}
	if c.dialer == nil {
		return nil, fmt.Errorf("gvisor: %w: no dial socket for this command", backend.ErrUnavailable)
	}
	conn, ch := c.dialer.expect()
	defer c.dialer.abandon(conn, ch)
	var p [6]byte
	binary.BigEndian.PutUint32(p[:4], conn)
	binary.BigEndian.PutUint16(p[4:], uint16(port))
	if err := c.w.send(boxrt.FrameDial, c.id, p[:]); err != nil {
		return nil, backend.ErrProcessDone
	}
	t := time.NewTimer(dialTimeout)
	defer t.Stop()
	select {
	case nc := <-ch:
		if nc == nil {
			return nil, fmt.Errorf("gvisor: port %d: %w", port, syscall.ECONNREFUSED)
		}
		return nc, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ended:
		return nil, backend.ErrProcessDone
	case <-t.C:
		return nil, fmt.Errorf("gvisor: port %d: %w: the runtime did not answer", port, backend.ErrUnavailable)
	}
}

// dialTimeout bounds a DialPort whose answer never comes (a broken
// runtime); a port that refuses answers at once.
const dialTimeout = 30 * time.Second

// warmDialer matches the connections the runtime makes to a command's
// dial socket with the DialPort calls waiting for them.
type warmDialer struct {
	mu      sync.Mutex
	next    uint32
	pending map[uint32]chan net.Conn
}

func newWarmDialer(ln net.Listener) *warmDialer {
	d := &warmDialer{pending: map[uint32]chan net.Conn{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go d.arrive(c)
		}
	}()
	return d
}

// expect registers a dial: its conn number and where its connection
// comes (nil: the port refused).
func (d *warmDialer) expect() (uint32, chan net.Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	ch := make(chan net.Conn, 1)
	d.pending[d.next] = ch
	return d.next, ch
}

// abandon ends a dial; a connection that came for it and was not taken
// is closed.
func (d *warmDialer) abandon(conn uint32, ch chan net.Conn) {
	d.mu.Lock()
	delete(d.pending, conn)
	d.mu.Unlock()
	select {
	case c := <-ch:
		if c != nil {
			c.Close()
		}
	default:
	}
}

// arrive reads a connection's header (boxrt.GVDialSocket) and hands it
// to its dial; one no dial waits for is closed.
func (d *warmDialer) arrive(c net.Conn) {
	var h [5]byte
	_ = c.SetReadDeadline(time.Now().Add(dialTimeout))
	if _, err := io.ReadFull(c, h[:]); err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	d.mu.Lock()
	ch := d.pending[binary.BigEndian.Uint32(h[:4])]
	delete(d.pending, binary.BigEndian.Uint32(h[:4]))
	d.mu.Unlock()
	if ch == nil {
		c.Close()
		return
	}
	if h[4] != boxrt.GVDialOK {
		c.Close()
		ch <- nil
		return
	}
	ch <- c
}

func (c *warmControl) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok || s <= 0 || s > 255 {
		return fmt.Errorf("gvisor: %w: signal %v", backend.ErrUnsupported, sig)
	}
	select {
	case <-c.ended:
		return backend.ErrProcessDone
	default:
	}
	if s == syscall.SIGKILL {
		return c.w.send(boxrt.FrameKill, c.id, nil)
	}
	return c.w.send(boxrt.FrameSignal, c.id, []byte{byte(s)})
}

// warmTTYControl is the control of a command on a terminal.
type warmTTYControl struct{ *warmControl }

// Resize implements backend.Resizer: the runtime sets the terminal's
// size, and the kernel (gVisor's) sends the command SIGWINCH.
func (c *warmTTYControl) Resize(rows, cols uint16) error {
	if err := resizeCheck(rows, cols, c.ended); err != nil {
		return err
	}
	var p [4]byte
	binary.BigEndian.PutUint16(p[:2], rows)
	binary.BigEndian.PutUint16(p[2:], cols)
	if err := c.w.send(boxrt.FrameResize, c.id, p[:]); err != nil {
		return backend.ErrProcessDone
	}
	return nil
}

// mountCaches binds each cache's host directory at view/cN, for the
// runtime to mount at its path.
func mountCaches(view string, caches []backend.Cache) ([]boxrt.GVCache, error) {
	var out []boxrt.GVCache
	for i, c := range caches {
		name := "c" + strconv.Itoa(i)
		p := filepath.Join(view, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			return nil, err
		}
		// The model every backend shares a cache by (cacheshare); the
		// command runs with its group (boxrt's dropCaps).
		if err := cacheshare.Share(c.HostDir); err != nil {
			return nil, fmt.Errorf("cache %s: %w", c.Name, err)
		}
		if err := unix.Mount(c.HostDir, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return nil, fmt.Errorf("bind cache %s: %w", c.Name, err)
		}
		out = append(out, boxrt.GVCache{Src: name, Path: c.Path})
	}
	return out, nil
}

// egressPort is where an allowlist command finds the proxy (as on
// namespace).
const egressPort = 3128

// startEgress makes an allowlist request's proxy reachable from the
// view: a unix socket of its own at view/egress.sock, served here (each
// connection handed to the proxy in this process, Egress.ServeConn, or
// relayed to its socket), and a copy of the CA bundle at view/ca.pem, for
// the runtime to mount and relay to. Not a bind of the proxy's own socket
// and bundle: gVisor keys what it caches of a host file by its inode, so
// a bind of the same file in a later command's view is seen as the
// earlier, unmounted one. stop closes the socket.
func startEgress(view string, req *backend.Request) (e *boxrt.GVEgress, stop func(), err error) {
	stop = func() {}
	if req.Network.Mode != policy.NetworkAllowlist || req.Egress == nil {
		return nil, stop, nil
	}
	eg := req.Egress
	e = &boxrt.GVEgress{Socket: "egress.sock", Port: egressPort}
	if eg.CAFile != "" {
		ca, err := os.ReadFile(eg.CAFile)
		if err != nil {
			return nil, stop, fmt.Errorf("egress CA: %w", err)
		}
		e.CA = "ca.pem"
		if err := os.WriteFile(filepath.Join(view, e.CA), ca, 0o444); err != nil {
			return nil, stop, err
		}
	}
	var ls []net.Listener
	stop = func() {
		for _, l := range ls {
			l.Close()
		}
	}
	serve := func(name string, handle func(net.Conn)) error {
		l, err := net.Listen("unix", filepath.Join(view, name))
		if err != nil {
			return fmt.Errorf("egress socket: %w", err)
		}
		ls = append(ls, l)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go handle(c)
			}
		}()
		return nil
	}
	proxy := func(c net.Conn) { bridge.ToUnix(c, eg.Socket) }
	if eg.ServeConn != nil {
		proxy = eg.ServeConn
	}
	if err := serve(e.Socket, proxy); err != nil {
		stop()
		return nil, func() {}, err
	}
	for i, target := range backend.LoopbackForwards(req.Network, egressPort) {
		f := boxrt.GVForward{Addr: target, Socket: "fwd" + strconv.Itoa(i) + ".sock"}
		if err := serve(f.Socket, func(c net.Conn) { bridge.Tunnel(c, eg.Socket, target) }); err != nil {
			stop()
			return nil, func() {}, err
		}
		e.Forward = append(e.Forward, f)
	}
	return e, stop, nil
}

// unmountView lazily unmounts what a command's view directory holds (the
// sandbox may still hold files of it open for a while) and removes it.
func unmountView(view string) {
	ents, _ := os.ReadDir(view)
	for _, e := range ents {
		_ = unix.Unmount(filepath.Join(view, e.Name()), unix.MNT_DETACH)
	}
	_ = os.RemoveAll(view)
}

// boundedWriter keeps the first n bytes written to it.
type boundedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
	n  int
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.n - b.w.Len(); room > 0 {
		b.w.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
