// Package pgfeed is the PostgreSQL feed and sync store: the writer an
// application calls inside its own pgx transaction, the reader and listener a
// sync worker tails the feed with, and the sync store that keeps each sink's
// cursor, parked list and lease, all in the source database beside the read
// model. It implements feed.Writer[pgx.Tx], feed.Reader and feed.SyncStore and
// passes feedtest's suites in all three pgx exec modes and through PgBouncer.
//
// # Schema
//
// Migrate creates, in a configurable schema (default "kairos") with a
// configurable table prefix (default "feed_"), seven logged tables:
//
//   - generations(feed, generation, head, projection, partition,
//     write_mode): one row per feed, created by its first write (or by
//     SetWriteMode). This row is the feed lock.
//   - rows(feed, key, seq, doc jsonb, deleted_at): one row per key, its
//     latest sealed document, or a tombstone (doc NULL) with the time it
//     was made. Unique on (feed, seq). A partial index holds the
//     tombstones by feed and time, so the oldest is one probe
//     (OldestTombstone). (Its pending and pending_doc columns are the
//     concurrent mode's layout before migration 5, always false and NULL
//     now.)
//   - unsealed(feed, key, doc jsonb): in the concurrent mode, a key's write
//     waiting to be sealed (doc NULL for a delete), one per key.
//   - sealers(feed, lease_holder, lease_expires_at): the sealer's lease of
//     each concurrent-mode feed.
//   - switches(feed, switched_at): one row per feed whose write mode was
//     switched, rewritten by each switch and by nothing else (see
//     # Commit order, Isolation levels).
//   - cursors(feed, sink, generation, seq, lease_holder, lease_expires_at,
//     last_advance_at): one row per registered sink. An absent cursor is NULL
//     generation and seq; an advisory holder has a NULL expiry.
//   - parked(feed, sink, key, seq, reason, parked_at).
//
// Names are validated (^[a-z_][a-z0-9_]*$, within PostgreSQL's 63 bytes with
// the table name added), always quoted and schema-qualified, never taken from
// search_path; a schema must not start with "pg_", which PostgreSQL keeps
// for itself. Migrations are embedded and versioned, each step idempotent, and
// run in one transaction under an advisory transaction lock on the schema, so
// processes that migrate at once, of this package or pgread, serialise. Teams
// with their own migration tool take the SQL from MigrationSQL or Migrations;
// each step there records itself as Migrate does.
//
// # Versions
//
// The steps applied are recorded in <prefix>migrations, one row per
// (package, version). pgread may be given the same schema and prefix: its
// tables have other names, and its versions sit beside pgfeed's in that
// table, kept apart by the package column. A version table of the shape
// earlier builds wrote (no package column, where one package's version 1
// made the other skip its own) is upgraded in place by the next Migrate, of
// either package, or by the printed scripts.
//
// New checks that the database answers and that the schema records at least
// the version this build needs (the highest it embeds): otherwise it fails
// with a *NotMigratedError that says found, need and what to run, instead of
// a missing-table error at the first write. A schema at a higher version than
// the build is accepted on purpose: in a rolling deploy, processes still on
// the old build run beside the schema the first new one migrated, and they
// keep working because migrations only add, never take away or change what
// an earlier build uses (the rule every step keeps; internal/pgschema's
// Migrations states it).
//
// # Commit order
//
// Guarantee 2, a reader that saw seq s never later sees a new row below s,
// is kept by one of two write modes, chosen per feed (SetWriteMode) and
// recorded on its generations row, so every process agrees. The default is
// the locked mode.
//
// Locked mode. A write starts by adding the batch's size to the feed's head
// with an upsert on its generations row, which hands out a contiguous seq
// range and holds the row lock to the caller's commit. The next writer of
// the feed waits for that commit before it gets its range, so seqs become
// visible in ascending order, whatever the number of writers. The cost is
// that writers of one feed serialise across their commits, WAL flush
// included, and every commit notifies the store's channel (one per schema
// and prefix, the feed's name as payload), which PostgreSQL serialises
// cluster-wide too.
//
// Concurrent mode. A write takes the feed's write lock shared (a
// transaction-level advisory lock, held to its commit) and then, in a
// statement of its own, upserts each key's write into the unsealed table,
// leaving the key's sealed row as it is; it locks no generations row and
// sends no notify. One sealer per feed, under a lease of
// its own (RunSealer; a syncer.Runner runs it), seals in rounds: a round is
// one transaction that takes the generations row FOR NO KEY UPDATE, then, in
// a statement of its own and so a snapshot taken after that lock, moves up
// to SealerOptions.Limit unsealed rows that no open writer holds (FOR UPDATE
// SKIP LOCKED) to sealed at head+1.. (deleting each from the unsealed
// table and upserting its key's row at its seq), moves the head past them,
// and notifies once. The argument: rounds are serialised by that row
// lock, held to each round's commit, and each hands out seqs above every
// seq an earlier round handed out, so the seqs of one round become visible
// after those of every earlier round, and seq order is commit order for
// every reader, whatever the writers do. A key is sealed with the value its
// latest committed writer left (the round locks the latest version of the
// key's unsealed entry, and deletes that version); an entry an open writer
// holds is skipped, not waited for, and a later round seals it with that
// writer's value once it commits, at a seq above all that were visible
// before. A writer's commit after a round's snapshot is
// simply sealed by the next round. Two sealers at once (a lease changing
// hands while the old holder's round is in flight) only take turns. A
// shared lock waits for no other, so writers of different keys never wait
// for each other (a writer waits for a round only while the round holds its
// key's unsealed entry, being sealed), and writers of one key serialise on
// that entry as on the application's own row. The rows table is written
// only by rounds, once per sealed write: a writer adds one narrow tuple with
// one index entry, as the application's own upsert does, and never a
// second version of the key's wide row. What this mode gives up:
// a transaction's several keys are sealed by whichever rounds find them, so
// they may be apart in seq order, or interleaved with another transaction's
// (guarantee 2 is per key; each key's rows still rise in commit order), and
// a write is visible to readers only once sealed (a round or two later,
// milliseconds while rows keep coming, up to SealerOptions.MaxPoll after an
// idle spell; held until an open writer of the same key commits; and
// indefinitely while no sealer runs, losing nothing). Its WriteResult has no
// seqs (feed.WriteResult.Unsealed), and read-your-writes first waits for the
// keys to be sealed (SealedRange, syncer.WaitApplied).
//
// RetryParked takes FOR NO KEY UPDATE too (it restamps a sealed row as a
// round would; a key never sealed has no row, and its write is the
// sealer's). ResetTx takes the write
// lock exclusive, then the generations row FOR UPDATE: the reset waits for
// every open writer of either mode, and its delete, a later statement and so
// a later snapshot, removes every row and unsealed write they committed, so
// no row of the old generation is sealed into the new one; a
// writer that comes after waits for the reset, and its upsert, a statement
// after its lock, writes into the new generation. Collection leaves alone a
// tombstone whose key has an unsealed write.
//
// Which mode: the locked mode for a feed written by one projection or
// process committing in batches (its writes cost about what the raw rows
// do, and a write is readable at its commit); the concurrent mode for a
// feed written by many concurrent transactions, as an outbox written from
// every request handler, where the locked mode caps the commit rate at a
// fraction of the same transactions without the feed (README and
// BENCHMARKS.md have the figures). Switch a feed only once every process
// runs a build that knows the mode (SetWriteMode's doc says why). A switch
// may come while daemons run: it notifies a mode channel of its own (one
// per schema and prefix) at its commit, and a running sealer of a feed it
// found locked waits on that channel, so it seals the first concurrent
// writes at once; modewake.go says why no switch is missed, and when the
// sealer falls back to SealerOptions.ModeCheck.
//
// Batched writes. Write costs a round trip of its own beside the
// application's statements (its concurrent mode a batch of two statements,
// the locked mode one). QueueWrite instead puts the same write, as one call
// of migration 6's write_result function, on the application's own
// pgx.Batch, so a request handler's insert and its feed write travel
// together. On this 2-core test machine the round trip is most of what the
// concurrent mode costs 16 writers: QueueWrite kept 0.55–0.68× of the commit
// rate of the same transactions without the feed where Write kept 0.51–0.59×
// (BENCHMARKS.md, P6). The function follows the row's mode as Write does,
// and, being VOLATILE, takes a fresh snapshot for its upsert after its lock
// statement (in READ COMMITTED; see Isolation levels), so the argument above
// holds for it unchanged. A batch sent outside a transaction is one implicit
// transaction: the write commits or rolls back with the rest of the batch.
//
// Isolation levels. The argument above has a writer read the mode after its
// lock, which READ COMMITTED gives: each statement reads a snapshot of its
// own. A transaction in REPEATABLE READ or SERIALIZABLE reads every
// statement from the snapshot its first statement took, which may predate
// the lock, so a writer there may read the mode a switch that committed in
// between replaced; after a switch to the locked mode it would leave its
// change unsealed (or its keys recorded) in a feed no sealer seals, until
// the feed went concurrent again. It cannot read the mode as of after its
// lock, so it checks instead that no switch committed after its snapshot:
// every concurrent-mode write in these levels (Write, QueueWrite's
// write_result, a captured table's write and record functions, and LockTx)
// runs migration 8's mode_seen once it holds the write lock shared and has
// read the concurrent mode, and a switch that changes the mode rewrites the
// feed's row of the switches table in its own transaction. mode_seen
// inserts that row with ON CONFLICT DO NOTHING, which PostgreSQL fails in
// these levels when the row it finds is newer than the snapshot; mode_seen
// then fails the transaction with SQLSTATE 40001 and the message "its write
// mode changed under this transaction's snapshot", and nothing it wrote
// commits. Run the transaction again, as after any serialization failure:
// its new snapshot is taken after the switch. In the locked mode there is
// nothing to add: the upsert locks the generations row, and PostgreSQL
// fails it with 40001 when that row changed after the snapshot (a switch,
// or any other locked writer's commit, so locked writers in these levels
// fail whenever another wrote the feed since their snapshot). The check
// reads a row that only switches write, so a sealing round does not fail
// it, and it locks no row and, finding the row, writes nothing, so writers
// in these levels still never wait for each other; they pay one statement
// more (Write, LockTx) or a subtransaction in the function. A READ
// COMMITTED writer, the default, pays one test of the level and nothing
// else. A switch made by a build before migration 8 rewrites no row, and
// such writers cannot see it: switch modes with a build that has it.
//
// A reset (ResetTx, a captured table's TRUNCATE) has the same exposure from
// the other side: its deletes must remove every write committed before its
// lock, and in these levels they read the earlier snapshot. In the locked
// mode every write moves the generations row, whose lock then fails the
// reset with 40001. In the concurrent mode writers touch no row a reset
// locks, so an unsealed write committed in between would outlive the reset
// and be sealed into the new generation; a reset of such a feed outside
// READ COMMITTED is refused instead (ResetTx's *feed.InvalidError, the
// TRUNCATE's SQLSTATE 25000), before it writes anything.
//
// # Cursor moves
//
// A cursor move is one statement (plus one for its park changes, in the same
// transaction): the holder's and the expected cursor's guard, the check that
// the next cursor is of the feed's generation and at or below its head
// (against the generations row; see feed.CursorMove), and, when it lands, a
// notification on a cursor channel of its own (one per schema and prefix, the
// feed's name as payload). The store's listener relays it to
// SubscribeCursors, so a process that runs no worker can wait for a write to
// reach a sink (syncer.WaitApplied) and be woken within milliseconds of the
// move; cursorwake.go says what the notification costs.
//
// # Time
//
// With the system clock, every stored time that decides a lease is stamped and
// compared by the database's clock_timestamp(), so workers whose clocks
// disagree still agree on who holds a lease; a worker measures its own lease's
// age with Go's monotonic clock. An injected feed.Clock replaces both (tests).
//
// # Leases
//
// Both kinds record the holder on the sink's cursor row, and every cursor move
// must name it, so a worker whose lease is gone cannot move the cursor or the
// parked list, whichever kind it held.
//
// Lease rows (the default) keep an expiry on the cursor row. The take is one
// short transaction: it tries the sink's advisory lock for the transaction,
// then upserts the holder when the row is free, expired, or held by an
// advisory holder AND that try succeeded (no live advisory session holds the
// sink, so a crashed advisory worker does not block lease rows forever). A
// heartbeat renews it; feed.LeaseOptions explains the timings and why
// EnsureHeld fails a margin early. Every statement is short and stateless, so
// lease rows work through a transaction pooler and need no reserved
// connection; their cost is the one stale sink call a worker that pauses past
// the margin can make.
//
// Advisory leases (Options.AdvisoryLock) take a session advisory lock on a
// connection reserved from a pool dedicated to leases, and record the holder
// from that same session only while pg_locks shows it holds the lock.
// EnsureHeld asks that session; no answer is a lost lease. A pause opens no
// window, since the lock outlives it; what a check cannot see is the session
// dying after it, so the call it let through may land after a rival took
// over: again one stale call. The lock session sets TCP keepalives and a user
// timeout, so a partitioned holder's lock goes within about half a minute. A
// lease pool recognisably behind a transaction pooler (address signs, or a
// backend pid that differs from the one the handshake announced) is refused by
// New.
//
// Mixing the kinds on one sink fails safe: neither takes the row from a live
// holder of the other. An advisory worker that gets the lock but finds a live
// lease row lets the lock go and reports the lease held.
//
// # Transaction poolers
//
// Through PgBouncer in transaction mode (exec or simple-protocol mode; cached
// prepared statements need a pooler that tracks them), everything works but
// two things: the advisory lease (refused by New), and LISTEN, which a pooler
// does not deliver (the listener detects it and logs a warning); give
// Options.Listen a direct connection, or rely on the workers' polling.
//
// # Capture
//
// Capture makes a table (plain or partitioned, see # Partitioned tables)
// write its own feed: whatever writes the table
// (the application, psql, another service, a migration, COPY), the feed rows
// are written in that transaction, so they commit with it or not at all.
// Three statement-level AFTER triggers (INSERT, UPDATE, DELETE; PostgreSQL
// allows transition tables only on a trigger of one event) turn the
// statement's transition tables into one change set, so an UPDATE of 100k
// rows is one feed write, and hand it to the schema's write function
// (<prefix>write, from migration 3): Write as a function, with the same
// refusals, in the feed's write mode, whichever it is when the trigger runs.
// In the locked mode it takes the feed lock and hands out seqs, as Write's
// statement does; in the concurrent mode it takes the feed's write lock
// shared and upserts the keys' rows unsealed with Write's own statement text
// (the migration renders it from the same Go source), and the sealer seals
// them after the commit. As in Write, the mode is checked by each mode's
// statement under that mode's lock (in REPEATABLE READ and SERIALIZABLE as
// # Commit order's Isolation levels says), and a SetWriteMode, which takes
// both locks, waits for every open captured writer and holds back the next,
// so no captured row is written in a mode the feed just left (an unsealed row
// in a locked feed would never be sealed). The trigger passes the write lock's
// key, which Go derives, as a literal of its generated SQL. That function is
// the one place a write mode lives; every installed trigger calls it, so a
// feed switches modes with no change to its triggers. A change set has each
// key once (the function's comment says why that holds): an UPDATE gives the
// new rows' documents, and tombstones for the keys of old rows no new row
// has, so a key that changed leaves a tombstone (keys compared as text, as
// the feed compares them: numeric 1.0 becoming 1.00 is a new key). An UPDATE
// leaves out the rows whose document it did not change: every column equal
// by record image, or, for a document trimmed by Include or Exclude, the
// same document text. So an UPDATE of left-out columns, or
// one that sets columns to the values they had, writes no feed row; and a
// feed keeps a document written under an earlier spec until its row changes
// or a Backfill copies it again. A transaction that writes a
// key again replaces its row, as Write does: one row per key. A TRUNCATE
// moves the feed to a new generation, emptied (the <prefix>reset function,
// ResetTx's statements: the write lock exclusive and the generations row FOR
// UPDATE, then the new generation and the delete, unsealed rows included, in
// later statements, in either mode): every sink fills a fresh, empty copy
// and publishes it at once, where tombstoning each key would cost a row per
// key that stays until collected, and a TRUNCATE trigger has no transition
// table to say which keys went anyway.
//
// What the trigger cannot make a valid change fails the writer's statement
// with SQLSTATE 22023, as Write refuses it: an empty or over-long key, a
// NULL one (Capture refuses nullable key columns, so only a key column whose
// NOT NULL was dropped since gives one), or a document that is JSON null. A
// document from to_jsonb is always one PostgreSQL stores (text cannot hold
// NUL, so no \u0000 appears; NaN and infinities become strings), and a key's
// text is valid UTF-8 in a UTF8 database, the only kind Capture accepts. Key
// columns must have a type whose text no session setting changes
// (CaptureSpec.Key lists them), so every writer makes the same key of the
// same row.
//
// The cost is the trigger's work and, in the locked mode, the feed lock:
// captured writers of one feed serialise from their first captured statement
// to their commit, as Write's callers do. A table with many writers wants
// the concurrent mode, where writers of different keys never wait for each
// other (BENCHMARKS.md, group K, has both). Writes made with triggers
// disabled (session_replication_role = replica, as pg_restore and logical
// replication apply do) are not captured; a Backfill afterwards repairs the
// feed. The trigger function runs as its owner, the role that ran Capture
// (SECURITY DEFINER, EXECUTE revoked from PUBLIC; its comment says why that
// lends a writer nothing), so the roles that write the table need only their
// rights on the table: none on the feed's schema, tables or functions. The
// document expression, and a partition's TRUNCATE trigger's read of its
// rows, run as that role too. A writer chooses its search_path, so nothing
// that runs with that role's rights may resolve a bare name through it: a
// capture with a document expression pins the path to pg_catalog, then
// pg_temp, as the expression was checked under it; a keyed capture's
// trigger (no document expression) names every type, function, operator
// and collation with its schema, and runs under the writer's path, since
// pinning it costs each call of the trigger about 12,000 instructions; the
// record, write and reset functions it may call pin their own (migration
// 13). Capture, Uncapture and their SQL (CaptureSQL)
// serialise on an advisory transaction lock of the schema and prefix; a
// repeated Capture finds the same version installed and changes nothing.
//
// # Keyed capture
//
// In the concurrent mode, a capture without a document expression (the row
// itself, trimmed by Include or Exclude, is the document) writes no
// document at all: its trigger records the statement's keys, the new rows'
// and, of an UPDATE, the old keys no new row has, as one row of the
// <prefix>changes table (under the write lock shared, refusing the keys
// the feed refuses: in READ COMMITTED with keys that pass a cheap test, by
// an insert of the trigger's own, otherwise through the record function,
// migration 7's, last redefined by migration 9), and the sealer
// reads each key's row from the table when it seals it. The writer so pays
// for a key apiece, not for a to_jsonb, a comparison and an unsealed row
// per row: a 10,000-row UPDATE took its writer 1.2–1.4× as long as
// without the trigger, where the locked mode's trigger took 3.8× as long
// (BENCHMARKS.md, group K). The sealer pays the rest, a round after the
// commit, and in all more than the locked trigger does (it finds each row
// again by its key).
//
// Why the sealed document is right: a round's sealChanges runs in a
// snapshot taken after the feed lock, as the seal of unsealed rows does,
// and a recorded row becomes visible to it in the same commit as its
// writer's change to the table. So whatever recorded rows a round takes,
// the table's row it reads for each key is at least as new as every write
// that recorded the key and committed before the round; writes after the
// snapshot recorded the key again, for a later round. Rounds serialise on
// the feed lock and each reads a later snapshot than the one before, so a
// key's sealed documents follow the table's own history in order, each at
// a seq above every earlier round's: guarantee 2 as for unsealed rows, and
// once writers stop and the sealer catches up, the feed holds each key as
// the table does. A round leaves a key alone when its document is the one
// the feed already has (compared as text), or when neither the table nor
// the feed has it: an UPDATE that changed nothing the document keeps, or a
// key inserted and deleted between two rounds, costs no seq and no sink
// call. The documents come from the capture's document function
// (<prefix>d…, installed by Capture beside the trigger function), which
// finds each key's row through the columns of the unique index behind the
// key and keeps it only when its key text is the recorded one. It runs as
// the role that ran Capture (SECURITY DEFINER, EXECUTE revoked from
// PUBLIC), so row security and column grants of the sealer's own role do
// not hide rows from it: a sealer that connects as another role needs
// EXECUTE on it granted. Every capture has one; a capture with a document
// expression writes its documents from the trigger, unsealed, as before,
// and its function seals, with that expression, only keys an earlier
// keyed spec of the feed recorded before Capture replaced it.
//
// What differs from a document written by the trigger: the document is
// the row as it is at the seal, not as the writing statement left it (a
// key written twice between two rounds is sealed once, with its latest
// row, which a feed of latest states allows), and it is made in the
// sealer's session, so a timestamptz column prints in the sealer's
// TimeZone (set the daemon's to the writers' when that matters, or use a
// document expression). Uncapture, and SetWriteMode to the locked mode,
// seal what was recorded before they finish (a backfill's batch writes
// its documents sealed, see # Backfill). After changing a
// key column's type, run Capture again before the next round: the
// function casts key text back to the type it found.
//
// A round deletes the changes rows it took, and their index entries stay
// until a VACUUM takes them, which a snapshot held open (a pg_dump's, a
// long report's) prevents for as long as it is open. A running sealer
// therefore reads the table from a floor of its own, an id below which no
// row is left and none can come, and its probes and rounds step over none
// of those entries: read from the first id, each stepped over all of them,
// and their cost grew with every write since the last VACUUM. The floor
// follows the rounds up once every transaction that was running at a
// round has ended; a transaction that holds an xid open holds it back
// until it ends (a read-only one does not). Every 10 s the sealer probes
// once from the first id, and it starts there again after a restart or a
// fault.
//
// # Partitioned tables
//
// A partitioned table is captured whole: the same statement triggers go on
// it and on every partition under it, sub-partitioned ones included. A
// statement fires the statement triggers of the table it names only, with
// transition tables holding the rows it changed in every partition under
// that one, so a write is captured once whether it names the partitioned
// table, a sub-partitioned one or a leaf. An UPDATE through a parent that
// moves a row to another partition tombstones its old key (every unique
// index of a partitioned table includes the partition key, so the
// capture's key does too); PostgreSQL refuses one that names the partition.
// A TRUNCATE of the partitioned table moves the feed to a new generation; a
// TRUNCATE of a partition (or of a sub-partitioned table) tombstones that
// partition's rows from a BEFORE TRUNCATE trigger, the last moment they can
// be read. The partitioned table's TRUNCATE fires its partitions' triggers
// too; its own BEFORE trigger, which fires first, sets a transaction-local
// setting with their OIDs, under which they write nothing, and its AFTER
// trigger, the reset, clears it. A partition alone is refused (it would miss
// the writes through its parent), and so is a table of an inheritance tree
// (INHERITS): a write naming a parent changes its children's rows without
// their triggers, a backfill through a parent copies its children's rows,
// and no index keeps keys unique across the tree. Key columns must be
// covered by a valid unique index of the partitioned table itself, not by
// one of a partition's.
//
// Partitions created or attached after Capture have no triggers, and a
// detached one keeps them; Captures reports both (CaptureInfo.Uncovered and
// Stray), as it reports a capture trigger dropped or disabled (ALTER TABLE
// … DISABLE TRIGGER) on any captured table, plain ones included; kairos
// capture list warns of them and its --check exits 1. Backfill refuses while
// a gap is open, and Capture closes it: it installs the triggers on every
// partition as the tree is now and drops them from tables no longer in it.
// The capture's version covers the partition set, so a Capture after an
// ATTACH installs. Rows an attached partition already holds need a Backfill;
// those of a detached one stay in the feed until a Backfill as a new
// generation. No event trigger closes the gaps on its own: it needs a
// superuser to install, and it could not copy the rows an attached partition
// already holds anyway.
//
// Known limits. A partition's TRUNCATE trigger reads the rows it tombstones
// as the role that ran Capture: under row-level security that applies to
// it (FORCE ROW LEVEL SECURITY, for the table's owner) it tombstones only
// the rows that role can see. The setting that holds the partitions' triggers
// back belongs to the session, so a writer could set it itself and TRUNCATE
// a partition without its tombstones (as one could disable the triggers
// outright, with the rights to). A TRUNCATE that names a partition before its
// partitioned table tombstones that partition's rows before the reset
// removes them again: correct, but not free.
//
// # Backfill
//
// Backfill copies the rows a table already holds with the capture's own key
// and document. In place, in either write mode, each batch is a transaction
// that takes the feed lock in a statement of its own first and only then
// reads its rows, in READ COMMITTED, so its read takes a snapshot after the
// lock: every captured writer that wrote the feed before it has committed
// and is seen, and every writer after it waits for the lock and gets a
// higher seq. A copy is
// therefore never older than a feed row below it, and a writer's later
// change always lands above the copy: the trigger's writes win over the
// backfill's, never the reverse, without a per-key comparison. (A writer
// whose statement changed a row but whose trigger has not yet run holds no
// lock; the batch copies the row as committed, and the writer's trigger then
// writes above it.) Writers wait at most one batch.
//
// The concurrent mode copies the same way. Its writers take no feed lock,
// but every seq is still handed out under it, by sealing rounds, and a
// batch is sealed as it is written: it takes the lock as a round does,
// reads its rows in a snapshot taken after it, and writes them at seqs
// above every earlier round's. A writer that committed before that
// snapshot is in the copy, and a round that seals its unsealed write (or
// its recorded key) afterwards seals the same document again, or a newer
// one, above the copy; a writer that commits after the snapshot is sealed
// by a round that waits for the batch, so above the copy too, and wins.
// Writers themselves never wait for a batch; rounds wait at most one. A
// row's lock is not read: a writer whose change is not yet committed is
// simply not in the copy, and its write is sealed after it. Taking the lock
// in a statement before the read matters here as in the locked mode: a
// read whose snapshot predated a round's commit could miss a write the
// round sealed, then write the older row above it. Every batch also holds
// the write lock shared, which a switch of the write mode, a reset and
// Uncapture take exclusive, so none of them runs under a batch, and a batch
// that finds the capture removed fails the backfill.
//
// On a pool, an in-place backfill copies from several connections at once
// (BackfillOptions.Workers), each a share of the table's key range. Batches
// of different shares cannot each hold the feed lock while they write, so a
// batch's seqs are handed out before it reads, by a reservation: a short
// statement of the backfill's own connection takes the feed lock, moves
// the head past as many seqs as the batch will copy (counted first), enters
// them in the reserved table with the batch's transaction, and commits. The
// batch then takes the table's lock and the write lock shared, reads its
// rows in a snapshot taken after the reservation, as a locked batch does
// after its lock, and writes each at its reserved seq unless the key's row
// is at a higher seq already: a writer that took the feed lock after the
// reservation wrote it, and its change wins. So the
// trigger's writes still win, but a batch's rows now commit below seqs that
// later writers may have committed first. Readers therefore stop below the
// first reserved seq whose transaction had not ended when their read's
// snapshot was taken: ReadBatch reads no row past it and gives it as the
// batch's head, and so does Head. A batch deletes its reservation in the
// transaction that writes its rows, so the two appear together; one that
// rolls back leaves its seqs unused and its reservation naming a
// transaction that ended, which holds no reader back. A sealing round, and
// RetryParked, wait for the batches under way, and a batch for them, from
// before its reservation to its commit (the round lock): a keyed capture's
// round seals only keys whose document differs from the feed row it sees,
// and it would not see a batch's uncommitted row, so a key the table lost
// after the batch read it would keep the batch's copy; and a restamp above
// the reservation would put the feed's older row above the copy. While it
// waits for its reservation a batch holds nothing else, so no writer that
// holds the feed lock can come to wait for it. A batch inserts its rows
// plainly first, in a savepoint, and upserts them only when that insert
// meets a key the feed holds already: a table's first backfill meets few,
// and a plain insert skips the upsert's speculative insertion. Its rows
// can still wait for a writer's uncommitted row of the same key while that
// writer comes to wait for one of the batch's; PostgreSQL then rolls one of
// the two back, and when it is the batch, the batch is copied again.
// On a single connection, or with Workers 1, batches take the feed lock in
// turn as above.
//
// Each batch records its share's position (the last key's columns) in the
// same transaction, so a backfill killed at any point resumes every share
// after its last committed batch and copies no row twice. A batch, and a
// new generation's copy on a single connection, takes the table's lock
// before any of the feed's, in the order a writer, a TRUNCATE and Uncapture
// take them, so it never deadlocks with them.
//
// With NewGeneration the copy is the table-shaped rebuild: sinks see the new
// generation complete or not at all. A transaction takes the feed lock (in
// the concurrent mode the write lock exclusive, which every captured
// writer's trigger waits for) and holds it until the generation moves, and
// nothing else writes the feed meanwhile; a capture's keys are unique in
// its table, so each batch inserts its rows sealed, seqs and all, in
// either mode: no upsert, no unsealed copy for a sealer, and the new
// generation is never seen half sealed. It reads no row FOR SHARE: every
// writer's feed write comes after the move anyway, and a writer that
// changed a row and waits in its trigger for the lock would deadlock with
// a read waiting for that row.
//
// On a pool, the rows table holds the new generation apart while it is
// copied: a feed's rows are stored under a name its generations row gives
// (the feed's own until its first such backfill), and the copy writes
// under a fresh one, which no reader knows. So several connections copy at
// once (BackfillOptions.Workers), each a share of the table in key order,
// all in the locking transaction's exported snapshot, each committing its
// share unseen; the first counts the table and picks where each share
// starts, so each share's seqs are known before a row is copied. The
// locking transaction then moves the generation, the head and the store
// name together, and the rows of the old store are deleted after the move,
// in batches, outside any lock (CollectTombstones finishes what a backfill
// could not). A copy that fails leaves the feed as it was: its store is
// entered in the stores table before a row is written, and its rows are
// deleted by the backfill itself or, if it died, by the next backfill as a
// new generation of the feed. The workers take the table's lock only after
// the locking transaction holds the write lock, so a TRUNCATE, an
// Uncapture or an ALTER of the table that comes in between would wait for
// that transaction while the workers wait behind it, a cycle through the
// backfill's own code that PostgreSQL cannot see; a worker's lock wait is
// therefore bounded (5 s), and the backfill fails, the feed as it was,
// letting the other session go on. On a single connection the copy runs in
// the locking transaction, after deleting the feed's rows.
//
// # For implementers
//
// An application needs Migrate, New, Write (or WriteCommitted) or Capture and
// Backfill, ResetTx for a rebuild, Describe, RetryParked, CollectTombstones
// and RemoveSink, and hands the store to a syncer.Runner; SetWriteMode for a
// feed of the concurrent mode, whose sealer the runner runs (RunSealer). The
// rest of the exported surface is what the sync driver and the read side
// build on, for a driver or a decorator of your own: AcquireLease,
// ReadCursor, CASCursor, ReadParked, ReadBatch, Head, Generation and
// Subscribe (the driver's loop; syncer runs it), BindTx and LockTx
// (pgread.WithFeed's binding of a feed to a projection, and its lock order),
// SealRound and SealedRange (a sealing round by hand; where a
// concurrent-mode write's keys stand, for syncer.WaitApplied).
//
// # Failures
//
// Caller mistakes are *feed.InvalidError, returned before any statement runs.
// Infrastructure faults are *feed.UnreadableError on reads and
// *feed.WriteFailedError on writes, wrapping the pgx error; the sync driver
// backs off and tries again. A database New cannot reach is an
// *feed.UnreadableError too. The schema's state has its own category, shared
// with pgread: ErrNotMigrated (*NotMigratedError) from the constructors and
// ErrMigrationFailed (*MigrationFailedError) from Migrate, which is not
// retried like a write and leaves the schema as it was. No error repeats a
// connection string. A LISTEN connection that cannot be reached, or never
// answers, costs wake-ups, never progress: each attempt is bounded by
// Options.ListenTimeout, a session silent for Options.ListenCheck is checked
// with a round trip so a network that drops packets silently is found, and
// while the listener is down Subscribe fails at once so that workers poll
// (the listener's doc has the argument). Describe
// refuses a feed it does not know with a *feed.UnknownFeedError.
package pgfeed
