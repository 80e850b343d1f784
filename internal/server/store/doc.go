// Package store is pulse-server's durable execution store: every
// execution's record and the stream events it produced, behind Interface,
// in one of two databases:
//
//   - Store, SQLite (pure Go driver, WAL mode): the embedded default, one
//     server, nothing to run.
//   - Postgres (pgx): several pulse-server replicas share one database;
//     records and events are rows, so any replica can answer for and
//     replay an execution another one ran. Selected by a postgres:// URL
//     (OpenDatabase); MoveSQLiteToPostgres copies a SQLite database in.
//
// What it promises:
//   - Schema changes are versioned migrations keyed on PRAGMA user_version
//     (Postgres: the table pulse_schema, under an advisory lock so that
//     replicas starting at once migrate once), applied in one transaction
//     each, so an interrupted upgrade leaves the
//     previous version intact. Versions 1 and 2 are the layout of the Python
//     server this one replaces, so its database files open and upgrade in
//     place.
//   - Every read of an execution is scoped by tenant: Get with another
//     tenant's id answers ErrNotFound, exactly as for an id that never
//     existed.
//   - Stream events are keyed by (execution_id, seq) and written in batches
//     to one append-only log file per execution in the directory beside the
//     database (its path plus "-events"), since output is the bulk of what
//     is persisted and SQLite would write it twice a page at a time. Events
//     returns them in seq order, with any an older version wrote into the
//     stream_events table, so a replay after a restart sees the same
//     events, once each, that a live client saw. A record cut short by a
//     crash ends its log. Postgres keeps them in its stream_events table
//     with the same key: a re-sent (execution_id, seq) keeps its first
//     bytes, and Events returns seq order, each seq once.
//   - MarkRunningUnknown turns every RUNNING record of its replica
//     (WithReplica, "" for a single server) into UNKNOWN. A new server
//     process cannot know whether an old command finished or what it
//     changed, so it never replays one; callers reconcile deliberately.
//     Records another replica created are left alone: it may be running
//     them right now.
//   - On Postgres each replica holds a lease (Leaser) on the database's
//     clock. SweepExpired, run by the live replicas, marks UNKNOWN the
//     RUNNING records of a replica whose lease expired (it died without
//     marking them), with {"reason": ...} as their result naming it; a
//     record is swept once, and a late Finish does not overwrite it.
//
// SQLite timestamps are stored as ISO-8601 text in UTC with microseconds and a
// "+00:00" offset (Python's isoformat), so that string order is time order
// for records written by the Python server or this one; Postgres uses
// timestamptz at the same (microsecond) resolution.
package store
