// Package pathguard keeps every file path the project touches inside one
// workspace root.
//
// A Guard promises:
//
//   - Resolve returns an absolute path inside the root, or an error wrapping
//     ErrOutside. It refuses NUL bytes, paths longer than MaxPathLen, names
//     longer than MaxNameLen, ".." escapes, absolute paths elsewhere, and
//     symlinks, final or intermediate, whose targets lead out of the root
//     (which also covers /proc/self/... style indirection, since /proc is
//     outside every root). ".." in the caller's input is resolved lexically,
//     as filepath.Clean does; ".." inside a symlink target is resolved
//     physically and is refused as soon as it steps out of the root, even if
//     a later element would lead back in. Resolve alone is advisory: the
//     file system can change after it returns.
//   - Open and ReadFile are TOCTOU-safe: whatever is swapped in while they
//     run, they never open anything outside the root. On Linux they first
//     try one openat2(2) call with RESOLVE_BENEATH, which the kernel keeps
//     beneath the root; otherwise (a symlink to follow, an old kernel) the
//     path is resolved as Resolve does and opened with RESOLVE_NO_SYMLINKS,
//     or, where openat2 is missing, walked an element at a time with
//     O_NOFOLLOW, which refuses the same symlinks. The last element is
//     always opened with O_NOFOLLOW, so a symlink swapped in is refused,
//     and O_NONBLOCK, so a FIFO never blocks the caller. Anything but a
//     regular file is refused with ErrNotRegular; files larger than the
//     size limit (DefaultMaxFileSize unless WithMaxFileSize says otherwise)
//     with ErrTooLarge. Reads may also come from the directories given to
//     WithExternalReads. (On systems other than Linux the last element is
//     checked with Lstat and then opened through os.Root: still confined to
//     the root, but a FIFO swapped in meanwhile could block.)
//   - WriteFile replaces a file atomically: a temporary file in the same
//     directory, fsync, rename, fsync of the directory. It never writes
//     through a symlink (an existing symlink, directory or special file at
//     the destination is refused with ErrNotRegular) and never writes
//     outside the root, even under WithExternalReads directories. Missing
//     parent directories are created.
//   - Errors name the caller's path and the reason; they never reveal where
//     a symlink outside the root points.
//
// The package is also the one home of the rules about the workspace tree
// that the rest of the project shares, so that each is written once:
//
//   - IsReserved: ReservedDir (".pulse", Pulse's own state) and all under
//     it. Refusing it is the job of the callers that own an operation
//     (cowfs, the backends' request checks, the archive readers); this is
//     the definition they share. It matches in any case (".PULSE",
//     ".Pulse"), on every file system: on a case-insensitive one (macOS,
//     Windows shares, ext4 casefold directories, some Docker Desktop
//     mounts) those spellings are the reserved directory itself, and
//     cowfs creating ".pulse" reuses whichever spelling already exists.
//     On a case-sensitive one this reserves a few odd names too, a price
//     paid so that one rule holds wherever the workspace lives.
//   - IsWorkspacePath: how a request names an entry beneath the root
//     (clean, relative, not the root, not reserved).
//   - CheckLinkTarget: the one rule for a symlink target about to be
//     created in the workspace (by cowfs, or by unpacking an archive); it
//     judges the target's elements as written, not its cleaned form.
//   - WalkWorkspace: the one walk of a workspace that leaves the reserved
//     directory out, for everything that copies, scans or packs a tree.
package pathguard
