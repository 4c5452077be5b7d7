// Package pgread is the PostgreSQL side of package read: a durable projection
// store, a small append-only event log to replay projections from, and
// WithFeed, which ties a feed's generation to a projection's rebuild.
//
// # Tables
//
// Migrate creates, in a configurable schema (default "kairos", the same as
// pgfeed's, since a checkpoint and the feed it is bound to must share a
// database) with a configurable table prefix (default "read_"), four logged
// tables:
//
//   - checkpoints(projection, partition, position, epoch, updated_at): one
//     row per checkpoint key that has moved or been reset; no row is the
//     zero read.Checkpoint (the origin of epoch 0). A reset keeps the row,
//     at position 0 of the next epoch (package read's doc says why).
//   - log(head): one row, the highest global position handed out. It is the
//     event log's append lock (see EventLog).
//   - streams(stream, version): one row per stream, its event count.
//   - events(position, stream, version, type, data jsonb, recorded_at).
//
// Names follow pgfeed's rule (^[a-z_][a-z0-9_]*$, within PostgreSQL's 63
// bytes with the table name added), are always quoted and schema-qualified,
// never taken from search_path. Migrations are embedded and versioned, each
// step idempotent, and run in one transaction under the advisory transaction
// lock on the schema pgfeed's take too, so processes that migrate at once
// serialise. Teams with their own migration tool take the SQL from
// MigrationSQL or Migrations. The prefix may be pgfeed's own: the two share
// the version table then, their versions kept apart by package. NewStore and
// NewEventLog check that the schema is migrated, as pgfeed.New does; pgfeed's
// package doc (# Versions) says how, and why a schema newer than the build
// is accepted.
//
// # Commits
//
// Store.Commit runs the projection's apply in a transaction it opens and
// hands to apply, then moves the checkpoint with a compare-and-set in the
// same transaction; view writes and pgfeed's Write, both given that
// transaction, land with the checkpoint move or not at all. Store's Commit
// doc says in which order it takes its locks and why; WithFeed's doc says
// how that order meets a reset's.
//
// # Rebuilds
//
// WithFeed binds one feed to one checkpoint key, across processes, and makes
// that key's reset also move the feed to its next generation and empty it,
// in one transaction: the sinks' workers then resync into fresh copies. Its
// doc is the home of the argument; Example_rebuild is a rebuild from start
// to end, and the README's "Rebuilding a read model" walks through it.
//
// # Statements
//
// Every statement carries explicit parameter casts, so it means the same in
// every pgx exec mode, the simple protocol a transaction pooler needs
// included, and runs on the caller's DBTX: the store, the log and WithFeed
// all work through PgBouncer in transaction mode.
//
// # Failures
//
// Caller mistakes are *feed.InvalidError, returned before any statement
// runs. A database failure is a *feed.UnreadableError on reads and a
// *feed.WriteFailedError on writes, wrapping the pgx error. A lost checkpoint
// guard is a *read.CheckpointSupersededError; an append that finds its stream
// at another version, a *VersionConflictError; a feed bound to another
// checkpoint, a *FeedBoundError. An apply's or a clear function's own error is
// returned unchanged. The schema's state uses pgfeed's errors: a
// *pgfeed.NotMigratedError from the constructors, a
// *pgfeed.MigrationFailedError from Migrate.
package pgread
