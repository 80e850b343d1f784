// Package protocol is the one definition of the pulse-server client
// protocol, imported by both of its ends: the server (internal/server)
// and the client (backend/remote). PROTOCOL.md, beside this file,
// describes the wire for implementers in any language.
//
// It holds:
//   - the names: actions, frame types, statuses, the error codes of error
//     frames and of a result's error_code, the Python server's error
//     messages (kept verbatim), the values of a result's error field, and
//     the feature names of the capabilities reply;
//   - the messages: the client payloads (Submit, Attach, Upload,
//     ExecutionRef, Empty) with EncodeRequest, and the server payloads
//     (Reply, StreamEvent, Result) with ParseFrame for clients;
//     ParseMessage and ParseSubmit validate client frames for servers, and
//     ResponseFrame, ErrorFrame, StreamFrame and RawFrame build server
//     frames;
//   - the bounds of submit fields (MaxTimeout, MaxStdinBytes, ...), which a
//     client checks before it sends;
//   - the error classes at the wire edge: CodeOf maps a backend error
//     class to the code a server sends, ErrorOf maps it back, so that
//     errors.Is works on the client as it would on the server;
//   - the archive formats: the upload (a gzip-compressed tar of regular
//     files, directories and symlinks, whose names pass CleanName and
//     whose links pass CheckLinkTarget and Resolve, within ArchiveLimits)
//     and the overlay archive of download_artifact (PackOverlay,
//     UnpackOverlay).
//
// The overlay archive holds every created or changed entry at its path
// (regular files byte-exact with their permission bits, directories,
// symlinks with their targets), sorted, with mtime 0, and then a
// manifest, ManifestName, listing the deleted paths:
//
//	{"version": 1, "deleted": ["old.txt", "dir/gone"]}
//
// The manifest lives under ".pulse/", where no overlay entry can be, so it
// never collides with a file the command wrote.
//
// What it promises: the wire stays compatible with the Python server's
// clients; every extension is an additive field, and one a client must
// ask for is listed in Features. Every parser here takes untrusted input
// and fails closed (ErrInvalid, ErrFrame, ErrUnsafe, ErrLimit,
// ErrCorrupt); each has a fuzz target.
//
// It depends on backend (for Overlay, Capabilities and the error
// classes), policy, secrets and pathguard, and on nothing under internal/.
package protocol
