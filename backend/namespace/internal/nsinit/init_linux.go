package nsinit

import (
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
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/internal/pty"
)

// Init turns this process into a sandbox init when the backend started it,
// and returns at once otherwise (package namespace's Init, which is what
// programs call). In a sandbox init it never returns: it sets the sandbox
// up, runs the command as its child, reports how the command ended to the
// backend and exits.
func Init() {
	v, ok := os.LookupEnv(Env)
	if !ok {
		return
	}
	// Capabilities, no_new_privs, landlock and seccomp are per thread:
	// they are set on this thread, which then forks the command.
	runtime.LockOSThread()
	status := os.NewFile(StatusFd, "status")
	if os.Getenv(TraceEnv) == "1" {
		traceTo = status
	}
	phase("init")
	err := initSandbox(v, status)
	if status != nil {
		fmt.Fprintf(status, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
	}
	syscall.Exit(126)
}

// The status protocol, one line each, init to backend:
//
//	error <message>   setup failed; nothing was started
//	started <pid>     the command runs, as pid <pid> of the namespace
//	exit <status>     the command ended; <status> is its raw wait status
//	ended <maxrss KiB> <user µs> <system µs>
//	                  no other process is left in the namespace (all were
//	                  killed and reaped), with the resources they used;
//	                  the init closes its pipes and exits
//
// The init stays pid 1 of the namespace rather than exec'ing the command:
// a pid 1 ignores the signals it has no handler for, so a command that
// signals itself ("kill -TERM $$") would survive; and orphans need a
// reaper. When the init exits, the kernel kills what is left.

func initSandbox(version string, status *os.File) error {
	version, parentID, _ := strings.Cut(version, " ")
	if version != Version {
		return fmt.Errorf("init protocol %q, want %q (parent and child binaries differ)", version, Version)
	}
	if err := checkIdentity(parentID); err != nil {
		return err
	}
	if status == nil {
		return errors.New("no status pipe")
	}
	// Descriptors the caller held open without close-on-exec (a shell's
	// `exec 8>>file`, `exec 9</`) were inherited through the exec of this
	// init; none may reach the command, which could write a host file
	// past the overlay or walk the host's tree from a directory fd (the
	// CVE-2024-21626 class). Everything above stderr is close-on-exec
	// from here on, the config and status pipes included.
	if err := closeFromOnExec(3); err != nil {
		return err
	}
	go serveDials(DialFd) // expose_linux.go
	f := os.NewFile(ConfigFd, "config")
	if f == nil {
		return errors.New("no config pipe")
	}
	// Two configs arrive on the pipe: first what does not depend on the
	// request, sent as soon as the init starts (so an init started ahead
	// does most of its setup before any request exists), then the
	// request's own.
	dec := newConfigDecoder(io.LimitReader(f, 4<<20)) // decode_linux.go
	var static Config
	if err := dec.decode(&static); err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	phase("static-config")
	if err := setupStatic(&static); err != nil {
		return err
	}
	phase("static-setup")
	// The threads a pids-limited command needs the init to have (see
	// spareThreads) are made now, while the init waits for its request
	// (the time an init started ahead spends idle), instead of on the
	// request's critical path: making them there took 3-5 ms of a cold
	// Exec on a busy machine. The call after the request mounts then finds
	// them and only lets the goroutines started since settle.
	spareThreads(3)
	var cfg Config
	if err := dec.decode(&cfg); err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	phase("request-config")
	cfg.Root, cfg.Home, cfg.NewNet = static.Root, static.Home, static.NewNet
	cfg.LastCap, cfg.Seccomp = static.LastCap, static.Seccomp
	// The backend holds the config pipe open until it has what it needs
	// from us. EOF means the backend's process is gone: end the sandbox
	// (the kernel kills the rest of the namespace with us).
	go controlLines(io.MultiReader(dec.buffered(), f)) // tty_linux.go
	if err := setupRequest(&cfg); err != nil {
		return err
	}
	phase("request-mounts")
	if err := os.Chdir(cfg.Dir); err != nil {
		return fmt.Errorf("chdir %s: %w", cfg.Dir, err)
	}
	if cfg.PidsLimited {
		spareThreads(2)
	}
	if err := setRlimits(&cfg); err != nil {
		return err
	}
	stdio := []uintptr{0, 1, 2}
	ptySlave := -1
	if cfg.TTY != nil {
		master, slave, err := pty.Open(cfg.TTY.Rows, cfg.TTY.Cols)
		if err != nil {
			return err
		}
		ptySlave = slave
		stdio = []uintptr{uintptr(slave), uintptr(slave), uintptr(slave)}
		relayPTY(master)
	}
	path, argv, err := resolveCommand(&cfg)
	notFound := errors.Is(err, errNotFound)
	if err != nil && !notFound {
		return err
	}
	phase("resolve")
	spareThread()
	if err := restrictSelf(&cfg); err != nil {
		return err
	}
	phase("restrict")
	if notFound {
		// Like a shell: the command was asked for but cannot exist here.
		fmt.Fprintf(os.Stderr, "%s: command not found\n", cfg.Args[0])
		fmt.Fprintf(status, "started 0\nexit %d\n", 127<<8)
		syscall.Exit(0)
	}
	// The command leads a session of its own as well: no controlling
	// terminal, and no way to signal the init's process group.
	// On a terminal, it is the session's controlling terminal.
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Env:   cfg.Env,
		Files: stdio,
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: ptySlave >= 0, Ctty: 0},
	})
	if ptySlave >= 0 {
		unix.Close(ptySlave) // EIO on the master once the command's side is gone
	}
	if err != nil {
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOEXEC) {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			fmt.Fprintf(status, "started 0\nexit %d\n", 126<<8)
			syscall.Exit(0)
		}
		return fmt.Errorf("starting %s: %w", path, err)
	}
	phase("fork-exec")
	fmt.Fprintf(status, "started %d\n", pid)
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			fmt.Fprintf(status, "error waiting for the command: %v\n", err)
			syscall.Exit(126)
		}
		if wpid == pid {
			phase("command")
			fmt.Fprintf(status, "exit %d\n", uint32(ws))
			endNamespace(status)
		}
		// An orphan reparented to us: reaped, nothing more.
	}
}

// endNamespace kills and reaps every process left in the namespace, says
// so on the status pipe with the resources they used, closes the pipes the
// backend reads and exits. The kernel would kill the rest when the init
// exits, but only after tearing down the init's namespaces and mounts,
// which delays the EOFs the backend waits for by a millisecond or more;
// once the namespace is empty that wait tells the backend nothing.
func endNamespace(status *os.File) {
	for {
		// From pid 1, -1 is every other process of the namespace. A
		// process forking meanwhile cannot leave a child behind: fork
		// fails once SIGKILL is pending. Kill again after each reap in
		// case a child was created just before.
		_ = unix.Kill(-1, unix.SIGKILL)
		var ws unix.WaitStatus
		_, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			break // ECHILD: nothing left but this process
		}
	}
	drainPTY()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru); err != nil {
		syscall.Exit(0) // no "ended": the backend waits for the exit
	}
	fmt.Fprintf(status, "ended %d %d %d\n", ru.Maxrss, ru.Utime.Nano()/1000, ru.Stime.Nano()/1000)
	_ = unix.Close(0)
	_ = unix.Close(1)
	_ = unix.Close(2)
	status.Close()
	syscall.Exit(0)
}

func resolveCommand(cfg *Config) (string, []string, error) {
	for _, kv := range cfg.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			os.Setenv("PATH", v)
		}
	}
	if cfg.Shell != "" {
		for _, sh := range []string{"bash", "sh"} {
			if p, err := exec.LookPath(sh); err == nil {
				return p, []string{sh, "-c", cfg.Shell}, nil
			}
		}
		return "", nil, errors.New("neither bash nor sh in the sandbox")
	}
	p, err := exec.LookPath(cfg.Args[0])
	if err != nil {
		return "", nil, errNotFound
	}
	return p, cfg.Args, nil
}

// systemDirs are bound read-only into every sandbox when the host has them.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}

// procMasked are the /proc entries the command must not read, hidden as
// Docker's default MaskedPaths hides them, with the memory-layout files it
// leaves to capabilities: the command runs as the caller's uid, and for a
// root caller root-only files are readable without any. They tell of the
// host kernel's memory (page flags, counts and cgroups by frame, slab,
// vmalloc and free-page lists, /proc/kcore), its timers and scheduler,
// every key's description, and interrupt counts (a side channel on the
// other tenants). Entries this kernel lacks are skipped.
var procMasked = []string{
	"kpageflags", "kpagecount", "kpagecgroup", "slabinfo", "vmallocinfo", "pagetypeinfo",
	"kcore", "keys", "timer_list", "timer_stats", "sched_debug", "latency_stats", "interrupts",
	"acpi", "asound", "scsi",
}

// procReadOnly are the /proc entries that are the kernel's knobs (Docker's
// default ReadonlyPaths): readable, but, for a root caller, otherwise
// writable from the sandbox.
var procReadOnly = []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}

// setupStatic is the part of the setup that does not depend on the
// request: everything but the workspace, the extra binds and pivot_root.
func setupStatic(cfg *Config) error {
	// Nothing done here may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	root := cfg.Root
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mounting root tmpfs: %w", err)
	}
	for _, d := range systemDirs {
		st, err := os.Lstat(d)
		if err != nil {
			continue
		}
		if st.Mode()&os.ModeSymlink != 0 {
			// usrmerge: /bin -> usr/bin and friends.
			t, err := os.Readlink(d)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, root+d); err != nil {
				return err
			}
			continue
		}
		if !st.IsDir() {
			continue
		}
		if err := bindReadOnly(d, root+d); err != nil {
			return err
		}
	}
	phase("system-binds")
	for _, m := range cfg.Mask {
		if err := mask(root + m); err != nil {
			return err
		}
	}
	if err := mountTmpfs(root+"/tmp", "mode=1777"); err != nil {
		return err
	}
	if err := mountTmpfs(root+cfg.Home, "mode=0700"); err != nil {
		return err
	}
	phase("masks-tmp-home")
	if err := setupDev(root); err != nil {
		return err
	}
	phase("dev")
	if err := os.MkdirAll(root+"/proc", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("proc", root+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	for _, m := range procMasked {
		if err := mask(root + "/proc/" + m); err != nil {
			return err
		}
	}
	for _, p := range procReadOnly {
		if err := readOnlyInPlace(root + "/proc/" + p); err != nil {
			return err
		}
	}
	phase("proc")
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if cfg.NewNet {
		if err := loopbackUp(); err != nil {
			return fmt.Errorf("bringing lo up: %w", err)
		}
	}
	phase("hostname-lo")
	// Signals the command sends to pid 1 reach the init only if it
	// handles them, and the Go runtime handles most from the start. Of
	// those, the ones whose runtime handling would end (or crash) the
	// init must not reach the runtime; the others either stay at their
	// default disposition, which the kernel ignores for a namespace's pid
	// 1, or reach a runtime handler that ignores them.
	// TestInitSurvivesSignals sends every signal to prove the sets below
	// suffice, and TestCommandSignalsDefault that the command still
	// starts with every signal at its default.
	if err := takeSignals(); err != nil {
		return err
	}
	phase("signals")
	// Not dumpable: the command, with the same uid, cannot open the init's
	// /proc files (mem, environ, fds) while the init keeps capabilities on
	// its other threads.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl dumpable: %w", err)
	}
	return nil
}

// setupRequest mounts the request's workspace and binds into the root
// setupStatic prepared, and pivots into it.
func setupRequest(cfg *Config) error {
	root := cfg.Root
	if err := mountScratch(cfg); err != nil { // scratch_linux.go
		return err
	}
	if err := mountWorkspace(cfg); err != nil {
		return err
	}
	for _, p := range cfg.ReadOnly {
		if err := bindChecked(p, root+p, cfg.Workspace, false); err != nil {
			return err
		}
	}
	for _, p := range cfg.ReadWrite {
		if err := bindChecked(p, root+p, cfg.Workspace, true); err != nil {
			return err
		}
	}
	for _, c := range cfg.Caches {
		// Outside the workspace overlay: the command's writes land in
		// the host directory itself, never in the captured upper layer.
		if err := bindChecked(c.Src, root+c.Dst, cfg.Workspace, true); err != nil {
			return fmt.Errorf("cache: %w", err)
		}
	}
	if err := mountEgress(cfg); err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the old root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := setReadOnly("/", false); err != nil {
		return err
	}
	return startForwarder(cfg)
}

func mountWorkspace(cfg *Config) error {
	dst := cfg.Root + cfg.Workspace
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("workspace mount point: %w", err)
	}
	if len(cfg.Layers) > 0 {
		if err := mountStacked(cfg, dst); err != nil {
			return err
		}
	} else {
		opts := "lowerdir=" + cfg.Workspace + ",upperdir=" + cfg.Upper + ",workdir=" + cfg.Work
		// userxattr: in a user namespace overlayfs cannot set trusted.*
		// xattrs; opaque directories are marked with user.overlay.opaque.
		err := unix.Mount("overlay", dst, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts+",userxattr")
		if errors.Is(err, unix.EINVAL) {
			err = unix.Mount("overlay", dst, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts)
		}
		if err != nil {
			return fmt.Errorf("mounting the workspace overlay: %w", err)
		}
	}
	// .pulse/ holds the transactions and audit log: the command must
	// neither read nor create it. Creating the mount point writes an
	// empty directory to the upper layer, which the overlay reader skips.
	p := dst + "/.pulse"
	st, err := os.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.Mkdir(p, 0o755); err != nil {
			return fmt.Errorf("hiding .pulse: %w", err)
		}
	case err != nil:
		return fmt.Errorf("hiding .pulse: %w", err)
	case !st.IsDir():
		return mask(p)
	}
	if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0755"); err != nil {
		return fmt.Errorf("hiding .pulse: %w", err)
	}
	return nil
}

func mountTmpfs(dst, opts string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting tmpfs on %s: %w", dst, err)
	}
	return nil
}

func mountPoint(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	return mountPointFor(st.IsDir(), dst)
}

// mountPointFor makes dst a directory, or for a bind of a file, a file.
func mountPointFor(dir bool, dst string) error {
	if dir {
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// errBindOverlap refuses a bind whose host directory, as the init finds
// it, is the workspace or holds it or lies in it.
var errBindOverlap = errors.New("its host directory overlaps the workspace")

// openBindSource opens src, following symlinks as the backend did when it
// checked the bind against the workspace, as an O_PATH descriptor, and
// refuses it (errBindOverlap) when what it reached overlaps the host
// workspace ws. The bind is then made from the descriptor, so what is
// checked is what is mounted: a symlink swapped in on the way to src
// after the backend's check (by another process, or by an earlier
// command through a read-write bind of the directory above) cannot make
// it a bind of the workspace, which would show the command the .pulse
// state the overlay hides and, read-write, let it write the workspace
// past the captured layer.
func openBindSource(src, ws string) (*os.File, error) {
	fd, err := unix.Open(src, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: src, Err: err}
	}
	f := os.NewFile(uintptr(fd), src)
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	switch {
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("resolving %s: %w", src, err)
	case !filepath.IsAbs(real):
		// Not a path of this mount namespace's tree (another file
		// system's root, a detached mount): nothing to check it by.
		f.Close()
		return nil, fmt.Errorf("%s resolves to %q, outside the tree", src, real)
	case pathWithin(real, ws) || pathWithin(ws, real):
		f.Close()
		return nil, fmt.Errorf("%w: %s is %s, workspace %s", errBindOverlap, src, real, ws)
	}
	return f, nil
}

// pathWithin reports whether the clean absolute path p is dir or below it.
func pathWithin(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}

// bindChecked binds the caller's host path src at dst (read-write or
// read-only, nosuid and nodev either way) through openBindSource.
func bindChecked(src, dst, ws string, rw bool) error {
	f, err := openBindSource(src, ws)
	if err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err == nil {
		err = mountPointFor(st.IsDir(), dst)
	}
	if err == nil {
		err = unix.Mount("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), dst, "", unix.MS_BIND|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if !rw {
		return setReadOnly(dst, true)
	}
	return unix.MountSetattr(-1, dst, unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV})
}

func bindReadOnly(src, dst string) error {
	if err := mountPoint(src, dst); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	return setReadOnly(dst, true)
}

// setReadOnly makes the mount at dst (and, when recursive, every mount
// below it) read-only, nosuid and nodev. mount_setattr only adds flags, so
// unlike a remount it cannot trip over the flags the kernel locks in a
// user namespace.
func setReadOnly(dst string, recursive bool) error {
	flags := uint(0)
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(-1, dst, flags, attr); err != nil {
		return fmt.Errorf("making %s read-only: %w", dst, err)
	}
	return nil
}

// readOnlyInPlace makes p, and every mount below it, a read-only view of
// itself; a p that does not exist is left alone. Unlike bindReadOnly it
// makes no mount point, which for a file would open it for writing.
func readOnlyInPlace(p string) error {
	if _, err := os.Lstat(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read-only %s: %w", p, err)
	}
	if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("read-only %s: %w", p, err)
	}
	return setReadOnly(p, true)
}

// mask hides p: a directory behind an empty read-only tmpfs, anything else
// behind a read-only /dev/null.
func mask(p string) error {
	st, err := os.Lstat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("mask %s: %w", p, err)
	}
	if st.IsDir() {
		if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0755"); err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
		return nil
	}
	if st.Mode()&os.ModeSymlink != 0 {
		return nil // the target is what matters, and it is masked or absent
	}
	if err := unix.Mount("/dev/null", p, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mask %s: %w", p, err)
	}
	return setReadOnly(p, false)
}

func setupDev(root string) error {
	dev := root + "/dev"
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	// Device nodes cannot be created in a user namespace: bind the host's.
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := mountPoint("/dev/"+n, dev+"/"+n); err != nil {
			return fmt.Errorf("/dev/%s: %w", n, err)
		}
		if err := unix.Mount("/dev/"+n, dev+"/"+n, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", n, err)
		}
	}
	if err := os.Mkdir(dev+"/pts", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mounting /dev/pts: %w", err)
	}
	if err := mountTmpfs(dev+"/shm", "mode=1777"); err != nil {
		return err
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, dev+"/"+name); err != nil {
			return err
		}
	}
	return setReadOnly(dev, false)
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

func setRlimits(cfg *Config) error {
	set := func(res int, v int64, name string) error {
		if v <= 0 {
			return nil
		}
		l := unix.Rlimit{Cur: uint64(v), Max: uint64(v)}
		if err := unix.Setrlimit(res, &l); err != nil {
			return fmt.Errorf("setrlimit %s: %w", name, err)
		}
		return nil
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("setrlimit core: %w", err)
	}
	if err := set(unix.RLIMIT_FSIZE, cfg.FileSize, "fsize"); err != nil {
		return err
	}
	if err := set(unix.RLIMIT_NPROC, cfg.NProc, "nproc"); err != nil {
		return err
	}
	return set(unix.RLIMIT_DATA, cfg.Data, "data")
}

// spareThread makes the Go runtime start (or keep) one idle thread besides
// this locked one, before the command starts counting against a pids
// cgroup that also holds the init: while the init waits for the command,
// the runtime hands its processor to another thread, and must not need to
// create one then (a failed thread creation is fatal to the runtime, and
// the init's death would kill the command). Blocking this locked goroutine
// on a channel makes the runtime run the sender on another thread, which
// then stays idle for later reuse.
// spareThreads makes the runtime start n threads beyond the ones it has,
// which stay idle for later reuse, and lets every goroutine started so
// far reach the point where it waits. The runtime cannot be asked for an
// idle thread directly: n goroutines each lock a thread of their own, then
// let it go. Done so that the threads the runtime may want while the command runs exist
// before the pids limit is set to the command's allowance plus the init's
// threads. Threads it finds idle are reused, not made again.
func spareThreads(n int) {
	var locked sync.WaitGroup
	release := make(chan struct{})
	for range n {
		locked.Add(1)
		go func() {
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	spareThread()
}

func spareThread() {
	ch := make(chan struct{})
	go func() { ch <- struct{}{} }()
	<-ch
}

// takeSignals makes the init immune to initIgnoredSignals and
// initFaultSignals.
//
// The terminating ones (initIgnoredSignals) are set to SIG_IGN with the
// raw system call rather than taken over with signal.Notify, which costs
// two thread switches each through the runtime's signal thread (about
// 0.5 ms of a cold start). The runtime still counts them as its own, so
// syscall.ForkExec resets them to SIG_DFL in the command. The fault
// signals cannot be ignored (a real fault must still reach the runtime):
// signal.Notify takes them over, at no such cost since the runtime does
// not hand them to its signal thread.
func takeSignals() error {
	for _, s := range initIgnoredSignals {
		// struct sigaction starts with the handler on every Linux ABI;
		// the rest (flags, restorer, mask) is zero.
		var act [4]uint64
		act[0] = 1 // SIG_IGN
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(s), uintptr(unsafe.Pointer(&act[0])), 0, 8, 0, 0); e != 0 {
			return fmt.Errorf("ignoring signal %d: %w", s, e)
		}
	}
	signal.Notify(make(chan os.Signal, 1), initFaultSignals...)
	return nil
}

// initIgnoredSignals and initFaultSignals are the signals whose Go
// runtime handling ends the process when nobody asked for them: terminate
// (SIGHUP, SIGINT, SIGTERM), crash with a trace (SIGQUIT, SIGABRT), or,
// sent by another process, taken for a fatal fault (the rest).
var (
	initIgnoredSignals = []unix.Signal{unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGABRT, unix.SIGTERM}
	initFaultSignals   = []os.Signal{unix.SIGILL, unix.SIGTRAP, unix.SIGBUS, unix.SIGFPE, unix.SIGSEGV, unix.SIGSTKFLT, unix.SIGSYS}
)

// traceTo receives phase lines when the backend asked for a start-up
// trace; nil otherwise.
var traceTo *os.File

// phase reports that the init finished the step name, with the time.
func phase(name string) {
	if traceTo == nil {
		return
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	fmt.Fprintf(traceTo, "phase %s %d\n", name, ts.Nano())
}

// closeFromOnExec marks every descriptor from first up close-on-exec:
// close_range(2) where the kernel has it (5.11), else one fcntl per entry
// of /proc/self/fd.
func closeFromOnExec(first int) error {
	if err := unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing inherited descriptors: %w", err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < first {
			continue
		}
		unix.CloseOnExec(fd)
	}
	return nil
}

// errNotFound is the init's "command not found", reported like a shell's
// (exit 127 and a message on stderr) since the command was requested but
// cannot exist in the sandbox.
var errNotFound = errors.New("command not found")
