//go:build linux

package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/backend/internal/cacheshare"
	"github.com/pulse-agent/pulse/internal/flock"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/policy"
)

// run is Exec with runsc resolved: in the warm sandbox where one runs
// (warmOK), else in a sandbox of its own.
// onStart, when set, is called once the command is starting, with what
// signals it (Start).
func (b *Backend) run(ctx context.Context, req *backend.Request, bin, platform string, warmOK bool, onStart func(backend.Control)) (*backend.Result, error) {
	if err := b.begin(); err != nil {
		return nil, err
	}
	// What the execution leaves to undo (mounts, its directory, its
	// hold on the warm sandbox), last first, once it returns: the caller
	// has its result without waiting for unmounts and removals, which
	// touch nothing it reads. Close waits for them (running).
	var undo []func()
	defer func() {
		go func() {
			defer b.running.Done()
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}()
	}()
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	dir, err := cleanDir(req.Dir)
	if err != nil {
		return nil, err
	}
	limits := req.Limits.WithDefaults()

	id := execPrefix + randomID()
	xdir := filepath.Join(b.o.stateDir, id)
	if err := os.MkdirAll(xdir, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: %w: %w", backend.ErrUnavailable, err)
	}
	lf, err := os.Create(filepath.Join(xdir, lockName))
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %w", backend.ErrUnavailable, err)
	}
	if err := flock.TryLock(lf); err != nil {
		lf.Close()
		return nil, fmt.Errorf("gvisor: %w: lock %s: %w", backend.ErrUnavailable, xdir, err)
	}
	log := b.log.With("execution_id", req.ExecutionID, "container", id)
	undo = append(undo, func() {
		if err := teardown(xdir); err != nil {
			log.Warn("tearing down the execution's mounts", "error", err)
		}
		if err := os.RemoveAll(xdir); err != nil {
			log.Warn("removing the execution's directory", "error", err)
		}
		lf.Close()
	})

	var cg cgLimits
	b.mu.Lock()
	if b.memCgroup {
		cg = cgLimits{mem: limits.WithIsolationDefaults().MemoryBytes}
		if b.cpuCgroup {
			cg.cpus = limits.CPUs
		}
	}
	b.mu.Unlock()
	var w *warm
	// Allow-all runs cold: the warm sandbox's network is runsc's
	// --network=none, and an allow-all command gets a sandbox of its own
	// on the host's network (--network=host: gVisor's netstack serves
	// its sockets through host sockets, so the command reaches what the
	// host reaches, loopback included, as on namespace).
	allowAll := req.Network.Mode == policy.NetworkAllowAll
	if warmOK && !allowAll {
		w = b.warmFor(ctx, bin, platform, cg)
	}
	if w == nil && req.Network.Mode == policy.NetworkAllowlist {
		return nil, fmt.Errorf("gvisor: %w: network allowlist without the warm sandbox (%v)", backend.ErrUnsupported, b.coldReason())
	}
	began := time.Now()
	var res *backend.Result
	var v *view
	if w != nil {
		undo = append(undo, w.release)
		vdir := filepath.Join(w.views, id)
		if err := os.Mkdir(vdir, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %w: %w", backend.ErrUnavailable, err)
		}
		// After the command, lazily: the sandbox may hold files of the
		// view open for a while (gVisor's dentry cache). The workspace
		// overlay among them: the command and its processes are gone,
		// nothing writes it any more, and its upper layer is read from
		// the host's side.
		undo = append(undo, func() { unmountView(vdir) })
		v, err = mountView(xdir, filepath.Join(vdir, "ws"), req, limits.DiskBytes)
		if err != nil {
			return nil, viewErr(err)
		}
		caches, err := mountCaches(vdir, req.Caches)
		if err != nil {
			return nil, fmt.Errorf("gvisor: %w: %w", backend.ErrUnavailable, err)
		}
		egress, stopEgress, err := startEgress(vdir, req)
		if err != nil {
			return nil, fmt.Errorf("gvisor: %w: %w", backend.ErrUnavailable, err)
		}
		undo = append(undo, stopEgress)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("gvisor: nothing started: %w", err)
		}
		res, err = b.runWarm(ctx, w, req, limits, id, dir, caches, egress, onStart)
		if err != nil {
			return nil, err
		}
	} else {
		v, err = mountView(xdir, "", req, limits.DiskBytes)
		if err != nil {
			return nil, viewErr(err)
		}
		if err := writeBundle(xdir, id, req, dir, limits, cg); err != nil {
			return nil, fmt.Errorf("gvisor: %w: bundle: %w", backend.ErrUnavailable, err)
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("gvisor: nothing started: %w", err)
		}
		res, err = b.sandbox(ctx, req, limits, bin, platform, xdir, id, log, onStart)
		if err != nil {
			return nil, err
		}
		// The sandbox is gone; nothing writes the upper layer any more.
		if err := unix.Unmount(v.merged, 0); err != nil {
			log.Warn("unmounting the workspace overlay", "error", err)
		}
	}
	// The Sentry applied the command's umask to what it made in its
	// caches, which a host kernel would not have done under their default
	// ACL: give it what the other backends' commands need (cacheshare).
	for _, c := range req.Caches {
		if err := cacheshare.WidenSince(c.HostDir, began); err != nil {
			log.Warn("sharing what the command made in a cache", "cache", c.Name, "error", err)
		}
	}
	if res.Termination == backend.Exited && diskFull(v.scratch) {
		res.Termination = backend.DiskLimit
	}
	var st unix.Statfs_t
	if unix.Statfs(v.scratch, &st) == nil {
		res.Metrics.DiskBytes = int64(st.Blocks-st.Bfree) * st.Bsize
	}
	ov, err := capture(v.upper, v.lower)
	if err != nil {
		return res, fmt.Errorf("gvisor: %w: %w", backend.ErrOverlayLost, err)
	}
	res.Overlay = ov
	return res, nil
}

func viewErr(err error) error {
	if errors.Is(err, backend.ErrInvalidRequest) {
		return fmt.Errorf("gvisor: %w", err)
	}
	return fmt.Errorf("gvisor: %w: workspace view: %w", backend.ErrUnavailable, err)
}

// diskFull reports a scratch tmpfs with no block or inode left: the
// command's writes met the disk bound.
func diskFull(scratch string) bool {
	var st unix.Statfs_t
	if unix.Statfs(scratch, &st) != nil {
		return false
	}
	return st.Bavail == 0 || st.Ffree == 0
}

// sandbox runs the bundle in xdir to its end.
func (b *Backend) sandbox(ctx context.Context, req *backend.Request, limits policy.ResourceLimits, bin, platform, xdir, id string, log interface {
	Warn(string, ...any)
}, onStart func(backend.Control)) (*backend.Result, error) {
	root := b.runscRoot()
	network := "--network=none"
	if req.Network.Mode == policy.NetworkAllowAll {
		network = "--network=host"
	}
	flags := []string{"--root", root, network, "--platform=" + platform, "run"}
	var cons *console
	if req.TTY != nil {
		var err error
		if cons, err = listenConsole(); err != nil {
			return nil, fmt.Errorf("gvisor: %w: console socket: %w", backend.ErrUnavailable, err)
		}
		defer cons.close()
		flags = append(flags, "--console-socket", cons.path())
	}
	cmd := exec.Command(bin, append(flags, "--bundle", xdir, id)...)
	// runsc's own process group, so that a last resort can kill it whole;
	// Pdeathsig so that it does not outlive this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay
	capHit := make(chan struct{})
	var capOnce sync.Once
	onCap := func() { capOnce.Do(func() { close(capHit) }) }
	stdout := &capWriter{w: req.Stdout, limit: limits.OutputBytes, onCap: onCap}
	stderr := &capWriter{w: req.Stderr, limit: limits.OutputBytes, onCap: onCap}
	if req.Stdout != nil {
		cmd.Stdout = stdout
	}
	if req.Stderr != nil {
		cmd.Stderr = stderr
	}
	var stdinW *os.File
	if req.Stdin != nil && cons == nil {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("gvisor: %w: stdin pipe: %w", backend.ErrUnavailable, err)
		}
		cmd.Stdin, stdinW = r, w
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		if stdinW != nil {
			stdinW.Close()
			cmd.Stdin.(*os.File).Close()
		}
		return nil, fmt.Errorf("gvisor: %w: start runsc: %w", backend.ErrUnavailable, err)
	}
	if stdinW != nil {
		cmd.Stdin.(*os.File).Close()
		go func() {
			// An error means the command closed its stdin or ended:
			// nothing left to deliver.
			_, _ = io.Copy(stdinW, req.Stdin)
			stdinW.Close()
		}()
	}
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		close(exited)
		done <- err
	}()
	ctl := &control{bin: bin, root: root, id: id, exited: exited, hostNet: req.Network.Mode == policy.NetworkAllowAll}
	if cons != nil {
		// The terminal's output is the command's: runsc prints only its
		// own errors to stderr.
		var out io.Writer = stdout
		if req.Stdout == nil {
			out = io.Discard
		}
		cons.serve(ctx, exited, req.TTY.Rows, req.TTY.Cols, out, req.Stdin)
		if onStart != nil {
			onStart(&ttyControl{control: ctl, c: cons})
		}
	} else if onStart != nil {
		onStart(ctl)
	}

	timer := time.NewTimer(limits.Timeout)
	defer timer.Stop()
	var reason backend.TerminationReason
	var waitErr error
	select {
	case waitErr = <-done:
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
		waitErr = b.kill(bin, root, id, cmd, done)
	}
	duration := time.Since(start)
	if stdinW != nil {
		stdinW.Close()
		closeReader(req.Stdin)
	}
	if cons != nil {
		// All of the terminal's output, before what was cut is told.
		cons.close()
		if req.Stdin != nil {
			closeReader(req.Stdin)
		}
	}
	if errors.Is(waitErr, exec.ErrWaitDelay) {
		log.Warn("output pipes still open after the sandbox ended", "wait_delay", waitDelay)
	}
	if reason != "" || waitErr != nil && cmd.ProcessState.ExitCode() < 0 {
		// runsc deletes the container when run returns by itself; one
		// that was killed, or ended by a signal, may not have.
		_ = exec.Command(bin, "--root", root, "delete", "--force", id).Run()
	}

	res := &backend.Result{Duration: duration, Truncated: stdout.truncated() || stderr.truncated()}
	code := cmd.ProcessState.ExitCode()
	switch {
	case reason != "":
		res.Termination, res.ExitCode = reason, -1
	case code > 128 && code <= 128+64:
		// runsc reports a command killed by signal n as 128+n.
		res.Termination, res.ExitCode = backend.Signaled, -1
	case code < 0:
		res.Termination, res.ExitCode = backend.Signaled, -1
	default:
		res.Termination, res.ExitCode = backend.Exited, code
	}
	res.TimedOut = res.Termination == backend.Timeout
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru != nil {
		res.Metrics.UserCPU = time.Duration(ru.Utime.Nano())
		res.Metrics.SystemCPU = time.Duration(ru.Stime.Nano())
	}
	return res, nil
}

// kill ends the sandbox: its init gets SIGKILL through runsc, which takes
// every process of the sandbox with it; if runsc run has not returned
// after a while, its process group is killed.
func (b *Backend) kill(bin, root, id string, cmd *exec.Cmd, done <-chan error) error {
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_ = exec.Command(bin, "--root", root, "kill", id, "KILL").Run()
		select {
		case err := <-done:
			return err
		case <-tick.C:
		case <-deadline:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = exec.Command(bin, "--root", root, "delete", "--force", id).Run()
			return <-done
		}
	}
}

// control signals a started command through runsc.
type control struct {
	bin, root, id string
	exited        <-chan struct{}
	hostNet       bool // the sandbox is on the host's network (allow-all)
}

// DialPort implements backend.PortDialer for a cold command on the
// host's network (allow-all): its ports are the host's, reached as the
// namespace backend reaches an allow-all command's. Any other cold
// command has a network stack of its own inside gVisor, which only the
// runtime of a warm sandbox reaches into.
func (c *control) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("gvisor: %w: port %d", backend.ErrInvalidRequest, port)
	}
	select {
	case <-c.exited:
		return nil, backend.ErrProcessDone
	default:
	}
	if !c.hostNet {
		return nil, fmt.Errorf("gvisor: %w: a port of a cold command in a network stack of its own (no runtime in its sandbox to reach it)", backend.ErrUnsupported)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

// Signal sends sig to the command's main process (the container's init).
// Until runsc has made the container there is none to signal: it tries
// again for a while.
func (c *control) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("gvisor: %w: signal %v", backend.ErrUnsupported, sig)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.Command(c.bin, "--root", c.root, "kill", c.id, strconv.Itoa(int(s))).CombinedOutput()
		if err == nil {
			return nil
		}
		select {
		case <-c.exited:
			return backend.ErrProcessDone
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gvisor: signal %v: %w: %s", sig, err, strings.TrimSpace(string(out)))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkRequest checks what Exec refuses before anything is made.
func checkRequest(req *backend.Request) error {
	if err := backend.CheckCommand(req); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	if req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0) {
		return fmt.Errorf("gvisor: %w: terminal size %dx%d", backend.ErrInvalidRequest, req.TTY.Rows, req.TTY.Cols)
	}
	if !filepath.IsAbs(req.Workspace) || filepath.Clean(req.Workspace) != req.Workspace {
		return fmt.Errorf("gvisor: %w: workspace %q is not a clean absolute path", backend.ErrInvalidRequest, req.Workspace)
	}
	if st, err := os.Stat(req.Workspace); err != nil || !st.IsDir() {
		return fmt.Errorf("gvisor: %w: workspace %q is not a directory", backend.ErrInvalidRequest, req.Workspace)
	}
	switch req.Network.Mode {
	case "", policy.NetworkDenyAll:
	case policy.NetworkAllowlist:
		// Through the egress proxy, bridged in by the warm sandbox's
		// runtime (run refuses it where commands run cold).
		e := req.Egress
		if e == nil || e.Socket == "" {
			return fmt.Errorf("gvisor: %w: network allowlist needs the egress proxy (Request.Egress)", backend.ErrUnsupported)
		}
		for _, p := range []string{e.Socket, e.CAFile} {
			if p != "" && !filepath.IsAbs(p) {
				return fmt.Errorf("gvisor: %w: egress path %q is not absolute", backend.ErrInvalidRequest, p)
			}
		}
		if st, err := os.Stat(e.Socket); err != nil || st.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("gvisor: %w: egress socket %q is not a socket", backend.ErrInvalidRequest, e.Socket)
		}
	case policy.NetworkAllowAll:
	default:
		return fmt.Errorf("gvisor: %w: unknown network mode %q", backend.ErrInvalidRequest, req.Network.Mode)
	}
	for _, h := range req.Hidden {
		if h == "" || h == "." || path.Clean(h) != h || path.IsAbs(h) || h == ".." || strings.HasPrefix(h, "../") {
			return fmt.Errorf("gvisor: %w: hidden path %q", backend.ErrInvalidRequest, h)
		}
	}
	if err := backend.CheckCaches(req.Caches, req.Workspace); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	for _, c := range req.Caches {
		if c.Path == "/" || c.Path == "/proc" || c.Path == "/dev" || strings.HasPrefix(c.Path, "/proc/") || strings.HasPrefix(c.Path, "/dev/") {
			return fmt.Errorf("gvisor: %w: cache %s at %s", backend.ErrInvalidRequest, c.Name, c.Path)
		}
	}
	return nil
}

// cleanDir turns Request.Dir into a slash path relative to the workspace,
// refusing anything that would leave it. "" and "." are the root.
func cleanDir(dir string) (string, error) {
	if dir == "" {
		return ".", nil
	}
	if strings.HasPrefix(dir, "/") {
		return "", fmt.Errorf("gvisor: %w: dir %q is absolute", backend.ErrInvalidRequest, dir)
	}
	c := path.Clean(dir)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("gvisor: %w: dir %q leaves the workspace", backend.ErrInvalidRequest, dir)
	}
	if pathguard.IsReserved(c) {
		return "", fmt.Errorf("gvisor: %w: dir %q is inside .pulse", backend.ErrInvalidRequest, dir)
	}
	return c, nil
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// capWriter passes output on up to limit bytes and calls onCap at the
// first byte over it; the excess is dropped.
type capWriter struct {
	mu      sync.Mutex
	w       io.Writer
	limit   int64
	n       int64
	over    bool
	onCap   func()
	werrSet bool
}

func (c *capWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	if c.limit > 0 && c.n+int64(len(p)) > c.limit {
		p = p[:c.limit-c.n]
		if !c.over {
			c.over = true
			c.onCap()
		}
	}
	c.n += int64(len(p))
	if len(p) > 0 && !c.werrSet {
		if _, err := c.w.Write(p); err != nil {
			// A caller's writer that fails gets nothing more; the
			// command is not ended for it.
			c.werrSet = true
		}
	}
	return n, nil
}

func (c *capWriter) truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.over
}

// spec is the part of an OCI runtime spec this backend writes.
type spec struct {
	OCIVersion string  `json:"ociVersion"`
	Process    process `json:"process"`
	Root       struct {
		Path     string `json:"path"`
		Readonly bool   `json:"readonly"`
	} `json:"root"`
	Hostname string  `json:"hostname"`
	Mounts   []mount `json:"mounts"`
	Linux    struct {
		Namespaces  []nsSpec   `json:"namespaces"`
		CgroupsPath string     `json:"cgroupsPath,omitempty"`
		Resources   *resources `json:"resources,omitempty"`
	} `json:"linux"`
}

type resources struct {
	Memory struct {
		Limit int64 `json:"limit"`
	} `json:"memory"`
	CPU *cpuSpec `json:"cpu,omitempty"`
}

type nsSpec struct {
	Type string `json:"type"`
}

type cpuSpec struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
}

// cgLimits are the limits a sandbox's host cgroups hold: mem its memory
// (0: no cgroup), cpus its CPU time in cores (0: unbounded). A warm
// sandbox serves the commands of one cgLimits.
type cgLimits struct {
	mem  int64
	cpus float64
}

// cpuPeriod is the CFS period of a cpus limit, as on namespace.
const cpuPeriod = 100000

type process struct {
	Terminal bool `json:"terminal"`
	User     struct {
		UID            uint32   `json:"uid"`
		GID            uint32   `json:"gid"`
		AdditionalGids []uint32 `json:"additionalGids,omitempty"`
	} `json:"user"`
	Args            []string       `json:"args"`
	Env             []string       `json:"env"`
	Cwd             string         `json:"cwd"`
	Capabilities    map[string]any `json:"capabilities"`
	Rlimits         []rlimit       `json:"rlimits,omitempty"`
	NoNewPrivileges bool           `json:"noNewPrivileges"`
}

type rlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

// systemDirs are bound read-only from the host where they are
// directories (a merged-/usr symlink is made as the same symlink).
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}

// maskedFiles are hidden behind an empty file: password hashes and
// secret stores under /etc.
var maskedFiles = []string{"/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers", "/etc/ssh/ssh_host_rsa_key",
	"/etc/ssh/ssh_host_ecdsa_key", "/etc/ssh/ssh_host_ed25519_key", "/etc/ssl/private"}

const home = "/root"

// baseSpec makes xdir's empty root with the mount points of what every
// sandbox has (the host's system directories, read-only, with secrets
// masked; /proc; /dev) and the spec that mounts them. mkpoint makes
// another mount point in that root.
func baseSpec(xdir, id string, cg cgLimits) (s *spec, mkpoint func(string) error, err error) {
	rootfs := filepath.Join(xdir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, nil, err
	}
	empty := filepath.Join(xdir, "empty")
	if err := os.WriteFile(empty, nil, 0o444); err != nil {
		return nil, nil, err
	}
	emptyDir := filepath.Join(xdir, "emptydir")
	if err := os.Mkdir(emptyDir, 0o555); err != nil {
		return nil, nil, err
	}
	s = &spec{}
	s.OCIVersion = "1.0.2"
	s.Root.Path, s.Root.Readonly = rootfs, true
	s.Hostname = "pulse"
	for _, ns := range []string{"pid", "network", "ipc", "uts", "mount"} {
		s.Linux.Namespaces = append(s.Linux.Namespaces, nsSpec{ns})
	}
	if cg.mem > 0 {
		s.Linux.CgroupsPath = "/pulse-gvisor/" + id
		s.Linux.Resources = &resources{}
		s.Linux.Resources.Memory.Limit = cg.mem
		if cg.cpus > 0 {
			// The whole sandbox's: gVisor's kernel serving the command
			// counts too, so the command gets at most this much.
			s.Linux.Resources.CPU = &cpuSpec{Quota: max(int64(cg.cpus*cpuPeriod), 1000), Period: cpuPeriod}
		}
	}
	s.Mounts = append(s.Mounts, mount{Destination: "/proc", Type: "proc", Source: "proc"},
		mount{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}})
	// Mount points of the read-only root: made here, on the host, since
	// the sandbox cannot make them in a read-only root.
	mkpoint = func(p string) error {
		return os.MkdirAll(filepath.Join(rootfs, filepath.FromSlash(p)), 0o755)
	}
	for _, d := range systemDirs {
		st, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case st.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(d)
			if err != nil {
				return nil, nil, err
			}
			if err := os.Symlink(t, filepath.Join(rootfs, d)); err != nil {
				return nil, nil, err
			}
		case st.IsDir():
			if err := mkpoint(d); err != nil {
				return nil, nil, err
			}
			s.Mounts = append(s.Mounts, mount{Destination: d, Type: "bind", Source: d, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
		}
	}
	for _, m := range maskedFiles {
		st, err := os.Lstat(m)
		if err != nil {
			continue
		}
		src := empty
		if st.IsDir() {
			src = emptyDir
		} else if !st.Mode().IsRegular() {
			continue
		}
		s.Mounts = append(s.Mounts, mount{Destination: m, Type: "bind", Source: src, Options: []string{"bind", "ro"}})
	}
	return s, mkpoint, nil
}

// writeBundle writes xdir/config.json and the root it names.
// cg.mem > 0 puts the sandbox in a memory cgroup of that size (and a cpu
// one of cg.cpus), which
// runsc makes (and removes) under each hierarchy's root.
func writeBundle(xdir, id string, req *backend.Request, dir string, limits policy.ResourceLimits, cg cgLimits) error {
	s, mkpoint, err := baseSpec(xdir, id, cg)
	if err != nil {
		return err
	}
	if req.Network.Mode == policy.NetworkAllowAll {
		// The host's network (runsc --network=host): no network
		// namespace of the sandbox's own.
		s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(n nsSpec) bool { return n.Type == "network" })
	}
	for _, d := range []string{"/tmp", home} {
		if err := mkpoint(d); err != nil {
			return err
		}
		s.Mounts = append(s.Mounts, mount{Destination: d, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}})
	}
	if err := mkpoint(req.Workspace); err != nil && !underTmpfs(req.Workspace) {
		return err
	}
	s.Mounts = append(s.Mounts, mount{Destination: req.Workspace, Type: "bind", Source: filepath.Join(xdir, "merged"), Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	for _, c := range req.Caches {
		if err := mkpoint(c.Path); err != nil && !underTmpfs(c.Path) {
			return err
		}
		if err := cacheshare.Share(c.HostDir); err != nil {
			return fmt.Errorf("cache %s: %w", c.Name, err)
		}
		s.Mounts = append(s.Mounts, mount{Destination: c.Path, Type: "bind", Source: c.HostDir, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}

	p := &s.Process
	p.Cwd = path.Join(req.Workspace, dir)
	// The caches' sharing group (cacheshare): the Sentry checks mode bits
	// only, whose group class shows the ACL's mask.
	p.User.AdditionalGids = []uint32{cacheshare.GID}
	p.NoNewPrivileges = true
	// No capability in any set: root of the sandbox, but it can neither
	// mount, nor trace, nor pass file permissions.
	p.Capabilities = map[string]any{"bounding": []string{}, "effective": []string{}, "inheritable": []string{}, "permitted": []string{}, "ambient": []string{}}
	if limits.FileSizeBytes > 0 {
		p.Rlimits = append(p.Rlimits, rlimit{Type: "RLIMIT_FSIZE", Hard: uint64(limits.FileSizeBytes), Soft: uint64(limits.FileSizeBytes)})
	}
	p.Rlimits = append(p.Rlimits, rlimit{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20})
	p.Env, p.Args = commandLine(req)
	p.Terminal = req.TTY != nil
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(xdir, "config.json"), b, 0o600)
}

// commandLine is the environment and argv a request's command runs with.
func commandLine(req *backend.Request) (env, args []string) {
	base := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": home,
		"LANG": "C.UTF-8",
		"TERM": "dumb",
		"USER": "root",
	}
	if req.TTY != nil {
		base["TERM"] = "xterm-256color"
	}
	env = backend.Environ(base, req.Env)
	if req.Shell != "" {
		sh := "/bin/sh"
		if _, err := os.Stat("/bin/bash"); err == nil {
			sh = "/bin/bash"
		}
		args = []string{sh, "-c", req.Shell}
	} else {
		// Through sh's exec, so that a program that is not there is
		// exit status 127 from the shell, as on the other backends, not
		// runsc failing to start the sandbox (status 128, its own words).
		args = append([]string{"/bin/sh", "-c", `exec "$0" "$@"`}, req.Args...)
	}
	return env, args
}

// underTmpfs reports a path the sandbox mounts a tmpfs above, where runsc
// makes the mount point itself.
func underTmpfs(p string) bool {
	return strings.HasPrefix(p, "/tmp/") || strings.HasPrefix(p, home+"/")
}
