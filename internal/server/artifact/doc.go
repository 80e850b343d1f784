// Package artifact is the server side of workspace archives: it unpacks a
// client's upload into a fresh execution workspace, and computes what a
// command changed in a workspace it wrote in place. The formats and their
// name rules (protocol.CleanName, protocol.CheckLinkTarget,
// protocol.Resolve, the overlay archive of protocol.PackOverlay) are
// package protocol's; this package applies them to disk.
//
// Extract fails closed. It accepts only regular files, directories and
// symlinks with relative, clean names, a symlink only when its target is
// relative and stays inside the workspace both lexically
// (protocol.CheckLinkTarget) and when resolved through every other link
// (protocol.Resolve, checked as each link is made and again at the end);
// it refuses absolute names, any ".." element in a name, other symlinks,
// hard links, devices, FIFOs and anything else, and it bounds the
// compressed size, the number of members and the bytes actually written
// (counted while copying, not trusted from headers, so a gzip or tar bomb
// stops at the limit). Files are created through an os.Root opened on the
// new workspace, so no name can reach outside it whatever the archive
// says. On any refusal the half-built workspace is removed. Entries under
// the reserved ".pulse/" directory are skipped: that directory is Pulse's
// own state and never part of a command's view. A member that would reach
// it through a link extracted earlier ("p -> ." then "p/.pulse/x"), and a
// link that leads into it, refuse the archive: the check is on where a
// name leads, not on how it is spelled. As with GNU tar, a member replaces
// a symlink or file an earlier member left at its name instead of writing
// through it; a non-directory member over a directory refuses the archive.
//
// For backends that write in place, Take snapshots a workspace (paths,
// modes, SHA-256 of contents) and Diff returns what changed since; for a
// workspace on a pulse-worker, PackDir ships it and DiffTar compares the
// archive sent back with the snapshot in memory, never extracting it.
package artifact
