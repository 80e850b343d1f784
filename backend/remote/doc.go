// Package remote is the backend that runs commands on a pulse-server over
// its authenticated WebSocket protocol: the protocol of the Python server
// it replaces, plus additive fields, whose messages, names and archive
// formats are package protocol's (documented in protocol/PROTOCOL.md).
//
// Build it with New (WithURL, WithToken, WithTLSFiles, WithLogger) or
// FromEnv, which reads PULSE_REMOTE_URL, PULSE_REMOTE_TOKEN and
// PULSE_TLS_CERT/KEY/CA. A wss:// URL verifies the server against the CA
// bundle (or the system roots) and presents the client certificate; TLS
// files with a ws:// URL are refused rather than ignored.
//
// What it promises:
//
//   - Capabilities are the server's: Probe fetches them with the additive
//     "capabilities" action and caches them. Before a successful Probe
//     every network and secret mode reads Unsupported, so a caller that
//     checks enforcement fails closed. Exec refuses with
//     backend.ErrUnsupported a mode the server cannot enforce, before
//     anything is sent.
//   - Exec packs the workspace as a tar.gz (regular files and directories,
//     and symlinks that stay inside the workspace when the server lists
//     the symlinks feature; .pulse/ excluded; other symlinks and special
//     files left out and logged, since the server refuses them), checks the server's size limits
//     before sending (ErrTooLarge), sends it (with the submission, when it
//     is under 1 MiB and the server lists the workspace feature; else
//     uploaded first), submits the command with
//     "encoding": "base64" so output is byte-exact (and, to a server that
//     lists the feature, "result_output": "omit", so the result does not
//     repeat the output), writes each stream event to Request.Stdout or
//     Request.Stderr as it arrives, maps the result, and downloads what the command wrote as Result.Overlay. The
//     local workspace is only read.
//   - Every Exec uses its own connection and a fresh server-side
//     execution id: Request.ExecutionID reduced to the protocol's
//     characters plus a random suffix (the caller's id also travels as
//     correlation_id), so a repeated id never collides with an old one.
//   - A dropped connection is not a failed command. Exec reconnects with
//     backoff (50ms doubling to 2s, within WithReconnectWindow, 60s by
//     default so that it outlasts the server's own dead-peer detection) and
//     attaches with after_seq set to the last event it delivered; events
//     are numbered, and any already delivered is dropped, so every byte of
//     output reaches the writers exactly once. A drop before the submit
//     was acknowledged is settled the same way: attach finds the
//     execution and follows it, or finds nothing and the submit is sent
//     again, so the command runs once. Uploads and overlay downloads are
//     retried on a new connection. Only the server saying
//     UNKNOWN (it restarted while the command ran) or NOT_FOUND ends the
//     execution, with ErrExecutionLost; so does a result saying the
//     pulse-worker running it was lost (WORKER_LOST), with
//     ErrUnavailable too.
//   - Cancelling ctx, going over Limits.OutputBytes, or Close sends
//     "cancel" and waits (WithCancelWait) for the server's result, so the
//     Result says how the command really ended.
//   - Errors say what went wrong: ErrUnreachable (DNS, refused, lost and
//     not regained), ErrUnauthorized (401), ErrTLS, ErrVersion (not a
//     pulse-server, or one without the capabilities action), ErrCapacity;
//     each also wraps backend.ErrUnavailable. A command the server could
//     not start comes back with the class its result's error_code names
//     (backend.ErrInvalidRequest, ErrUnsupported or ErrUnavailable),
//     never guessed from a message. A command that ran but whose writes
//     the server lost (OVERLAY_LOST) or that could not be downloaded
//     returns its Result with ErrOverlay and backend.ErrOverlayLost.
//
// Stdin of Exec: against a server that lists the process feature, Exec
// submits the command as a process and streams Request.Stdin to it while
// it runs, as Start does, so an input that ends only after the command has
// printed (or never ends) works, and no size limit applies; input already
// in memory (*bytes.Reader, *strings.Reader, *bytes.Buffer) still travels
// whole with the submission, which saves a request. Otherwise Exec reads
// Request.Stdin whole (at most WithMaxStdinBytes and the server's
// max_stdin_bytes) and sends it in the submit's stdin field when the
// server lists that feature in its capabilities reply. Against a server
// without it, the input is uploaded as a file beside the workspace that
// the command takes as fd 0 and removes before running; the file never
// appears in the overlay. Either way a stdin that does not end before the
// command starts cannot be sent to such a server.
//
// Background processes (backend.Starter, TerminalStarter): against a
// server that lists the process feature, Start submits the command with
// "process": true and returns once the server says it runs. Output,
// reconnection, cancellation (Kill is a cancel: the server's executor
// ends the whole tree), the Result and the overlay are Exec's. Input is
// streamed from Request.Stdin as it is written, in stdin requests that
// carry their offset, so a request sent again after a lost connection
// delivers nothing twice. Signal and Resize are one request each;
// DialPort (for the facade's Expose) is a dial through the server to a
// port the execution's network policy exposes, refused with
// ErrPortNotExposed otherwise. Against a server without the feature (the
// relay, an older server) Start returns backend.ErrUnsupported. A
// process handle belongs to the token that started it: the server
// answers any other as if the execution did not exist.
//
// Limits: the timeout travels as timeout_s; the output cap is applied
// here and sent too. Memory, CPU, pids and file-size limits travel in the
// submit's limits field to a server that lists that feature; the server
// clamps them to its ceilings and its executor enforces them at the
// levels Capabilities reports. Against a server without the feature they
// are not sent and read Unsupported.
package remote
