// Package worker is the pulse-worker runtime: it dials a relay's
// SandboxWorker.Attach, serves the stream with a session.Session, and
// re-dials with exponential backoff (500 ms doubling to 30 s, with jitter)
// when the stream ends, keeping the session and so its dedup cache. A
// relay that refuses the token ends Run with ErrTokenRefused: no retry can
// succeed.
//
// The worker holds no credentials other than its relay token, which it
// keeps out of the commands' environment, and does no orchestration: it
// only executes commands and returns bytes. It probes once at start
// whether executions can each have a box (box.go) and says so at Hello;
// without boxes it takes one execution at a time. Subpackages: runner (one
// command), session (one connection), relaytest (an in-process relay for
// tests).
package worker
