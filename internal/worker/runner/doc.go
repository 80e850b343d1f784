// Package runner runs one command for pulse-worker. An Exec that carries a
// Box runs in a box of its own (Boxes, box.go: the namespace backend, the
// workspace read-only with the writes written beside it as an overlay
// archive, an egress proxy beside an allowlist box); every other Exec, the
// relay's own steps around it, is a fresh "bash -c" child (Bash), with
// stdout and stderr on independent pipes. The process is the
// host backend's (backend/host): a session and process group of its own, in
// a cgroup of its own where the machine has a writable cgroup v2 hierarchy,
// and the whole tree killed when the command ends or is ended; the backend
// conformance suite covers that backend as the runner configures it. The
// environment is the host backend's base (PATH, HOME, LANG, TERM, USER)
// with the configured variables over it.
//
// What it promises:
//   - stdin is written (when given) and then always closed, so a command
//     such as "base64 -d > f" terminates and a command given no stdin sees
//     EOF at once;
//   - in streaming mode every read of at most ChunkSize bytes (so that a
//     whole Chunk frame stays within 32 KiB) is
//     handed to the Sink as it happens; with streaming off, output is
//     buffered (BufferCap, 8 MiB per stream, truncated beyond) and handed
//     over only after the child has exited;
//   - cancelling the context (Abort) or reaching the timeout sends SIGKILL to
//     the whole process group (and cgroup), so grandchildren of a pipeline
//     stop too; the two are told apart by the error: ErrAborted or
//     ErrTimeout. When the command's main process exits, what it left
//     running in the background is killed too;
//   - output read after the group has been killed is discarded, and Run
//     never returns while a Sink call is still running, so the caller's
//     terminal frame is always the last frame of the exec;
//   - a Sink error means the stream is gone: the group is killed and Run
//     returns that error wrapped in ErrSink.
//
// Relative ordering between stdout and stderr is not preserved: they are
// independent pipes.
package runner
