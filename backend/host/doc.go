// Package host runs commands directly on the host: the opt-in, unsafe
// backend for machines where nothing isolating is available.
//
// What it promises:
//
//   - The command runs in the workspace itself, as the calling user, with
//     the host's network and file system in view. Writes land in place;
//     Capabilities says so (CapturesWrites false, isolation host_unsafe)
//     and Result.Overlay is always nil. Callers that must know what changed
//     compare the tree before and after.
//   - A Shell request runs under bash -c (sh -c where bash is missing); an
//     Args request is executed directly, the program found with the
//     command's own PATH.
//   - The environment is built from scratch: PATH (DefaultPath), HOME and
//     USER of the account, LANG=C.UTF-8, TERM=dumb, then Request.Env on
//     top. Nothing of the caller's environment is inherited.
//   - The command leads its own session (so it has no controlling
//     terminal: the caller's cannot be opened through /dev/tty; with
//     Request.TTY, a started command's controlling terminal is a new
//     pseudo-terminal the backend opens from /dev/ptmx for it, whose
//     master it keeps: see tty_linux.go) and
//     process group, and starts in a cgroup of
//     its own where a v2 hierarchy is writable (/sys/fs/cgroup, or
//     /sys/fs/cgroup/unified beside v1 controllers; no controller needs to
//     be delegated). Timeout, cancellation of ctx, Close and an exceeded
//     output cap send SIGKILL to the whole group and then to everything in
//     the cgroup; so does the command's own exit, so background processes
//     it left, including those that left the group with setsid, do not
//     outlive Exec. The cgroup is named after the owning process (pid and
//     start time): Reconcile kills what is left in those of an owner that
//     died (a SIGKILLed pulse-server) and removes them. Without a writable
//     v2 hierarchy (or with PULSE_HOST_NO_CGROUP=1), a child subreaper
//     does the tracking: this program, re-executed through /proc/self/exe
//     with PR_SET_CHILD_SUBREAPER, starts the command, adopts what is
//     orphaned below it (setsid, then its parent exits), and when the
//     command ends, is timed out or cancelled, or the owner dies
//     (PR_SET_PDEATHSIG), SIGKILLs every descendant; it costs a process
//     start per command, Result.Metrics then include the subreaper's own
//     (a few MiB of MaxRSS, milliseconds of CPU), and a command that kills
//     its subreaper (its parent, the same user) first escapes it
//     (reaper_linux.go). Where not
//     even that can run, only the group is killed: a setsid'd process
//     escapes, and Exec waits at most the wait delay for output pipes it
//     holds. Capabilities().Notes says which applies. A command run by
//     root can move itself out of any cgroup.
//   - Stdout and stderr are each capped at Limits.OutputBytes; the excess
//     is dropped, Result.Truncated is set and the command is killed
//     (Termination output_limit). A nil Stdout or Stderr goes to /dev/null
//     without a pipe; nothing is delivered, so nothing is capped.
//   - Stdin is fed through a pipe Exec owns: when the command ends, Exec
//     returns at once even if the caller's reader still blocks; the reader
//     is closed (if it is an io.Closer) and otherwise abandoned.
//   - Descriptors this process inherited without close-on-exec (a shell's
//     `exec 8>>file`) are marked close-on-exec before each start, so the
//     command has 0, 1 and 2 only; later children of the process do not
//     inherit them either.
//   - A ctx that is already done starts nothing and returns its error.
//   - Limits.FileSizeBytes becomes RLIMIT_FSIZE of the command and all it
//     starts, in force before its first instruction. Memory, CPU and pid
//     limits are not enforced (Capabilities.Limits says Unsupported):
//     rlimits for them count virtual memory, CPU seconds or every process
//     of the user, none of which is the limit asked for.
//   - Not enforced: read-deny rules (Capabilities.HidesPaths is false:
//     the workspace is the command's), memory, cpu and pids limits, and
//     any network restriction.
//   - Network: only allow-all can be honoured; deny-all and allowlist
//     requests are refused with backend.ErrUnsupported before anything
//     starts. Secrets: deny-all and allowlist are best effort (the
//     environment holds only what the caller put in Env, but files on disk
//     remain readable).
//   - Result.Metrics come from the rusage of the reaped command (maximum
//     RSS of the largest process, user and system CPU of the tree that was
//     waited for).
//
// Exec is implemented for Linux; elsewhere Probe reports ErrUnavailable.
package host
