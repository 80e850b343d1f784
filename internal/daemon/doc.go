// Package daemon is the resident per-user pulse process that a CLI
// process hands its work to, so that a command pays for the sandbox's
// start-up (policy, copy-on-write store, audit chain, backend probe, a
// box) once, not at every `pulse exec`: the pattern of Bazel's server,
// Gradle's daemon and ssh-agent.
//
// # Who may talk to whom
//
// A daemon listens on a SOCK_SEQPACKET socket in a directory only its
// user owns (Dir: $XDG_RUNTIME_DIR/pulse-daemon, else the user's
// pulse-daemon-UID in the temporary directory where that is this user's
// already, else ~/.cache/pulse/daemon; CheckDir refuses one that is not a
// directory of this uid closed to group and others). Both ends check the
// other with SO_PEERCRED on every connection: the same uid, in the same
// user, pid and mount namespaces (a command inside a sandbox, which has a
// user namespace of its own, is refused even where it could reach the
// socket); the client also checks that the daemon runs the very
// executable it runs itself.
//
// # One daemon for one directory, environment and binary
//
// A daemon's socket name (Name) is a hash of the executable's identity,
// the working directory and the environment the daemon was started with,
// and a daemon serves only requests from that directory and environment:
// whatever the command resolves against them (a relative --workspace or
// --policy, $DOCKER_HOST, $PULSE_REMOTE_URL, $XDG_CACHE_HOME...) it
// resolves exactly as an in-process pulse would. A request for another
// directory or environment gets its own daemon. What a daemon holds for
// a workspace (the caller's business: the Handler) is never used for a
// request for another.
//
// # Wire format
//
// Every message is one JSON object in one SOCK_SEQPACKET packet of at
// most MaxMessage bytes:
//
//	client → daemon  Request (op "run", "status" or "stop"); a run carries
//	                 the client's stdin, stdout and stderr as SCM_RIGHTS
//	daemon → client  Reply{accepted, pid} or Reply{refused: why}
//	client → daemon  Signal{signal: N} for each SIGINT/SIGTERM the client gets
//	daemon → client  Reply{exit: code} once the command is over
//
// The command's output goes straight to the passed descriptors. A
// client whose daemon ends after it accepted the request, without an
// exit, gets ErrLost: the command may have run in part, and is not run
// again. A client that goes away cancels its request.
//
// # The client
//
// The client side (where a daemon listens, the peer checks, Run) is the
// package client beneath this one, which links none of the server's
// packages: the thin front end imports it alone (client's doc.go says
// why). This package's Run, Dir, Name and errors are client's.
//
// # Lifetime
//
// A client that finds no daemon runs its command itself and starts one
// (Start), detached, for the next command. A daemon exits once it has
// served no request for its idle time (a request runs until it ends: an
// MCP session or a review page open keeps the daemon), or at once when its socket is
// removed or replaced.
package daemon
