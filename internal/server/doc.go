// Package server is the pulse-server runtime: an authenticated WebSocket
// API (the protocol of the Python server it replaces: its messages,
// names and archive formats are package protocol's, documented in
// protocol/PROTOCOL.md) over an Executor and a durable store.
//
// What it promises:
//   - Authentication on the upgrade with a bearer token compared in
//     constant time; the tenant is a hash of the token and scopes every
//     action: another tenant's execution answers exactly as one that does
//     not exist.
//   - Every request gets exactly one reply carrying its request_id (null
//     when it had none or an invalid one), including status of a running
//     execution and refusals.
//   - At most the configured number of executions run at once; a
//     submission over the limit is refused at once, never queued.
//   - Every stream event has a per-execution seq starting at 1. Attach
//     with after_seq delivers each later event exactly once, whether it
//     comes from history or live; history is persisted, so this holds
//     across reconnects and server restarts.
//   - An execution outlives the connection that submitted it; only cancel,
//     its timeout or server shutdown stop it. After a crash, executions
//     that were running are UNKNOWN, never replayed: marked by the
//     server when it starts again, or, with replicas sharing a Postgres
//     store, by another replica once the dead one's lease expires
//     (WithLease); status and attach then give the reason.
//   - Uploads are extracted fail-closed (see package artifact); what a
//     command changed is returned by download_artifact as an overlay
//     archive with a deletions manifest.
//   - Protocol extensions are additive and listed as features in the
//     capabilities reply (stdin, limits, result_output on submit;
//     symlinks in uploads). A client that uses none of them gets the
//     behaviour of the Python server's protocol, save that an upload
//     holding symlinks that stay inside the workspace is now accepted.
//
// Executors: Local runs commands with a backend.Backend on this machine;
// the relay (package relay) hands them to pulse-workers attached over gRPC.
package server
