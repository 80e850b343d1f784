// Package gvisor runs each command under gVisor's runsc: the command's
// system calls are served by gVisor's user-space kernel (the Sentry),
// never by the host kernel directly. It needs no KVM: runsc intercepts
// the calls with its systrap or ptrace platform (systrap where the runsc
// installed has it, ptrace otherwise; WithPlatform picks one).
//
// Each Exec builds, on the host, the same view of the workspace the
// namespace backend shows, and runs the command on it in the Backend's
// warm sandbox (warm_linux.go: one runsc sandbox kept from the first
// command to Close, pulse-runtime its init, each command in pid, mount, network and IPC
// namespaces of its own there), or, cold, in a fresh runsc sandbox (where
// no runtime program is found, or WithCold):
//
//   - a tmpfs of limits.disk_bytes (policy.DiskDefault without one) holds
//     one layer directory built from Request.Pending's View (files,
//     directories, symlinks; deletions, Request.Hidden and .pulse as
//     overlayfs whiteouts), the overlay's upper and work directories;
//   - the workspace, bound read-only, is the bottom lower layer of a host
//     overlayfs whose upper directory is on that tmpfs; its merged view
//     is bound into the sandbox at the workspace's own path, so that what
//     the command writes, through runsc's file proxy (the gofer), lands
//     in the upper directory and nowhere else;
//   - a second, read-only overlayfs of the same lower layers is what the
//     command saw; once the sandbox is gone the upper directory is read
//     back against it into Result.Overlay (whiteouts and opaque
//     directories become deletions, a copied-up unchanged file is no
//     change).
//
// The sandbox's root is an empty read-only directory with read-only binds
// of /usr, /bin, /sbin, /lib* and /etc (secret stores masked), tmpfs /tmp
// and /root (HOME), gVisor's own /proc and /dev, and Request.Caches bound
// read-write at their paths. The command runs as uid 0 of the sandbox
// with no capabilities and no_new_privs. Its network is runsc's
// --network=none: a loopback device in gVisor's own network stack and
// nothing else (each warm command its own network namespace of it).
// Allowlist, warm only: the runtime relays 127.0.0.1:3128 (and the
// allowlist's loopback targets) in the command's network namespace to a
// socket the host serves in the view, which hands each connection to the
// egress proxy. Allowlist cold is refused (ErrUnsupported). Allow-all
// runs cold, warm sandbox or not: a sandbox of its own with runsc's
// --network=host, gVisor's netstack serving the command's sockets through
// host sockets, so it reaches what the host reaches, loopback included,
// as allow-all on namespace does.
//
// Start (backend.Starter) runs a command as Exec does and returns once
// it is starting. Warm, Signal goes to the command through the runtime;
// cold, to its main process (the container's init) through `runsc kill`,
// retried until runsc has made the container.
//
// Terminals (Request.TTY, backend.TerminalStarter). Warm, each
// command's mount namespace has a devpts instance of its own, in which
// the runtime opens the command's terminal (so no command can open
// another's); the command leads a session whose controlling terminal it
// is, the runtime copies the master to the command's stdout frames and
// its stdin frames to the master, and Resize reaches it as a resize frame
// the runtime applies (the command gets SIGWINCH from gVisor's kernel).
// Cold (allow-all among them), runsc makes the terminal on the host for
// the sandbox (its --console-socket: a socket in a directory of this uid
// alone, which takes one descriptor and checks that it is a terminal's
// master); gVisor's kernel serves the command's terminal from the
// replica, the backend copies the master to Stdout and Stdin to it, and
// Resize sets the master's size (the command gets SIGWINCH).
//
// Ports (DialPort). Warm, the host listens on a socket in the
// command's view directory (which the command never sees: the views are
// unmounted from its namespace); for each DialPort it sends a dial frame,
// and the runtime makes a socket in the command's network namespace
// (setns from a thread of its own), connects to 127.0.0.1:PORT there and
// then to that socket (runsc's --host-uds=open), writes the dial's number
// and whether the port answered, and relays. Cold on the host's network
// (allow-all), the command's ports are the host's: DialPort connects to
// 127.0.0.1:PORT on the host, as namespace does for allow-all. Any other
// cold command's are in a network stack only a runtime could reach:
// DialPort is ErrUnsupported.
//
// Exit statuses. Warm, the runtime reports how the command ended: an
// exit status is an exit, a signal a signal. Cold, runsc reports a
// command killed by signal n as exit status 128+n, as a shell does; the
// backend reads 129..192 as a signal (Termination Signaled, ExitCode -1),
// so a cold command that itself exits with such a status is reported as
// signaled.
//
// Requirements: root (runsc creates its sandboxes as root here, and the
// view is a host overlayfs mount) and a runsc binary (WithRunsc, $PULSE_RUNSC, or
// runsc on PATH). Probe starts the warm sandbox, which the commands then
// run in (one sandbox start per Backend, the probe's included), or, where
// that fails, a cold sandbox, and says what failed.
//
// What it costs: a sandbox start per Backend (about a second on a loaded
// two-core machine; per command when cold) and a process start under
// gVisor per command; see docs/security.md and docs/benchmarks.md for the
// measured ratio to the namespace backend.
package gvisor
