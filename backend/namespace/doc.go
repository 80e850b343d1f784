// Package namespace runs commands in Linux namespaces without a daemon: the
// isolation bubblewrap gives Flatpak apps, written in Go inside this module.
//
// Every Exec gets new user, mount, pid, net (unless the network policy is
// allow-all), ipc, uts and cgroup namespaces. The command sees a minimal
// root: read-only binds of /usr, /bin, /sbin, /lib*, /etc (with /etc/shadow,
// known secret stores and anything under /etc the world cannot read
// masked), a fresh /proc with Docker's masked and read-only paths (the
// kernel's memory-layout files, keys and timers hidden; /proc/sys, bus,
// fs, irq and sysrq-trigger read-only), a minimal /dev (null,
// zero, full, random, urandom, tty, pts, shm), tmpfs /tmp and a tmpfs at the
// caller's home path, so nothing of the caller's home (~/.ssh) is visible. The workspace appears read-only at its own path with an overlayfs on
// top; whatever the command writes lands in an upper directory that Exec
// returns as Result.Overlay (byte-exact; whiteouts and opaque directories
// become deletions). The upper and work directories are on a tmpfs the
// init mounts with the size of limits.disk_bytes (policy.DiskDefault of
// the memory available without one) and an inode count to match, so the
// kernel refuses writes past the bound while the command runs: a command
// can fill neither the host's disk nor its memory past it. Exec ends a
// command whose tmpfs is full with Termination backend.DiskLimit and
// returns what it wrote up to there. The tmpfs is the sandbox mount
// namespace's own; the init hands the backend a descriptor of it, which
// keeps it readable until the overlay is read (scratch_linux.go). Its
// pages count toward the command's memory cgroup too. The workspace's .pulse/ directory is hidden behind an
// empty read-only tmpfs.
//
// Request.Pending is laid between the workspace and the upper directory:
// each pending layer is built once as a directory under the state dir's
// layers/ (files, directories, symlinks; deletions as whiteouts, the
// character devices 0/0 unprivileged users may make since Linux 5.8),
// named by its id and reused by every later command; the overlay is then
// mounted with fsconfig "lowerdir+" (Linux 6.8), one layer at a time, so
// a stack of hundreds of layers fits (overlayfs takes up to 500). The
// overlay is read back against the view the command saw, not the bare
// workspace. Each complete run of 32 layers from the bottom is mounted as
// one directory holding their merged entries (named by the run's layer
// ids, built once), so a stack of 200 mounts 14 directories; a run in
// which a directory is made over a lower layer's file or whiteout would
// need an opaque directory and is mounted layer by layer instead. Layers
// unused for a day are removed.
//
// The sandbox is a session of its own with no controlling terminal (the
// init calls setsid, and so does the command): nothing in it can open the
// caller's terminal through /dev/tty, and the caller's stdin, a terminal
// or not, reaches the command only through a pipe the backend copies
// into. Descriptors the caller holds open without close-on-exec are closed
// before the command starts; it has 0, 1 and 2 and nothing else. With
// Request.TTY the command's 0, 1 and 2 are instead a new terminal the init
// opens in the sandbox's own devpts instance (the sandbox's /dev/pts/0,
// never a host terminal), its controlling terminal; the init copies the
// master to and from its pipes and applies resizes the backend sends as
// lines on the config pipe (internal/nsinit/tty_linux.go).
//
// Start (backend.Starter) runs a command exactly as Exec does and hands
// back a handle: signals go to the command's host pid (the init's child
// whose innermost pid the init reported), and DialPort connects to a port
// inside the sandbox through the init, which connects from inside its
// network and hands the socket back over a socket pair (expose_linux.go, and the init's side
// in internal/nsinit):
// so it works for an unprivileged caller too, which could not enter the
// namespace itself (setns needs CAP_SYS_ADMIN over the caller's own user
// namespace).
//
// The command inherits, from the init thread that forks it, no_new_privs,
// an empty capability set (bounding, ambient, inheritable and effective,
// with the root securebits locked), a seccomp filter that refuses mount,
// ptrace, kexec, bpf, keyctl, userfaultfd, io_uring, the terminal-injecting
// ioctls TIOCSTI and TIOCLINUX, new namespaces (clone
// flags checked; clone3, whose flags a filter cannot read, answers ENOSYS
// so libc falls back to clone) and every syscall of a foreign ABI, and a
// landlock ruleset that confines writes to the workspace, /tmp, home and
// /dev where the kernel has landlock (best effort: Capabilities says
// whether it is active). Inside, the command runs as uid 0 of its user
// namespace, which maps to the caller's uid and nothing else.
//
// # The one call main needs
//
// The backend re-runs its own binary (/proc/self/exe) as the sandbox's init,
// pid 1 of the new pid namespace, marked by an environment variable. A
// program that uses this backend must call Init first thing in main:
//
//	func main() {
//		namespace.Init() // returns at once unless this process is a sandbox init
//		...
//	}
//
// Test binaries do the same in TestMain:
//
//	func TestMain(m *testing.M) { namespace.Init(); os.Exit(m.Run()) }
//
// The init program. Each init is a Go process start, and re-running a large
// binary pays all of its package initialisation again. When the program
// cmd/pulse-runtime (InitProgramName), the one in-box runtime, is installed
// beside the running binary, as `go build -o bin/ ./cmd/...` and `go
// install ./cmd/...` put it, the backend runs that instead: it links the
// init's code (package internal/nsinit, which imports nothing of the
// backend's side) and the runtime's steps, the standard library and
// golang.org/x/sys, so its Go start-up is close to a hello world's. It is used only when it is a
// regular file owned by root or by the binary's owner, in a directory of
// the same, writable by nobody else (whoever could
// replace it could replace the binary), and it is exec'd through a
// descriptor, so the file checked is the file run. It must also be the same
// code: it is run only once a probe ran a sandbox with it, and the probe's
// inits get the identity of the parent's build of the init's code (the Go
// version, a hash of package nsinit's source, embedded, and
// golang.org/x/sys's version); an init of any other identity refuses to set anything up. The
// probe then falls back to this binary as the init and records that in the
// probe cache, so an init left from another build costs one extra probe,
// never a command run by code other than the parent's. Once a probe passed
// with that very file (held open; in the probe cache, named by its inode,
// size, modification and change times), its inits skip the hash.
//
// Init never returns in a sandbox init: it sets the sandbox up, starts the
// command (`bash -c`, `sh -c` where bash is missing, or the request's argv)
// as its child with every restriction applied, reaps orphans, and reports
// the command's wait status to the backend over a pipe. A backend whose
// program did not call Init is unavailable (Probe and Exec say so) rather
// than re-running the program's main.
//
// # Start-up
//
// Most of an Exec's cost is starting the init: exec of this binary, the Go
// runtime's start, the namespaces and the mounts. After each Exec (and
// Probe) the backend starts, in the background, the inits the next Execs
// of the same network mode will use: namespaces made, the root, /dev,
// /proc, /tmp and home mounted, stdio pipes ready. Only the workspace
// overlay, the extra binds, pivot_root and the restrictions wait for the
// request. Each init serves one command and is never reused, so nothing
// passes from one command to the next.
//
// The pool of a network mode holds as many idle inits as the most Execs of
// that mode seen running at once, up to WithPoolSize (DefaultPoolSize, 16):
// one for a caller that runs one command at a time, 16 after a burst of 16.
// One background goroutine per mode starts them one after another, each
// already in the cgroups of the limits of the Exec that asked for it (the
// next Exec's, most likely), so that the kernel's wait to move a process
// into a cgroup overlaps the init's start rather than delaying that Exec;
// an Exec with other limits ends it and starts its own. An idle
// init costs about 0.4 MiB of private memory (1.3 MiB proportional set size
// with the binary's shared pages), about nine threads (three of them the
// spares a pids-limited command needs, made while it waits), its
// namespaces and mounts, and an empty run directory. Close ends them all;
// WithoutPrestart keeps none. StartAhead starts one init for a first Exec
// the caller knows is coming (the CLI calls it once its backend is
// chosen), already in the cgroups of the limits it is told: moving a
// process into a cgroup waits for an RCU grace period in the kernel, which
// then overlaps the init's start instead of delaying the Exec. An Exec
// with other cgroup limits ends that init and starts its own. With
// WithKeeper, StartAhead first asks the keeper, a process of the same
// binary that outlives the CLI process that started it, for an init it
// started ahead, and takes it over whole (keeper_linux.go says how, and
// whom the keeper answers). In cgroup v1
// directories no move is needed: the thread that forks an init enters
// its cgroups alone for the fork (a thread moving itself takes no such
// wait), so the init is born there, and the sandbox's cgroup namespace
// has the run's cgroup as its root.
//
// What stays on a cold start's critical path is kept small: the seccomp
// program is compiled once per process and sent to each init, packed; the
// init ignores the signals whose Go runtime handling would end it with
// one system call each rather than through the runtime's signal thread;
// and the backend does not wait for the kernel to tear an init down (see
// Lifetime). TestStartupPhases (go test -v -run StartupPhases, also run
// by bench/namespace.sh) prints where a cold Exec's time goes.
//
// # Lifetime
//
// The init is pid 1 of the sandbox's pid namespace. When the command
// exits, the init kills every other process of the namespace and reaps
// them, reports that the namespace is empty, closes its pipes and exits;
// Exec returns then, and the init's own exit (the kernel tearing down its
// namespaces and mounts) finishes in the background, reaped by the
// backend (Close waits for it). When Exec kills the init on timeout,
// cancellation or output cap, or the init dies, the kernel kills every
// process left in the namespace, and Exec waits for that. Either way no
// process of the command outlives Exec. The init also ends when the
// backend's process does: the backend holds the init's config pipe open,
// and the init exits on its EOF. The command is not pid 1, so it keeps
// ordinary signal semantics ("kill -TERM $$" ends it). Result.PID is its
// pid inside the namespace. Result.Metrics count the command and every
// process it started (the init's own, when it was killed). All mounts live
// in the sandbox's own mount namespace and vanish with it; the only state
// on the host is a run directory (mount points, and the hidden paths'
// whiteouts copied into the upper directory) under a per-user state
// directory, locked by its owner while it runs. Reconcile removes the run directories whose owner is gone.
//
// # Enforcement
//
// Network deny-all is strong (a new net namespace with only loopback up);
// allow-all shares the host network; allowlist keeps the empty namespace
// and bridges in the egress proxy of Request.Egress: its unix socket is
// bound read-only at /run/pulse-egress/proxy.sock and the init relays
// 127.0.0.1:3128 to it, so the proxy is the command's only way out (an
// allowlist request without Egress is refused). Every secret mode is strong: the environment is
// built from scratch and the caller's home is replaced by a tmpfs. Timeout,
// output caps and file size are enforced by the backend and rlimits; memory,
// pids and cpu by a cgroup when one is writable (Capabilities.Limits says
// which), v1 controllers (this includes the layout with a v2 mount at
// /sys/fs/cgroup/unified) as well as v2. Where the request sets no pids or
// memory limit, policy.DefaultPids and policy.DefaultMemoryBytes apply
// through the cgroup, so a fork bomb stops there instead of at the host's
// pid space.
//
// Request.Hidden paths are absent from the command's view: whiteouts in
// the upper layer, written before the overlay is mounted; what the command
// writes there is captured as any write, and hiding them is no deletion
// (hide_linux.go).
//
// On systems other than Linux the package builds, and New returns a backend
// whose Probe and Exec report ErrUnavailable.
package namespace
