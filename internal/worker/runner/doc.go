// Package runner runs one command for pulse-worker: a fresh "bash -c" child
// per exec, in its own process group, with stdout and stderr on independent
// pipes.
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
//     the whole process group, so grandchildren of a pipeline stop too; the
//     two are told apart by the error: ErrAborted or ErrTimeout;
//   - output read after the group has been killed is discarded, and Run
//     never returns while a Sink call is still running, so the caller's
//     terminal frame is always the last frame of the exec;
//   - a Sink error means the stream is gone: the group is killed and Run
//     returns that error wrapped in ErrSink.
//
// Relative ordering between stdout and stderr is not preserved: they are
// independent pipes.
package runner
