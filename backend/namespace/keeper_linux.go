package namespace

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/policy"
)

// The keeper: a process that outlives one CLI process to hold a sandbox
// init started ahead for the next one (WithKeeper).
//
// A CLI process runs one command and exits, so the init it could start
// ahead for a next command dies with it, and every `pulse exec` pays for
// an init's start (a Go runtime in fresh namespaces) on its critical path.
// The keeper is this same binary, started detached by the first CLI
// process that finds none. It listens on a socket in the state dir (0700,
// the user's), keeps one init ready per network mode and limits it has
// been asked for, and hands an init over whole: every descriptor the
// backend holds for it (config, status and stdio pipes, the dial socket,
// the run directory's lock) and a pidfd, over SCM_RIGHTS. It then starts
// the next one, off the next command's path. What the handed-over init
// does is exactly what an init the CLI started itself would do: the
// static config (namespaces, seccomp, /etc masks, hostname) is the one
// this binary makes, and everything of the command (workspace, overlay,
// binds, environment, limits' cgroups) comes from the CLI in the config
// it sends, as ever.
//
// Trust. Only a process of this user, in this process's user, pid and
// mount namespaces, gets an init: a command in a sandbox (which has a user
// namespace of its own) that could reach the socket — through a bind of
// the state dir, say — is refused, and a client refuses a keeper of
// another user or namespace. The socket's name carries the executable's
// identity (device, inode, size, modification time), so a rebuilt binary
// never adopts an init of the old one.
//
// Lifetime. The keeper exits once idle for its idle time with no client
// connected, or at once when its socket is removed or replaced;
// an init it holds is replaced once older than keeperInitAge, so that the
// /etc masks it was started with are never older than that. The keeper
// reaps an adopted init only when its adopter asks (keptInit.wait), so
// that the pid the adopter signals stays that init's; should the adopter
// die first, the keeper kills the init and reaps it. Should the keeper die,
// its inits see their config pipe close and exit (and adopted ones are
// reaped by the system's init).

// keeperEnv marks a process as a keeper; its value is the keeperSpec.
const keeperEnv = "PULSE_NAMESPACE_KEEPER"

// keeperInitAge is the oldest an init the keeper holds may be when it is
// handed over.
const keeperInitAge = time.Minute

// keeperMsgMax bounds a message on the keeper's socket.
const keeperMsgMax = 64 << 10

// keeperFds is how many descriptors a handover carries, in this order:
// config, status, stdin, stdout, stderr, dial socket, run lock, pidfd.
const keeperFds = 8

// keeperSpec is what the keeper is started with.
type keeperSpec struct {
	StateDir string        `json:"state_dir"`
	Hostname string        `json:"hostname,omitempty"`
	Name     string        `json:"name"`
	Idle     time.Duration `json:"idle"`
	First    keeperRequest `json:"first"`
}

// keeperRequest asks for an init of a network mode in the cgroups limits
// need.
type keeperRequest struct {
	NewNet bool                  `json:"new_net"`
	Limits policy.ResourceLimits `json:"limits"`
}

// keeperReply answers a request: None, or the init that comes with the
// descriptors.
type keeperReply struct {
	None   bool          `json:"none,omitempty"`
	Pid    int           `json:"pid,omitempty"`
	Run    string        `json:"run,omitempty"`
	Home   string        `json:"home,omitempty"`
	NewNet bool          `json:"new_net,omitempty"`
	Cgroup *cgroupRecord `json:"cgroup,omitempty"`
}

// keeperWaitReply is the keeper's answer to "wait": the init reaped, with
// its resource usage.
type keeperWaitReply struct {
	Reaped bool  `json:"reaped"`
	Utime  int64 `json:"utime_us"`
	Stime  int64 `json:"stime_us"`
	Maxrss int64 `json:"maxrss_kb"`
}

// cgroupRecord is a runCgroup as it crosses the keeper's socket.
type cgroupRecord struct {
	Dirs    []string `json:"dirs"`
	Bases   []string `json:"bases"`
	V1      []bool   `json:"v1"`
	Born    []bool   `json:"born"`
	Memory  string   `json:"memory"`
	V2Mem   bool     `json:"v2mem"`
	Pids    string   `json:"pids"`
	Key     string   `json:"key"`
	BornPid int      `json:"born_pid"`
	Added   int      `json:"added"`
}

func recordCgroup(c *runCgroup) *cgroupRecord {
	if c == nil {
		return nil
	}
	return &cgroupRecord{Dirs: c.dirs, Bases: c.bases, V1: c.v1, Born: c.born, Memory: c.memory,
		V2Mem: c.v2mem, Pids: c.pids, Key: c.key, BornPid: c.bornPid, Added: c.added}
}

// cgroup checks that a record names only what the keeper makes (pulse-*
// directories, each right under its base; limit files inside them) and
// returns it as a runCgroup.
func (r *cgroupRecord) cgroup() (*runCgroup, error) {
	if r == nil {
		return nil, nil
	}
	n := len(r.Dirs)
	if len(r.Bases) != n || len(r.V1) != n || len(r.Born) != n {
		return nil, errors.New("keeper: cgroup record: lengths differ")
	}
	for i, d := range r.Dirs {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d || filepath.Dir(d) != r.Bases[i] || !isPulseCgroupName(filepath.Base(d)) {
			return nil, fmt.Errorf("keeper: cgroup record: %q is not a pulse cgroup", d)
		}
	}
	for _, f := range []string{r.Memory, r.Pids} {
		if f != "" && (filepath.Clean(f) != f || !inDirs(f, r.Dirs)) {
			return nil, fmt.Errorf("keeper: cgroup record: %q is outside its cgroups", f)
		}
	}
	return &runCgroup{dirs: r.Dirs, bases: r.Bases, v1: r.V1, born: r.Born, memory: r.Memory,
		v2mem: r.V2Mem, pids: r.Pids, key: r.Key, bornPid: r.BornPid, added: r.Added}, nil
}

func isPulseCgroupName(name string) bool {
	return name != "pulse-" && strings.HasPrefix(name, "pulse-")
}

func inDirs(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || filepath.Dir(p) == d {
			return true
		}
	}
	return false
}

// keeperName names this binary's keeper for this backend's options: the
// socket is NAME.sock and the keeper's lock NAME.lock in the state dir.
// Empty when the executable cannot be told apart.
func (b *Backend) keeperName() string {
	exe, err := exeIdentity()
	if err != nil {
		return ""
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\nhostname %q\nhome %q\n", exe, b.o.hostname, sandboxHome())
	return "keeper-" + hex.EncodeToString(h.Sum(nil)[:8])
}

// keeperSocket is the keeper's socket path, or "" when there is none to
// use (no name, or a path too long for a socket address).
func (b *Backend) keeperSocket() string {
	name := b.keeperName()
	if name == "" {
		return ""
	}
	p := filepath.Join(b.o.stateDir, name+".sock")
	if len(p) >= len(unix.RawSockaddrUnix{}.Path) {
		return ""
	}
	return p
}

// adopt asks the keeper for an init of newNet in lim's cgroups. It
// returns nil when the keeper has none, cannot be trusted or is not
// running; then the caller starts its own, and, in the last case, the
// keeper too (startKeeper with the returned name), which will have an init
// ready for the next process.
func (b *Backend) adopt(newNet bool, lim policy.ResourceLimits) (p *initProc, start string) {
	sock := b.keeperSocket()
	if sock == "" {
		return nil, ""
	}
	// A state dir of another user (squatted before this user's first
	// run) holds no keeper of ours, and none is started in it. Missing,
	// it is made by this process's own init, and the keeper checks it.
	if err := checkStateDir(b.o.stateDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		b.o.logger.Debug("namespace: no keeper", slog.Any("err", err))
		return nil, ""
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
			return nil, strings.TrimSuffix(filepath.Base(sock), ".sock")
		}
		return nil, ""
	}
	p, err = b.adoptFrom(c, keeperRequest{NewNet: newNet, Limits: lim})
	if errors.Is(err, errKeeperNone) {
		// Open until this process exits: the keeper starts the next init
		// after that.
		retainUntilExit(c)
		return nil, ""
	}
	if err != nil {
		c.Close()
		b.o.logger.Warn("namespace: adopting an init from the keeper", slog.Any("err", err))
		return nil, ""
	}
	return p, ""
}

// errKeeperNone: the keeper had no init ready for the request.
var errKeeperNone = errors.New("the keeper has no init ready")

func (b *Backend) adoptFrom(c *net.UnixConn, req keeperRequest) (p *initProc, err error) {
	if err := trustedPeer(c); err != nil {
		return nil, err
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(data); err != nil {
		return nil, err
	}
	buf := make([]byte, keeperMsgMax)
	oob := make([]byte, unix.CmsgSpace(keeperFds*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	fds, err := parseRights(oob[:oobn])
	if err != nil {
		return nil, err
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		unix.CloseOnExec(fd)
		files[i] = os.NewFile(uintptr(fd), "keeper")
	}
	defer func() {
		if err != nil {
			closeAll(files...)
		}
	}()
	var rep keeperReply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		return nil, fmt.Errorf("keeper reply: %w", err)
	}
	if rep.None {
		return nil, errKeeperNone
	}
	if len(files) != keeperFds {
		return nil, fmt.Errorf("keeper reply: %d descriptors, want %d", len(files), keeperFds)
	}
	if rep.NewNet != req.NewNet || rep.Pid <= 0 || filepath.Dir(rep.Run) != b.o.stateDir || rep.Home != sandboxHome() {
		return nil, fmt.Errorf("keeper reply: not the init asked for (%+v)", rep)
	}
	cg, err := rep.Cgroup.cgroup()
	if err != nil {
		return nil, err
	}
	// An init without cgroups gets them from configure, as one started
	// here whose cgroups could not be made ahead.
	if cg != nil && cg.key != b.cgroupKey(req.Limits) {
		return nil, fmt.Errorf("keeper reply: cgroups for other limits")
	}
	_ = c.SetDeadline(time.Time{})
	dialer, err := dialerFrom(files[5])
	if err != nil {
		return nil, err
	}
	files[5] = nil
	// The command's output is read as an init of this process's own is
	// (backend.OutputPipe): the received descriptors are taken over.
	outs := [2]*backend.OutputPipe{}
	for i, name := range []string{"stdout", "stderr"} {
		fd, derr := unix.FcntlInt(files[3+i].Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if derr == nil {
			outs[i], derr = backend.OutputPipeFrom(fd, name)
			if derr != nil {
				unix.Close(fd)
			}
		}
		if derr != nil {
			closeOutputs(outs[:]...)
			return nil, fmt.Errorf("keeper reply: %s: %w", name, derr)
		}
	}
	files[3].Close()
	files[4].Close()
	p = &initProc{
		run:    &run{dir: rep.Run, lock: files[6]},
		newNet: rep.NewNet,
		home:   rep.Home,
		cfgW:   files[0], stR: files[1], stdinW: files[2], stdoutR: outs[0], stderrR: outs[1],
		dialer: dialer,
		cg:     cg,
		kept:   &keptInit{pid: rep.Pid, pidfd: files[7], conn: c},
	}
	return p, nil
}

// parseRights returns the descriptors of an SCM_RIGHTS message.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return nil, err
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

// dialerFrom makes the backend's end of the dial pair from its
// descriptor.
func dialerFrom(f *os.File) (*initDialer, error) {
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("dial socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, errors.New("dial socket: not a unix socket")
	}
	return &initDialer{c: uc}, nil
}

// trustedPeer checks that the other end of c is a process of this user in
// this process's user, pid and mount namespaces.
func trustedPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("keeper: peer credentials: %w", cerr)
	}
	if cred.Uid != uint32(os.Getuid()) || cred.Pid <= 0 {
		return fmt.Errorf("keeper: peer is uid %d, not %d", cred.Uid, os.Getuid())
	}
	for _, ns := range []string{"user", "pid", "mnt"} {
		own, err1 := os.Readlink("/proc/self/ns/" + ns)
		peer, err2 := os.Readlink("/proc/" + strconv.Itoa(int(cred.Pid)) + "/ns/" + ns)
		if err1 != nil || err2 != nil || own != peer {
			return fmt.Errorf("keeper: peer %d is not in this %s namespace", cred.Pid, ns)
		}
	}
	return nil
}

// startKeeper starts this binary as the keeper, detached, asked to have an
// init for req ready at once. A keeper already starting or running for
// the name keeps its lock and the new one exits.
func (b *Backend) startKeeper(name string, req keeperRequest) {
	spec, err := json.Marshal(keeperSpec{StateDir: b.o.stateDir, Hostname: b.o.hostname, Name: name, Idle: b.o.keeperIdle, First: req})
	if err != nil {
		return
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer null.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"pulse-namespace-keeper"}
	cmd.Env = []string{keeperEnv + "=" + string(spec), "GORACE=atexit_sleep_ms=0", "GOMAXPROCS=1"}
	// HOME: where the init mounts the command's home (sandboxHome), which
	// the adopter checks is its own.
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, null
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		b.o.logger.Debug("namespace: starting the keeper", slog.Any("err", err))
		return
	}
	// Not waited for: it outlives this process. A zombie until this
	// process exits, should it exit first.
	_ = cmd.Process.Release()
}

// keptInit is an adopter's hold on an init the keeper started: the
// keeper's connection, on which it asks the keeper to reap the init, and
// a pidfd to kill it by.
type keptInit struct {
	pid   int
	pidfd *os.File
	conn  *net.UnixConn

	// mu orders kill against wait's close of the pidfd: a kill after it
	// must not reach whatever file took the descriptor's number.
	mu     sync.Mutex
	closed bool

	once   sync.Once
	err    error
	reaped bool
	usage  *syscall.Rusage
}

func (k *keptInit) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		_ = unix.PidfdSendSignal(int(k.pidfd.Fd()), unix.SIGKILL, nil, 0)
	}
}

// closePidfd ends kill's use of the pidfd: the init is reaped.
func (k *keptInit) closePidfd() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.closed {
		k.closed = true
		k.pidfd.Close()
	}
}

// wait asks the keeper to reap the init once it has exited, and returns
// when it has. Should the keeper be gone, it waits for the init's exit on
// the pidfd (the system's init reaps it).
func (k *keptInit) wait() error {
	k.once.Do(func() {
		defer retainUntilExit(k.conn)
		defer k.closePidfd()
		if _, err := k.conn.Write([]byte("wait")); err == nil {
			buf := make([]byte, 4096)
			if n, err := k.conn.Read(buf); err == nil {
				var r keeperWaitReply
				if json.Unmarshal(buf[:n], &r) == nil && r.Reaped {
					k.reaped = true
					k.usage = &syscall.Rusage{Maxrss: r.Maxrss,
						Utime: syscall.NsecToTimeval(r.Utime * 1000), Stime: syscall.NsecToTimeval(r.Stime * 1000)}
					return
				}
			}
		}
		fds := []unix.PollFd{{Fd: int32(k.pidfd.Fd()), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if err == nil || !errors.Is(err, unix.EINTR) {
				k.err = err
				break
			}
		}
		k.reaped = k.err == nil
	})
	return k.err
}

// retained are keeper connections left open until this process exits,
// at most retainMax of them (older ones are closed): the keeper starts its
// next init when the connection closes, so that the init's start-up does
// not take a processor from the rest of this process's command (a CLI's
// audit, commit and exit), and a long-lived process does not hold the
// keeper up.
var (
	retainMu sync.Mutex
	retained []*net.UnixConn
)

const retainMax = 4

func retainUntilExit(c *net.UnixConn) {
	retainMu.Lock()
	defer retainMu.Unlock()
	if len(retained) == retainMax {
		retained[0].Close()
		retained = retained[1:]
	}
	retained = append(retained, c)
}

// runKeeper is the keeper's main; it never returns.
func runKeeper(specJSON string) {
	var spec keeperSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil || spec.Idle <= 0 || spec.Name == "" {
		os.Exit(2)
	}
	os.Exit(keep(spec))
}

type keeper struct {
	b    *Backend
	spec keeperSpec

	mu       sync.Mutex
	ready    map[string]*heldInit
	starting map[string]chan struct{} // closed when that start is over
	pending  map[string]*time.Timer   // a start scheduled (fillAfter)
	clients  int                      // connected processes, served or waiting
	last     time.Time
}

type heldInit struct {
	p    *initProc
	req  keeperRequest
	born time.Time
}

// fillDelay is how long after a client process's exit the keeper starts
// the init for the next one, unless a next one comes first. An init's
// start takes tens of milliseconds of processor: started at once, it
// would take them from whatever runs next — in a script that runs pulse
// back to back, the next pulse itself, which then finds the init still
// starting and gains nothing. Within fillDelay of the last exit a client
// is told there is none and starts its own, as without a keeper; a
// client that comes later, as an agent's next command does, finds one
// ready.
const fillDelay = 50 * time.Millisecond

// startingWait bounds how long a client waits for an init the keeper is
// starting for it, which is further along than one the client would start.
const startingWait = 100 * time.Millisecond

// keep runs the keeper until it is idle or its socket is gone.
func keep(spec keeperSpec) int {
	opts := []Option{WithStateDir(spec.StateDir), WithoutPrestart(), WithLogger(slog.New(slog.DiscardHandler)),
		func(o *options) error { o.freshMasks = true; return nil }}
	if spec.Hostname != "" {
		opts = append(opts, WithHostname(spec.Hostname))
	}
	b, err := New(opts...)
	if err != nil {
		return 2
	}
	// Its lock, its socket and its inits' runs are made in the state dir:
	// never in one that is not this user's.
	if err := b.makeStateDir(); err != nil {
		return 2
	}
	lock, err := os.OpenFile(filepath.Join(spec.StateDir, spec.Name+".lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return 2
	}
	if flock.TryLock(lock) != nil {
		return 0 // another keeper serves this name
	}
	sock := filepath.Join(spec.StateDir, spec.Name+".sock")
	_ = os.Remove(sock) // held lock: whatever is there is a dead keeper's
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		return 2
	}
	ln.SetUnlinkOnClose(false)
	st, err := os.Stat(sock)
	if err != nil {
		return 2
	}
	k := &keeper{b: b, spec: spec, ready: map[string]*heldInit{}, starting: map[string]chan struct{}{},
		pending: map[string]*time.Timer{}, last: time.Now()}
	// The process that started the keeper is running its command now.
	k.fillAfter(spec.First, 4*fillDelay)
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go k.serve(c)
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for range tick.C {
		if now, err := os.Stat(sock); err != nil || !os.SameFile(now, st) {
			break // removed or replaced: the state dir is not ours any more
		}
		k.mu.Lock()
		idle := k.clients == 0 && time.Since(k.last) > spec.Idle
		var old []*heldInit
		for key, h := range k.ready {
			if time.Since(h.born) > keeperInitAge {
				old = append(old, h)
				delete(k.ready, key)
			}
		}
		k.mu.Unlock()
		for _, h := range old {
			h.p.discard()
			if !idle {
				k.fillAfter(h.req, 0)
			}
		}
		if idle {
			break
		}
	}
	ln.Close()
	if now, err := os.Stat(sock); err == nil && os.SameFile(now, st) {
		os.Remove(sock)
	}
	k.mu.Lock()
	for _, t := range k.pending {
		t.Stop()
	}
	k.pending = map[string]*time.Timer{}
	for _, h := range k.ready {
		h.p.discard()
	}
	k.ready = map[string]*heldInit{}
	k.mu.Unlock()
	b.Close()
	// Last, and only while it is still this keeper's: a keeper starting
	// now on the unlinked file would steal nothing but a socket name,
	// which the other would see replaced and leave.
	if held, err := lock.Stat(); err == nil {
		if now, err := os.Stat(lock.Name()); err == nil && os.SameFile(now, held) {
			os.Remove(lock.Name())
		}
	}
	return 0
}

// isKeeperLock reports whether a state dir entry is a keeper's lock file.
func isKeeperLock(name string) bool {
	return strings.HasPrefix(name, "keeper-") && strings.HasSuffix(name, ".lock")
}

// reconcileKeeper removes the socket and lock file of a keeper that is
// gone (a crash, a kill): one whose lock no process holds.
func reconcileKeeper(lock string) {
	f, err := os.OpenFile(lock, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if flock.TryLock(f) == nil {
		os.Remove(strings.TrimSuffix(lock, ".lock") + ".sock")
		os.Remove(lock)
	}
}

func (k *keeper) key(req keeperRequest) string {
	return strconv.FormatBool(req.NewNet) + " " + k.b.cgroupKey(req.Limits)
}

// fillAfter starts, after d, an init for req unless one is ready or
// starting then, or a client comes for one of req's kind first (take).
func (k *keeper) fillAfter(req keeperRequest, d time.Duration) {
	key := k.key(req)
	k.mu.Lock()
	defer k.mu.Unlock()
	if t := k.pending[key]; t != nil {
		t.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		k.mu.Lock()
		if k.pending[key] != t {
			k.mu.Unlock()
			return // stopped, or scheduled again since
		}
		delete(k.pending, key)
		if k.ready[key] != nil || k.starting[key] != nil {
			k.mu.Unlock()
			return
		}
		done := make(chan struct{})
		k.starting[key] = done
		k.mu.Unlock()
		p, err := k.b.startAttached(req.NewNet, req.Limits)
		k.mu.Lock()
		delete(k.starting, key)
		if err == nil && k.ready[key] == nil {
			k.ready[key] = &heldInit{p: p, req: req, born: time.Now()}
			p = nil
		}
		close(done)
		k.mu.Unlock()
		if p != nil {
			p.discard()
		}
	})
	k.pending[key] = t
}

// take returns the init ready for key, waiting a little for one being
// started; nil if there is none. A start scheduled for key is called off:
// the client's command runs now, and the next start follows its exit.
func (k *keeper) take(key string) *heldInit {
	k.mu.Lock()
	k.last = time.Now()
	if t := k.pending[key]; t != nil {
		t.Stop()
		delete(k.pending, key)
	}
	h := k.ready[key]
	delete(k.ready, key)
	done := k.starting[key]
	k.mu.Unlock()
	if h == nil && done != nil {
		select {
		case <-done:
		case <-time.After(startingWait):
		}
		k.mu.Lock()
		h = k.ready[key]
		delete(k.ready, key)
		k.mu.Unlock()
	}
	if h != nil && time.Since(h.born) > keeperInitAge {
		h.p.discard()
		h = nil
	}
	return h
}

// serve answers one client: an init handed over (then held until the
// client asks for it to be reaped, or goes away), or none. Either way the
// next init for its kind starts fillDelay after the client has exited.
func (k *keeper) serve(c *net.UnixConn) {
	defer c.Close()
	if trustedPeer(c) != nil {
		return
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, keeperMsgMax)
	n, err := c.Read(buf)
	if err != nil {
		return
	}
	var req keeperRequest
	if err := json.Unmarshal(buf[:n], &req); err != nil {
		return
	}
	k.mu.Lock()
	k.clients++
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.clients--
		k.last = time.Now()
		k.mu.Unlock()
		k.fillAfter(req, fillDelay)
	}()
	h := k.take(k.key(req))
	if h == nil {
		none, _ := json.Marshal(keeperReply{None: true})
		if _, err := c.Write(none); err == nil {
			k.waitExit(c, buf)
		}
		return
	}
	p := h.p
	if !k.handOver(c, p) {
		p.discard()
		return
	}
	// The adopter owns the init's descriptors and run now; this process
	// only reaps it, when asked.
	closeAll(p.cfgW, p.stR, p.stdinW, p.run.lock)
	closeOutputs(p.stdoutR, p.stderrR)
	p.dialer.close()
	_ = c.SetDeadline(time.Time{})
	n, err = c.Read(buf)
	if err != nil || string(buf[:n]) != "wait" {
		p.kill() // the adopter is gone: so must its init be
	}
	_ = p.cmd.Wait()
	r := keeperWaitReply{Reaped: p.cmd.ProcessState != nil}
	if ps := p.cmd.ProcessState; ps != nil {
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && ru != nil {
			r.Utime, r.Stime, r.Maxrss = ru.Utime.Nano()/1000, ru.Stime.Nano()/1000, ru.Maxrss
		}
	}
	data, _ := json.Marshal(r)
	if _, err := c.Write(data); err == nil {
		k.waitExit(c, buf)
	}
}

// waitExit waits until the client closes c, which it keeps open until it
// exits (retainUntilExit), or for adopterExitWait.
func (k *keeper) waitExit(c *net.UnixConn, buf []byte) {
	_ = c.SetReadDeadline(time.Now().Add(adopterExitWait))
	_, _ = c.Read(buf)
}

// adopterExitWait bounds how long the keeper waits for a client to exit
// before it starts the next init anyway.
const adopterExitWait = 30 * time.Second

// handOver sends p's descriptors and a pidfd for it to c.
func (k *keeper) handOver(c *net.UnixConn, p *initProc) bool {
	pidfd, err := unix.PidfdOpen(p.pid(), 0)
	if err != nil {
		return false
	}
	defer unix.Close(pidfd)
	dial, err := p.dialer.c.File()
	if err != nil {
		return false
	}
	defer dial.Close()
	rep := keeperReply{Pid: p.pid(), Run: p.run.dir, Home: p.home, NewNet: p.newNet, Cgroup: recordCgroup(p.cg)}
	data, err := json.Marshal(rep)
	if err != nil {
		return false
	}
	fds := []int{int(p.cfgW.Fd()), int(p.stR.Fd()), int(p.stdinW.Fd()), int(p.stdoutR.Fd()), int(p.stderrR.Fd()),
		int(dial.Fd()), int(p.run.lock.Fd()), pidfd}
	_, _, err = c.WriteMsgUnix(data, unix.UnixRights(fds...), nil)
	return err == nil
}
