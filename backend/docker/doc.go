// Package docker runs sandboxed commands in containers of a Docker Engine,
// through the Engine API (never the docker CLI), with API-version
// negotiation so that engines from API 1.41 up work.
//
// What it promises:
//
//   - One warm container per Backend and workspace (and network mode,
//     and lane: a fork's commands never run in a container whose copy of
//     the workspace holds another lane's stack), created on first use and
//     reused. It is labelled (pulse.sandbox,
//     pulse.session, and the owning process's pid and start time) so that
//     Reconcile removes the leftovers of dead processes on this host and
//     Close removes its own.
//   - With WithReuse, containers outlive their process: Close hands each
//     on, with the model of its copy of the workspace, under the
//     workspace's .pulse/docker/, and a Backend of a later process with
//     the same settings takes it over (one process at a time, by a lock
//     file; concurrent ones take other slots). A process that died while
//     it held one leaves it unreleased, and it is removed, never reused.
//     A warm container ends itself after its idle lifetime, and
//     Reconcile and Collect remove expired and unreleased ones (warm.go).
//   - Hardened by default: network none for deny-all, all capabilities
//     dropped (the wrapper, root in the container, keeps CHOWN,
//     DAC_OVERRIDE, FOWNER, SETUID, SETGID and SETPCAP; the command
//     starts with every set empty, the bounding set too: the runtime's
//     cmd step, internal/boxrt drop_linux.go),
//     no-new-privileges,
//     read-only root filesystem with tmpfs /tmp, each command under a uid
//     of its own (20000 and up, no capabilities) in a working copy only it
//     can enter, so that concurrent commands cannot signal, trace or read
//     each other or each other's wrapper (see internal/boxrt, exec_linux.go), a seccomp
//     profile made of the namespace backend's deny list (ptrace, process_vm_readv/writev,
//     io_uring, bpf, keyctl, mount, new namespaces, the TIOCSTI and
//     TIOCLINUX ioctls; see seccomp.go) in place of the engine's default,
//     and the memory/cpu/pids limits given with WithContainerLimits, or
//     else policy.DefaultPids and policy.DefaultMemoryBytes, so that no
//     container can exhaust the host. Capabilities().Notes lists these
//     defaults.
//   - Network allowlist: the container has network none, and the egress
//     proxy of Request.Egress is bridged in: this process opens a
//     listener on 127.0.0.1 inside the container's network namespace and
//     hands its connections to the proxy (Egress.ServeConn, one relay) or
//     relays them to the proxy's unix socket (egress.go says why this and
//     not an internal Docker network). That needs root on the engine's
//     machine; elsewhere allowlist is unsupported and refused with
//     backend.ErrUnsupported, as is an allowlist request without Egress.
//     The sandbox CA of injected secrets is in the container's trust
//     store (/etc/ssl/certs/ca-certificates.crt, a read-only bind of a
//     host file holding this machine's CA bundle and the CA) and in the
//     CA variables, which name the same file.
//   - Scripts run from the workspace and /tmp (both tmpfs mounted with
//     exec: noexec stops ./script.sh but no interpreter). Every place the
//     container can write is bounded by the kernel as it writes: /tmp
//     (512m), the scratch tmpfs of the baseline, the working copies and
//     what commands write, and the copy-in volume of the same size, the
//     latter a tmpfs volume rather than a directory on the engine's disk.
//     Files on a tmpfs are memory charged to the container, so the
//     scratch size is reached before its memory limit as long as the
//     processes leave room (scratchBytes): limits.disk_bytes (or
//     WithScratchSize), the container's memory limit then being
//     limits.memory_bytes plus it; else half of memory_bytes (at most 2
//     GiB) within it, so that a container no policy gave a disk bound
//     holds no more memory than memory_bytes. A write past the scratch
//     fails with ENOSPC, which the command sees, instead of waking the
//     OOM killer. A command that filled the scratch or /tmp ends with
//     Termination DiskLimit, its stderr naming the limit and how to raise
//     it, and what it wrote up to there is reported as always; it is not
//     merged into the baseline, which would not hold it (a reserve of 8
//     MiB on the scratch, freed when a command has filled it and made
//     again by the next, leaves the wrapper room to list it). What changed goes back as tars made on the
//     tmpfs, or, where it has no room for them, read straight from the
//     command's copy (a tar per batch of names, measured first).
//   - The command has stdin, stdout and stderr and no other descriptor;
//     the caller's stdin, a terminal or not, reaches it only as a stream
//     the backend copies into the exec. With Request.TTY (Start), those
//     three are instead a new terminal the engine makes in the container
//     (an exec with Tty, /dev/pts/N of the container's devpts, root's,
//     mode 0620), the controlling terminal of the command's session; the
//     command still runs as its own uid with no capability, in its copy,
//     reported and killed as any other (tty.go). Its output is stdout and
//     stderr as one, as the terminal shows them.
//   - The command's environment is exactly the minimal base plus
//     Request.Env (env -i), so secrets are enforced strongly.
//   - The workspace is copied in (a tar through the API, .pulse/ left
//     out) through a volume onto a tmpfs; the host workspace is never
//     mounted, so it is byte-identical after any command.
//   - Each command runs in its own copy of the container's workspace.
//     When it ends, what it created, changed or deleted, measured against
//     the copy it started from (entry type, mode, and an MD5 of contents
//     or the link target), comes back as the Result overlay, byte-exact
//     with modes, and is merged into the container's baseline. Before
//     each command the baseline is brought to exactly the workspace as it
//     is on disk now plus Request.Pending (sync.go): the backend keeps a
//     model of what the baseline holds and sends only the entries that
//     differ, so a discarded or refused write, or a host edit, costs that
//     file's bytes once, never a copy of the workspace. A host file is
//     known by its mode, size, mtime, ctime and inode; one changed within
//     a filesystem clock tick or two of being read is sent again next
//     time (racyWindow: 2.1 s where the filesystem keeps whole seconds,
//     250 ms where a file's ctime has a fraction of a second, the
//     filesystem's tick being 10 ms or less). Concurrent commands each
//     get only their own
//     changes; the paths written by a command that overlapped another
//     are sent again by the next sync. Copy per command was chosen over
//     snapshots of one shared directory because with a shared directory
//     concurrent commands' writes cannot be told apart.
//   - A command's copy is kept for the next command of its uid (uids are
//     reused once all of an earlier command's processes are gone) and
//     brought to the baseline by changing only what differs, nothing at
//     all when the baseline did not change since (a generation number in
//     its manifest). What a command changed is found by ctime, which no
//     process can set: only entries changed at or after a mark made just
//     before the command are hashed, and a directory renamed during it
//     brings what is in it back whole under its new name (internal/boxrt, exec_linux.go).
//     Unchanged files keep their inode and times across commands, so
//     tools that cache by them (git's index, make, go's build cache keyed
//     by the directory, which stays /work/run/UID) find their caches
//     valid.
//   - Timeouts, cancellation, Close and the output cap kill every process
//     of the command's uid inside the container, setsid or not (a second
//     exec signals them as that uid, so nothing else can be hit); output
//     streams while it runs; the exit status is exact, and a death by
//     signal is reported as Signaled.
//   - Request.Caches are bind-mounted read-write. Commands have different
//     uids but one group, commandGID (19999), and every cache follows the
//     ownership model all backends share (backend/internal/cacheshare):
//     its directories' access and default POSIX ACLs give rwx to that
//     group and to the cache's owner (the user the namespace backend runs
//     commands as), inherited by all that is made in it whatever the
//     command's umask, so every command, on this backend or another, can
//     change what another left. Where the host filesystem has no POSIX
//     ACLs, root gives the top directory to the group, g+rwxs; entries
//     below then have the modes their command's umask gave, and may be
//     read-only to the next.
//
// How a command runs: the in-box runtime's exec step (internal/boxrt,
// exec_linux.go) runs it and ends both output streams with a marker naming a per-command nonce, followed
// on stdout by a tar of what changed. Setting up an exec in the runtime
// costs more than the rest of a small command, so a container made
// WithReuse runs commands, and the syncs before them, without one: its
// main process, the runtime's idle step, listens on a channel of FIFOs
// in a directory of the slot's, bound in root-only, and runs the
// runtime's exec step (or its sync step, as the sandbox user) for each
// request, stdio through the FIFOs; a request
// it does not claim in time is taken back and runs through an exec, never
// both (channel.go; used where the engine's socket is local and the
// user's uid is root or none the container runs). Other commands without
// stdin go to a pool of long-lived execs that read one request a line;
// commands with stdin get an exec of their own.
//
// The image is DefaultImage, PULSE_DOCKER_IMAGE or WithImage; BuildImage
// (`pulse image build`) builds it offline from host files. Any image
// works, with or without bash, busybox, coreutils or even a shell: the
// backend injects a static busybox from this host, root's and read-only,
// at /.pulse-tools (WithTools; tools.go) beside the runtime, and runs
// the command with the image's PATH and programs only; a Shell command
// runs under the image's bash, else its sh, else the injected sh. The
// runtime's exec step drops to each command's uid and hands it its copy
// itself; of the backend's own steps only BuildImage's checks of a new
// image still run under a shell.
//
// Known limits: each command's end lists every entry of its copy (and
// stats those changed in the last minute or so, reads the contents of
// those changed since it began, and reads the copy's manifest only when
// an entry changed), so its cost grows with the number of files in the
// workspace; the first command of a uid
// in a container copies the workspace; the workspace lives in memory
// (the scratch), once in the baseline and once per copy kept, so a
// pending file that takes more than half the scratch cannot be synced
// and its sync failure names limits.disk_bytes; an entry whose name holds a newline is not carried back, only reported (the facade lists it as not staged), and a directory so named with entries in it loses all the command wrote (ErrOverlayLost); what a command leaves in its report is as
// trustworthy as the command, so the overlay parser fails closed: a report
// whose changes cannot be read (malformed, over the overlay limit) or that
// never came leaves the command's Result standing, without an overlay, with
// an error wrapping backend.ErrOverlayLost.
//
// The Engine API client is github.com/docker/docker/client, not the newer
// github.com/moby/moby/client module: the module proxy serves that one
// only as v0.x (v0.6.3 on 2026-12-01), which promises no stable API.
// Move when it has a v1.
package docker
