// Package relay is the server's executor that runs executions on
// pulse-workers attached over gRPC (the SandboxWorker service, Attach).
//
// A worker connects, authenticates with a bearer token and says how many
// executions it takes at once and which programs it has; the relay keeps
// it while it sends frames (heartbeats included) and counts it lost after
// its liveness window of silence, failing what it was running with
// ErrWorkerLost.
//
// An execution goes to the least-loaded live worker with a free slot and
// every required program (WithRequires), as a few worker execs in a fresh
// directory there: the workspace is sent in (a tar.gz, base64 on stdin, in
// pieces under gRPC's message limit) and unpacked, the command runs with
// an environment built from scratch and its output capped, and the
// directory is removed whatever happened. On a worker whose Hello says it
// boxes executions, the command runs in a box of its own (Exec.box) with
// the network policy, the limits and, for an allowlist, the secrets bound
// to hosts for the egress proxy beside it; the overlay is the archive the
// box wrote beside the directory, and the proxy's connections come back in
// End. On any other worker (one execution at a time) the directory comes
// back and is compared with the snapshot taken before to give the overlay. Cancelling the
// execution sends Abort and waits for the worker's answer.
package relay
