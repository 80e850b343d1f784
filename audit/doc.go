// Package audit writes and verifies the tamper-evident audit log: one JSON
// object per line (schema in SCHEMA.md), every string field scrubbed of
// secrets, each line chained to the one before by SHA-256.
//
// Promises:
//   - A line is written with one append while an advisory lock (flock on
//     PATH.lock) is held, and the chain head is read from the file under
//     that lock, so any number of processes appending to one path keep one
//     valid chain. A torn last line left by a crashed writer is cut off by
//     the next append.
//   - RecordBatch appends many events under one hold of the lock with one
//     write: no other writer's line falls between them, and a refused
//     batch writes nothing. A crash during the write can leave a prefix of
//     the batch (whole, chained lines and perhaps a torn one), never a gap.
//   - hash = hex(SHA-256(prev_hash || the line's bytes up to, not
//     including, its final ,"hash":... member, then "}")). The hash covers
//     the bytes as written, so any change to a line shows.
//   - Rotation (WithMaxSize) renames the file to PATH.<last seq> and the
//     chain continues in the new file; Verify checks all of them as one.
//     A batch is never split across files: the file is rotated before it.
//   - Verify reports the first modified, deleted, inserted, reordered or
//     torn line by file, line and seq, and never panics on bad input.
//     It checks the log as it stood at one moment (the head record, the
//     list of rotated files and the live file's length, taken under a
//     shared hold of the lock), so writers appending and rotating while
//     it reads never make it report a gap or a cut.
//   - A head record (PATH.head) names the last event appended; it is
//     rewritten after each append under the lock (a keyed writer that
//     finds it empty writes it once before its lines too, so a crash
//     between lines and head never leaves a keyed log without one, and a
//     full disk refuses the append instead). Verify reports a log
//     that ends before it (lines cut from the end, the file emptied or
//     removed) as ErrTruncated, and a writer that finds such a log records
//     an audit-head-mismatch event before appending on, so later appends
//     cannot hide the cut.
//   - With WithKey the chain is keyed: each hash (and the head record) is
//     HMAC-SHA256 under a key kept outside the workspace (LoadKey), so
//     rewriting the log undetectably needs the key. Without a key the
//     chain is SHA-256, which detects accidents and edits but not a
//     rewrite by someone who can write the directory. SCHEMA.md has the
//     threat model; ExpectAnchor covers what neither can see (the log and
//     its head both rolled back to an earlier copy).
//   - OCSF and ECS return an event as an OCSF 1.3 or ECS 8.11 object
//     (mapping in SCHEMA.md).
//   - Files are created with mode 0600.
//
// Where each part lives:
//   - logger.go: Open, the options, Record and RecordBatch (lock, read the
//     head, chain, rotate if due, write, update the head record), Sync and
//     Close.
//   - chain.go: the hash chain — linking events into lines (chain), the
//     hash (chainHash, keyed by Key.hashOf), and reading the chain head
//     back from the end of the file, repairing a torn tail (current,
//     readHead, lastLine) and checking it against the head record.
//   - rotate.go: rotation (rotate, rotatedName), finding the rotated files
//     (Files), and following a rotation made by another process (reopen).
//   - head.go: the head record's format. event.go: the event and its
//     canonical encoding. key.go: keys. verify.go: Verify. export.go:
//     OCSF and ECS.
//   - The append lock is taken with internal/flock, which honours ctx.
package audit
