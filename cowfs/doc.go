// Package cowfs stages changes to a workspace as copy-on-write
// transactions and applies them only on Commit, crash-safely.
//
// # What it promises
//
//   - Staged changes never touch the workspace before Commit. They are
//     byte-exact: binary content, empty files, file modes, new
//     directories, symlinks and deletions.
//   - Transactions are durable and shared: they live under
//     <workspace>/.pulse/cow, survive a crash of the process that staged
//     them, and any process that opens the same workspace sees, diffs,
//     commits or discards them.
//   - Staging many paths costs a fixed number of fsyncs: Tx.Stage takes
//     a batch of ops (each meaning what the matching Write, Mkdir,
//     Symlink or Delete call means, refused one by one as those calls
//     would be, every limit checked before anything is written) and makes
//     the accepted ones durable together with three fsyncs, however many
//     there are. When Stage returns, all of them survive a crash; a crash
//     before leaves none of them in the transaction, never a part.
//   - Staging a large file costs bounded memory: an Op with Open
//     (StreamOp) instead of Data is read from an io.Reader through a
//     fixed 256 KiB buffer, hashed while it is copied to a blob file of
//     its own, fsynced, and only then named and referenced by a stage-log
//     record (one more fsync per streamed file; the fsync of blobs/ and of
//     the log are the batch's). Its size limit is checked while copying.
//   - Nothing under .pulse is ever staged, diffed or written by a commit.
//   - Optimistic concurrency: the first stage of a path records its
//     inode, device, size, mtime, mode and SHA-256; Commit compares all
//     but the device number (the hash always) and refuses with a
//     *ConflictError (reason created, deleted, replaced or modified) that
//     wraps ErrConflict, writing nothing and keeping the transaction. The
//     device number is recorded, not compared: a file system that comes
//     back under another number (a reboot, a loop or overlay mount) still
//     holds the same files, and an inode of another file system with the
//     same number, size, mtime, mode and content is the same file to
//     every reader. One thing is no conflict: a directory staged where
//     there was nothing (made by a command, or implied by a path beneath
//     it) that the workspace holds as a directory by now. Commit writes
//     into that directory and leaves it as it is, mode included (the WAL
//     marks it implicit), and Undo leaves it too; a file or symlink at
//     its path is still a conflict.
//   - Commits of all processes are serialised by flock(2) on
//     .pulse/cow/lock, held from validation to the end of the commit, so
//     no cooperating process can slip in between check and write. Every
//     method that takes the lock (all but the read-only views of a Stack
//     or Tx already loaded) takes ctx first and stops waiting for it when
//     ctx ends, returning ctx.Err(): a process stopped while holding the
//     lock cannot hang a cancelled caller.
//   - Every holder of the lock but a reader of the stack writes a new
//     random generation into the lock file before it changes anything, so
//     that a process that read the stack before knows with one read that
//     it is unchanged (FS.Stack then reads no transaction again). A holder
//     killed half way has already changed the generation. A pulse from
//     before the generation writes none: its new and removed transactions
//     are still seen (the tx directory is compared too), an append of its
//     to a transaction another process has read is not, until the next
//     change by a current one.
//   - A commit interrupted at any instant (SIGKILL, power loss) leaves
//     every file wholly old or wholly new, and the next Open rolls it
//     forward so that all are new. A commit whose targets someone else
//     changed meanwhile, or whose WAL is damaged or names a path outside
//     the workspace, is quarantined: kept, listed, never applied, never
//     deleted, and reported by FS.RecoveryErr wrapping ErrRecovery.
//   - Undo reverts the last committed transaction with the same
//     protocol, refusing with ErrConflict if any of its paths changed
//     since.
//   - Paths are literal. An entry beneath a symlink or a file does not
//     exist for cowfs, so nothing is ever read, removed or written
//     through a symlinked directory: targets are replaced by rename, an
//     ancestor that became a symlink is a conflict, and staging beneath a
//     file stages its replacement by a directory (which is what a
//     command's overlay holding that path means). Staging beneath a
//     symlink of the workspace is refused with ErrInvalidPath naming the
//     path (and saying when the link leads outside, as "up -> .." does):
//     a user's symlink is never replaced implicitly, only by staging a
//     directory (or a deletion) at its own path first. All workspace access
//     goes through an os.Root, so even a hostile symlink cannot lead
//     outside the workspace.
//
// What it does not keep: a replaced file gets the committing process's
// owner and group, and loses extended attributes and ACLs; a file with
// other hard links is replaced, not rewritten in place, so the other
// names keep the old bytes. Setuid and setgid bits are never staged on
// files (a sandboxed command must not plant a setuid program that a
// privileged commit would install).
//
// # The pending stack
//
// A workspace's open transactions form an ordered stack (FS.Stack):
// ordered by creation time, then id, whichever process began them, read
// under the lock so that a reader never sees part of a batch. A command
// runs on the workspace plus every transaction, bottom first; its writes
// become a new transaction on top. Changes keep their snapshot of the
// workspace, so commit-time conflict checks are unchanged; a deletion of
// a path that only a lower transaction holds is a whiteout record
// (WhiteoutOp): absent in the view, nothing to commit.
//
// Stack.View (and Lookup) reduce the stack to one entry per path: the
// topmost change, with the bottom-most snapshot; a file, symlink or
// deletion drops what lower transactions staged beneath it. Stack.Layers
// gives each transaction as a layer (its entries plus the directories on
// the way) for a backend to lay over the workspace, overlayfs style.
// Stack.TxDiff shows one transaction against the stack below it;
// Stack.Diff the whole stack against the workspace.
//
// FS.CommitAll checks every path against the workspace, squashes the
// stack and commits the result as one transaction: all or nothing.
// FS.Squash replaces the bottom transactions by one with the same
// effect, placed where the topmost of them was; it writes the new
// transaction (its begin record lists the ids it squashes) before it
// removes the originals, and a reader that finds both removes the
// originals, so a crash in between changes nothing in the view.
// Committing or discarding one transaction alone is refused with a
// *StackError (ErrStackDependency) when another pending transaction
// shares its paths (Stack.CheckCommit, Stack.CheckDiscard): one above it
// was made on top of it, and one below it would be overtaken. Empty
// transactions belong to commands still running and are left alone by
// squash, commit --all and discard --all. There is no bound on open
// transactions by default (WithMaxOpenTransactions sets one).
//
// A transaction that cannot be read is left out of the stack and listed
// in Stack.Damaged (and logged), never merged; FS.CommitAll and FS.Squash
// refuse (ErrDamaged) while there is one, since those above it may depend
// on it. FS.DiscardAll drops the others and leaves it.
//
// # Lanes
//
// The stack above is that of one lane. Every transaction records, in its
// begin record, the lane that made it ("lane", absent for the default
// lane: transactions from before lanes, and every FS opened without
// WithLane, so the CLI and existing workspaces see what they always saw).
// FS.Fork makes a new lane, a small immutable record lanes/<id> naming
// its parent lane and the fork point; nothing is copied. A lane's stack
// is its own transactions on top of what its parent's stack held at the
// fork: the parent's transactions created up to the fork point (and,
// through the parent, the grandparent's up to the parent's fork point,
// and so on), less the ones listed as excluded — commands of the parent
// still running at the fork (their transactions empty), or unreadable
// then. From the fork on, the two diverge: neither sees what the other
// makes. Order is creation time throughout, so a lane's own transactions
// sit above what it inherited. Begin dates a transaction after every fork
// point, so a clock stepped back cannot slip a parent's later
// transaction under a fork's cut.
//
// A transaction leaves every lane's stack when it is committed or
// discarded. A parent committing a shared transaction changes nothing
// in a fork's view (the workspace holds it now); discarding one takes it
// out of the fork's view too. Either is refused (*StackError) while a
// transaction of any lane that sees it depends on it: one above it in a
// stack that holds it (discard), or anywhere in such a stack (commit).
// So:
//
//   - CommitAll commits the lane's whole stack, inherited transactions
//     included (they reach the workspace, which is what the parent then
//     sees), refused while another lane's transaction outside it depends
//     on one of them.
//   - DiscardAll drops the lane's own transactions only; what it
//     inherited belongs to the parent. Refused while another lane's
//     transaction was made on top of one of them.
//   - Squash takes only the lane's own transactions, and only a run that
//     every other lane sees alike and no lane excludes (the result sits
//     where the topmost was, so on the same side of every fork point): no
//     fork's view ever changes because its parent squashed.
//   - Committing or discarding one transaction by id works from any lane
//     (List shows each one's lane), with the dependency check above.
//
// A lane record is one frame (record.go) holding {"v":1,"id","parent",
// "cut","exclude"}: cut is the fork point in Unix nanoseconds, exclude a
// list of transaction ids. It is written as lanes/.new-<id>, fsynced,
// renamed into place and lanes/ fsynced, before Fork returns; a crash
// before the rename leaves a hidden file that is never read. It is never
// changed afterwards. A lane whose record is damaged or missing cannot
// be opened (ErrLane) and its stack cannot be read; its own transactions
// are in no other lane's stack (List still shows them, and they can be
// committed or discarded by id).
//
// A lane record goes once nothing needs it: no pending transaction of
// the lane, no lane forked from it, no FS open on it and none open that
// forked it (an open FS holds a shared flock on the record; the remover
// holds the workspace lock and takes the record's flock exclusively).
// FS.Close and Lanes remove such records, children before their parents,
// by one unlink each and an fsync of lanes/; nothing is removed while a
// pending transaction or a lane record cannot be read. A removed lane
// cannot be opened again (ErrLane): it had nothing left to show.
//
// # Symlinks
//
// A committed link never leads a reader outside the workspace or into
// .pulse. The kernel resolves ".." against the directory a symlinked
// component led to, not lexically, so a target is judged by its
// elements as written: it must be relative; ".." may only come as one
// leading run, which climbs from the link's own directory and must stay
// inside the workspace; and no element may be .pulse (in any case). So
// "l/../../etc/passwd" is refused even though it cleans to etc/passwd:
// with l a link to the workspace root it is the host's /etc/passwd.
// The leading run climbs real directories, because Commit and recovery
// check that every ancestor of what they create is one (and refuse a WAL
// creating anything beneath a path it makes a file, link or deletion);
// the rest only descends by name, through entries that are either real
// or links under the same rule. Only a link the workspace already held
// (placed there by its owner) can lead further.
//
// The rule is applied when a link is staged, again when it is committed
// (a stage log is a file, edited or not since), and again to a WAL being
// rolled forward, which is quarantined if it breaks it. The one
// exception is Undo restoring a link its commit replaced, whatever its
// target: the workspace held it before.
//
// # Diff
//
// Tx.Diff prints a git-style unified diff that GNU patch -p1 and git
// apply accept. Its line diff is git's histogram diff (linediff.go),
// with git's fallback to Myers' algorithm where every common line of a
// region repeats more than 64 times, and git's sliding of change groups:
// its hunks are the ones `git diff --histogram` shows (the same lines on
// repetitive and ordinary input, within a percent on random input, as
// the tests check against git itself), and it is faster than running
// git on the same two files.
//
// Diff's memory is bounded. A file larger than DiffMaxBytes (8 MiB) or
// DiffMaxLines (524,288 lines) on either side, and a binary file (a NUL
// in its first 8000 bytes, git's rule), is summarised instead of diffed:
//
//	Binary files a/path and b/path differ
//	old: 1073741824 bytes, sha256 <64 hex digits>
//	new: 1073741901 bytes, sha256 <64 hex digits>
//
// The workspace side is hashed in one streamed pass, the staged side's
// hash is the one it was staged under, so neither is read whole. Once
// the diff text passes 64 MiB every further content change is summarised
// too. A file shown line by line has its staged bytes checked against
// their size and hash first: the diff shows what a commit would write,
// or fails with ErrDamaged naming the path.
//
// Every change of permission bits shows, with the real bits: "old mode
// 100600" / "new mode 100666", "new file mode 100600", even when the
// content is the same, so a diff that looks empty commits nothing. GNU
// patch applies these modes; git apply takes the file and keeps only the
// owner-exec bit, as git does. A directory whose mode changes gets one
// line that neither tool reads as part of a patch:
//
//	directory "path": old mode 040755, new mode 040777
//
// Created and removed directories are not shown, as in git (their files
// are). A diff holding only directory lines has nothing for patch to
// apply (GNU patch calls it garbage).
//
// # On-disk format
//
// Everything lives under <workspace>/.pulse/cow:
//
//	lock                       flock(2) target; its first 16 bytes are the stack generation
//	tx/<id>/                   one open (or committing) transaction; id is 16 hex digits
//	tx/<id>/stage.log          record file: begin, then set/unstage records
//	tx/<id>/seal               how long the stage log was when its last append returned (two slots)
//	tx/<id>/undo               in a transaction Undo made: the journal entry it reverts (its begin record's "undoes")
//	tx/<id>/blobs/<sha256>     staged file contents, named by their SHA-256
//	tx/<id>/blobs/pack-<id2>   the file contents of one Stage batch, one after another
//	tx/<id>/prev/<n>           op n's target before the commit (undo, rollback): a hard link to it, or a copy
//	tx/<id>/failed             present when the last commit failed and was rolled back: why
//	tx/<id>/wal                the commit's write-ahead log (record file)
//	tx/<id>/after              after-images of each op (record file)
//	tx/<id>/quarantine         present when recovery refused the WAL: the reason
//	tx/.new-<id>/              a transaction being created; removed by Open
//	done/<seq>-<id>/           a committed transaction kept for Undo (same files)
//	trash/                     directories being removed; emptied by Open
//	lanes/<id>                 a forked lane (record file, one record; see Lanes)
//
// and, beside a target in the workspace, while a commit applies only:
//
//	.pulse-cow-<id>-<n>        op n's new entry; after an exchange, the entry it displaced
//	.pulse-cow-<id>-<n>-old    what op n's removal moved aside
//
// Hidden names (leading dot) are work in progress and never read as
// state. Directories are created under a hidden name and renamed into
// place, and removed by a rename into trash, so each appears and
// disappears atomically.
//
// A record file is a sequence of frames:
//
//	uint32 LE  payload length, 1 .. 1 MiB (0 is refused: a zeroed sector is corruption)
//	uint32 LE  CRC-32C (Castagnoli) of the payload
//	[length]   payload: one JSON object
//
// A frame cut short by the end of the file is a torn tail (the error wraps
// io.ErrUnexpectedEOF); in a stage log it is truncated away under the lock
// (the append it belonged to never returned). Any other damage (bad
// length, bad checksum, bad JSON) is corruption.
//
// A torn tail only ever lies past what the last append that returned
// wrote, and the seal says where that is: after each append's fsync, the
// log's length goes to the seal (two 32-byte slots written in turn, each
// "PSL1", a sequence number, the length and a CRC-32C, fdatasynced; the
// valid slot with the higher number counts, so a torn seal write leaves
// the previous one). A log whose whole records end before the sealed
// length lost records: it was cut (at a record boundary or not) or
// damaged, and it is refused with ErrDamaged saying changes were lost,
// never read as a torn tail, so a commit never succeeds with staged
// changes silently gone; List shows it quarantined with that reason. A
// damaged or missing seal is refused the same way, and so is a log
// without a whole begin record (emptied, or cut inside its first
// record): a transaction is renamed into place with its begin record, so
// that is damage, never an empty transaction, and the log is left as it
// was found. The begin record of a sealed log says "sealed":true; logs
// from before seals have none.
//
// The stage log holds {"op":"begin","id","desc","created","undoes",
// "squashes","lane","sealed"}, then {"op":"set","change":{...}}, {"op":"unstage","path"}
// and {"op":"whiteout","path"} records (a set of the path clears a
// whiteout), each
// appended and fsynced before Write, Delete, Mkdir, Symlink or Stage
// returns. A change is {"path","kind","mode","blob","pack","off","size",
// "target","implicit","before":{"type","ino","dev","size","mtime_ns",
// "mode","sha256","target"}}; the last set record of a path wins, and its
// before snapshot is always the one taken when the path was first
// staged. A write's bytes are blobs/<blob>, or, when pack is set, the
// size bytes at off in blobs/<pack> (named "pack-" and 16 hex digits).
//
// When one call appends more than one record (a Stage batch, or a write
// with the parents it stages), they are headed by {"op":"batch","n"}
// counting them, and a reader takes the n records that follow all
// together or not at all: a batch missing records at the end of the log
// is, like a torn frame, an append that never returned, ignored by
// readers and cut away by the next writer under the lock. (A long write
// can stop short at a page boundary when the process is killed, and a
// power loss before the fsync may keep any prefix of it; the count makes
// either leave nothing half-visible.)
//
// A staging call writes its blob (temp, fsync, rename, fsync of blobs/)
// before its record, so a crash between the two leaves only an
// unreferenced blob. A Stage batch checks and plans every op under the
// lock first, writing nothing; then writes the bytes of the accepted
// ops, each distinct content once, to a new pack file, fsyncs it and
// blobs/ [failpoint 103]; then appends the batch record and the records
// (all but the last [104], the last), fsyncs the log [102]. A crash at
// 103 or 104 leaves an unreferenced pack and none of the batch; at 102,
// all of it. Unreferenced blobs and packs go when the transaction does.
//
// The WAL is {"t":"header","v":1,"tx","desc","created","undoes","n"},
// then n records {"t":"op","i","change","prev","dir"} sorted by path,
// then {"t":"end","n"}. dir is the inode, as validation found it, of the
// directory the op works in (its parent) when that is neither the
// workspace nor an op; absent in WALs from before it was recorded, whose
// directories are then not checked so. It is only ever written whole
// (wal.tmp, fsync, rename, fsync of the directory), so any decoding
// fault means damage and the commit is quarantined, never partially
// trusted.
//
// # Commit protocol
//
//  1. Take the lock; re-read the stage log.
//  2. Validate every change against its before snapshot (hashing every
//     existing file); check that ancestors of what is created are real
//     directories and that removed directories hold nothing else; read
//     every staged blob and check its size and SHA-256 (a missing, cut,
//     zeroed or flipped blob refuses the commit with ErrDamaged naming
//     the path, before anything is written); check the workspace's file
//     system has room for the new files (else an error wrapping
//     syscall.ENOSPC, before anything is written). [failpoint 1]
//  3. Write wal.tmp, fsync [2], rename to wal [3], fsync tx/<id> [4].
//     This rename is the commit point.
//  4. Apply (each target is checked again right before it is replaced,
//     and what was replaced is checked after; so is the directory an
//     op works in: another directory at its path, the validated one
//     renamed away, is a conflict (replaced), and neither the commit,
//     its rollback nor recovery puts anything there; what the commit
//     did beneath the renamed one cannot be seen, so it stays
//     committing until that directory is back, as with one swapped for
//     a symlink):
//     a. removals, deepest first: each entry is renamed (RENAME_NOREPLACE)
//     to an "old" name beside it, checked there against its before
//     snapshot (a directory must hold only what the commit moved aside
//     in it), and a removed file is hard-linked as prev/<n> [5 each];
//     b. creations, shallowest first: each file is written to a "new"
//     name beside its target, its bytes hashed on the way and checked
//     against the record (a mismatch removes it: damaged bytes never
//     reach a target), and fchmod'ed [6 each]; each new directory is made
//     under a temp name, chmod'ed [11] and renamed into place, so it never
//     exists with another mode; symlinks are made at their new name;
//     c. one syncfs(2) per file system touched: every new file is
//     durable [12];
//     d. publication, shallowest first: over a file or symlink, the new
//     entry is checked once more [15] and exchanged with the target
//     (renameat2 RENAME_EXCHANGE) [13]; the displaced entry, now at the
//     new name, is checked against the before snapshot: if it changed,
//     the exchange is undone and the commit refused as a conflict; else
//     the displaced file is hard-linked as prev/<n>. Over nothing, a
//     rename with RENAME_NOREPLACE, so an entry that appeared meanwhile is
//     a conflict, never overwritten [7 each];
//     e. one syncfs per file system: every rename is durable [8].
//  5. Write the after-images (temp, fsync, rename, fsync) [9]; make
//     sure every replaced file is in prev/ (a crash may have come between
//     an exchange and its link), sync, remove the entries moved aside,
//     sync [14]. The after-images come first so that a commit that
//     cannot write them (a full disk) is rolled back while the entries
//     it replaced are still beside the targets; recovery of a commit that
//     wrote them writes nothing when they are what it finds.
//  6. Rename tx/<id> to done/<seq>-<id>, fsync both directories [10];
//     trim the undo journal to its depth; release the lock.
//
// The saved versions in prev/ are hard links to the replaced inodes, so
// a commit copies no previous bytes and fsyncs no file one by one: its
// cost in syncs is fixed (the WAL's, four syncfs, the after-images' and
// the journal's), not per file. A file with other hard links, or on
// another file system than .pulse, is copied instead (and the copy
// checked against the before hash).
//
// If applying fails past the commit point — the disk fills up, a blob is
// damaged, a target changed — the commit is rolled back: creations are
// taken back deepest first, then the removed entries put back shallowest
// first, from the entries beside the targets (the very entries
// validated, so a retry finds no conflict) or, where a crash lost them,
// from prev/; an entry that is neither the commit's nor the before one
// is left alone. The WAL and prev/ are removed and the transaction is
// open again; tx/<id>/failed holds why, and List shows it as Reason. If
// even the rollback fails, the WAL stays, for the next Open. A failure
// once the entries beside the targets are removed (step 5) is not rolled
// back but left for the next Open to finish: prev/ holds only a copy of
// a file with other hard links, and no directory or symlink, so what it
// put back would be new entries the transaction's before images no
// longer match.
//
// Recovery at Open runs under the same lock. For each tx/<id> with a wal
// it checks every target is in its before state, its after state, or
// absent between removal and creation (a directory it makes may exist
// with another mode: giving it its mode is idempotent), and every ancestor
// is a real directory, and it checks the staged bytes of every write not
// yet done as step 2 does; then it redoes steps 4 to 6, skipping what is
// already done. Every step is idempotent, so a crash during recovery is
// recovered the same way. A target someone else changed, or damaged
// staged bytes, quarantine the transaction (and the new entries beside
// the targets are removed); a roll-forward that fails otherwise (a full
// disk) is rolled back as above and the transaction is pending again.
// Discard of a transaction stuck committing rolls it back, then deletes
// it, so there is always a way out. A tx/<id> with only wal.tmp never
// reached the commit point: wal.tmp and prev are dropped and the
// transaction stays open — unless Undo made it (an undo file beside its
// stage log, whose begin record names the entry it reverts; one made
// before the undo file existed is left open): Undo holds the lock until its transaction is
// committed or removed, so an open one is an undo killed before its
// commit point, or rolled back by recovery, and it is dropped, leaving
// the journal as it was for Undo to be run again.
//
// # Writers that do not take the lock
//
// An editor writing a target while a commit runs is caught: by the
// validation, by the check right before the replacement, and by the
// check of the displaced entry after the exchange, which is undone if
// the entry changed. In a test racing a real process against 100
// commits, no edit was lost (27 of 100 were before these checks). What
// remains is a write into a file the editor opened before the exchange
// that lands after the check of the displaced file (the time to hash
// that one file): it goes to the replaced inode, which is kept as
// prev/<n> (so Undo then refuses it as damaged, rather than restore it),
// not to the workspace. On a file system without RENAME_EXCHANGE the
// window is from the last check to the rename.
//
// Undo builds a transaction whose changes restore the before state of the
// last done entry (from prev/ and the WAL), whose before snapshots are
// that entry's after-images, and commits it with the same protocol; on
// success the done entry is dropped instead of a new one being added,
// and, for each restored path, the after-images of the latest earlier
// entry that changed it take the identity of the restored file wherever
// their content matches (the restored bytes have new inodes), so that
// entry can be undone in its turn, even with entries of other paths
// in between.
//
// # Failpoints
//
// A process using cowfs started with PULSE_COWFS_FAILPOINT=NAME (or
// NAME:N) kills itself with SIGKILL the first (N-th) time it reaches
// that step, so a crash test outside the package can stop a commit or a
// staging call at any of them and check what recovery makes of it. The
// names, with the numbers used above, in protocol order: validated [1],
// wal-temp [2], wal-renamed [3], wal-synced [4], apply-removed [5, once
// per removal], apply-mkdir [11, per new directory], apply-temp [6, per
// new file], apply-synced [12], apply-checked [15, per exchange],
// apply-exchanged [13, per exchange], apply-renamed [7, per published
// file or symlink], applied [8], after-written [9], cleaned [14], done
// [10]; for staging: stage-blob [101], stage-appended [102],
// batch-packed [103], batch-torn [104], stage-log-synced [105],
// batch-streamed [106, per streamed op, its temp blob durable and not yet
// named]. FailpointNames lists them. An
// unknown name stops the process at start-up (exit status 2), so a
// misspelt crash test fails instead of passing without a crash. Unset,
// it costs one nil check per step.
//
// # Limits
//
// Per-file size, total bytes staged by the open transactions of the
// workspace, open transactions, and changes per transaction; exceeding
// one returns a *LimitError wrapping ErrLimit. The staged total is
// counted at Open from the stage logs (never from the blobs), then kept
// up to date incrementally from the records this FS appends or reads; it
// is recounted from the stage logs only before refusing a write, since
// another process may have committed or discarded meanwhile (at most
// once per Stage batch). In a batch every op is checked against the
// transaction as the ops before it leave it, all before anything is
// written; an op over a limit is refused alone, its error in Stage's
// result, and none of its bytes reach the pack.
//
// # Where each part lives
//
//   - fs.go: Open, the options, the workspace lock (FS.lock, on
//     internal/flock, honouring ctx), Begin, Tx, List, the limits'
//     accounting.
//   - tx.go: Tx and its staging calls (Write, Mkdir, Symlink, Delete,
//     Discard), each one stageOp: plan the records, append them.
//   - plan.go: what a staging call records — the effect of each kind of
//     change on the transaction, the parent directories it implies, the
//     removal of a tree.
//   - stagelog.go: the stage log — its records, appending them as one
//     durable unit (appendRecs), replaying them and cutting a torn tail
//     (refreshLocked, replayLog), checking a decoded change. seal.go: the
//     seal that bounds a cut; record.go: the frame format; batch.go: Stage
//     and its pack files.
//   - wal.go: the WAL's format (encodeWAL, decodeWAL) and its op
//     predicates, and writing it in place (the commit point).
//   - commit.go: Commit in its phases (newWAL, validate, writeWAL,
//     applyWAL), the structural and symlink checks, finish (after-images,
//     the move into the undo journal, pruning it). apply.go: the applier
//     that performs a WAL on the workspace and rolls it back.
//   - recover.go: what Open does with a commit a crash left: roll forward
//     or quarantine.
//   - undo.go: Undo, an inverse transaction committed like any other.
//   - stack.go: the pending stack; lane.go: lanes and Fork; review.go: Unstage and Restage;
//     diff.go and linediff.go: Diff; workspace.go: reading the workspace
//     (snapshots, the symlink rule); rename.go: renameat2; failpoint.go:
//     the crash-test failpoints.
package cowfs
