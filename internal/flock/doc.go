// Package flock takes advisory flock(2) locks that a caller's context can
// give up on. It is the one home of flock for cowfs (the workspace lock),
// audit (the log's append lock) and the namespace backend (a run
// directory's liveness lock). It is a leaf: it imports only the standard
// library, so public packages may use it.
//
// A blocking flock cannot be interrupted, so a context that can end is
// served by polling with LOCK_NB and an exponential backoff (from 50µs up
// to 10ms between tries): the wait ends within one backoff step of the
// context ending, and nothing is left behind. A goroutine blocked in the
// kernel was the other choice; it cannot be stopped either, so a cancelled
// wait would leave it (and an OS thread) parked until the holder let go,
// and it would then have to drop a lock nobody wanted. A context that can
// never end (context.Background) waits in the kernel, which is fairer and
// cheaper.
//
// Lock and LockShared try once before they look at ctx: ctx bounds the
// wait for a held lock, not the taking of a free one (a caller that must
// not start once ctx is done checks ctx itself, as audit's Record does).
//
// The locks belong to the open file description, as flock(2) says: two
// opens of the same file exclude each other, even in one process, and a
// lock is dropped when its last descriptor closes.
package flock
