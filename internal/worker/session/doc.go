// Package session speaks one worker's side of the SandboxWorker.Attach
// stream: Hello, heartbeats, dispatch of Exec frames to a fixed pool of
// runners, Abort routing, and the dedup cache.
//
// A Session outlives connections; Serve owns one. What it promises:
//   - Hello is the first frame of every connection and describes the worker
//     truthfully (the real pool size as capacity_max);
//   - each Exec accepted gets its Chunk frames and then exactly one terminal
//     frame, End or ExecError, unless the connection is lost first;
//   - N pool goroutines read one bounded queue in arrival order; when the
//     queue is full the Exec is answered at once with
//     ExecError{"busy: queue full"}: the receive loop never blocks on
//     dispatch, so an Abort behind a burst of Execs is always read (its
//     own replies, busy or cached frames, do share the stream's flow
//     control with every other Send);
//   - Abort of a queued exec means it never starts (answered End{-1});
//     Abort of an unknown req_id is a no-op;
//   - a completed exec's terminal frame is kept in a bounded LRU keyed by
//     req_id and guarded by a SHA-256 fingerprint of command and stdin. A
//     redelivery (same req_id and fingerprint) is answered from the cache
//     without running again; a different command under a known req_id runs
//     fresh when the original has finished, and is refused with ExecError
//     while the original is still running;
//   - when the connection is lost, its execs are killed; they leave no
//     cache entry, so a redelivery runs them again (at-least-once).
package session
