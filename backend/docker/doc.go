// Package docker runs sandboxed commands in containers of a Docker Engine,
// through the Engine API (never the docker CLI), with API-version
// negotiation so that engines from API 1.41 up work.
//
// What it promises:
//
//   - One warm container per Backend and workspace (and network mode),
//     created on first use and reused, so a command costs one exec. It is
//     labelled (pulse.sandbox, pulse.session, and the owning process) so
//     that Reconcile removes the leftovers of dead processes and Close
//     removes its own.
//   - Hardened by default: network none for deny-all, all capabilities
//     dropped, no-new-privileges, read-only root filesystem with a tmpfs
//     /tmp, a non-root user, the engine's default seccomp profile, and the
//     memory/cpu/pids limits given with WithContainerLimits. Allowlist
//     networking is refused with backend.ErrUnsupported.
//   - The workspace is copied in (a tar through the API, .pulse/ left
//     out) into a volume; the host workspace is never mounted, so it is
//     byte-identical after any command.
//   - Each command runs in its own copy of the container's workspace
//     (/pulse/run/ID). When it ends, what it created, changed or deleted,
//     measured against the copy it started from (entry type, mode, and an
//     MD5 of contents or link target), comes back as the Result overlay,
//     byte-exact with modes, and is merged into the container's baseline
//     (/pulse/base), so later commands see earlier commands' writes.
//     Concurrent commands each get only their own changes; of two that
//     change one file, the later merge wins in the baseline.
//   - Timeouts, cancellation, Close and the output cap kill the command's
//     whole process group inside the container (it runs under setsid and
//     a second exec kills the group); output streams while it runs.
//
// The image is DefaultImage, PULSE_DOCKER_IMAGE or WithImage; BuildImage
// (`pulse image build`) builds it offline from host files. Any image with
// a POSIX sh and busybox-like find, stat, md5sum, awk, cp, tar, setsid and
// usleep works.
//
// Known limits: the per-command copy and hashes cost time in proportion
// to the workspace size; names containing a newline are not tracked; a
// process that leaves its process group (setsid) escapes the kill until
// Close removes the container; exit statuses above 128 cannot be told
// from deaths by signal and are reported as exits.
package docker
