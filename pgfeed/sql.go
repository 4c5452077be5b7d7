package pgfeed

import "fmt"

// statements is every statement the store runs, built once from validated,
// quoted names. Each has one purpose, said above it. Parameters carry explicit
// casts so the text means the same in every pgx exec mode, the simple protocol
// (PgBouncer) included. A "now" parameter is NULL in production, which makes
// the database's clock_timestamp() the time, and a test's injected time
// otherwise.
type statements struct {
	// write takes the feed lock (the generations row, created on a feed's
	// first write), hands out the contiguous seq range head+1..head+n, upserts
	// the batch's rows at those seqs from arrays (a delete stamped with the
	// transaction's time, deleted_at, a document clearing it), and notifies
	// the feed's channel, all in one statement. The row lock is held to the
	// caller's commit, so the next writer's range is handed out after this
	// commit: seq order is commit order. One statement is safe here although
	// it may wait for the lock: both its upserts act on the latest
	// committed row versions, not on the statement's snapshot.
	write string
	// writeConcurrent is the concurrent mode's write, run after shareWrite
	// in the same transaction (and so, in READ COMMITTED, with a snapshot
	// taken after that lock was granted; in the other levels see modeSeen):
	// only while the feed's row says the concurrent mode, it
	// upserts each key's write into the unsealed table (one narrow tuple
	// and one index entry per key), leaving the key's sealed row as it is,
	// and returns the generation the write lands in. It locks no
	// generations row, so writers of different keys never wait for each
	// other. No row: the feed is not in the concurrent mode, and nothing
	// was written. No notify: the sealer's round notifies, once.
	writeConcurrent string
	// shareWrite and excludeWrite take the feed's write lock, a
	// transaction-level advisory lock: shared by every concurrent writer
	// (and LockTx in that mode) to its transaction's end, exclusive for a
	// reset and a mode switch, which so wait for every open concurrent
	// writer and hold back every new one until they commit. A shared
	// advisory lock lives in the lock manager's memory: where a row lock
	// (FOR KEY SHARE on the generations row) would make 16 writers build a
	// multixact per new locker and write the row's lock bits to one hot
	// heap page and the WAL, this writes nothing (BENCHMARKS.md, P6c).
	// shareWrite also says whether the transaction reads one snapshot
	// throughout (snapshotTx), and so must run modeSeen too.
	shareWrite, excludeWrite string
	// excludeWriteIn is excludeWrite that also says whether the
	// transaction reads one snapshot throughout (snapshotTx), for ResetTx.
	excludeWriteIn string
	// modeSeen is migration 8's mode_seen: run under shareWrite by a writer
	// in REPEATABLE READ or SERIALIZABLE whose statement found the
	// concurrent mode, it fails the transaction (SQLSTATE 40001) when a
	// switch of the feed's mode committed after the transaction's snapshot,
	// which the mode was read from. A READ COMMITTED writer's statements
	// each read a snapshot taken after the lock, and skip it.
	modeSeen string
	// writeResult is QueueWrite's one statement: migration 6's
	// write_result function, Write's two modes in one call that returns
	// the generation and, in the locked mode, the new head.
	writeResult string
	// modeOf reads the feed's write mode ('locked' for a feed never written).
	modeOf string
	// modeIn is modeOf and the transaction's isolation level.
	modeIn string
	// shareFeed is LockTx's check, under shareWrite, that the feed is still
	// in the concurrent mode; no row when it is not.
	shareFeed string
	// lockReset follows excludeWrite in a reset and a mode switch: FOR
	// UPDATE on the generations row, which also waits for a locked writer
	// and a sealing round in flight.
	lockReset string
	// sealLock is a sealing round's first statement (and RetryParked's):
	// the feed lock, FOR NO KEY UPDATE, which serialises rounds, restamps
	// and locked writers; concurrent writers never take it.
	sealLock string
	// seal is a round's second statement, in the same transaction and so
	// with a snapshot taken after sealLock was granted: up to $2 unsealed
	// writes no open writer holds (FOR UPDATE SKIP LOCKED, which locks each
	// entry's latest version and reads its document from it), in key order,
	// are deleted from the unsealed table and upserted into their keys' rows
	// at head+1.. (a delete stamped with the round's time, deleted_at, as the
	// locked write stamps its own), the head moves past them, and, when any
	// moved, one notify. It returns how many it sealed.
	seal string
	// probe reads the feed's mode, whether any write is unsealed, from the
	// unsealed table's primary key, and whether any change is recorded at
	// or above $2, a sealer's floor (changesFloor; 0 reads them all), from
	// the changes table's: index-only reads with no transaction id.
	probe string
	// recorded says whether the feed has recorded changes (a keyed
	// capture's, sealChanges) at or above $2, a floor as probe's, in a
	// round after its lock.
	recorded string
	// takeSealer, renewSealer, clearSealer are the sealer's lease row,
	// as takeRow, renewRow and clearHolder are a sink's.
	takeSealer, renewSealer, clearSealer string
	// setMode creates the generations row when absent; excludeWrite and
	// lockReset then wait for every writer of either mode, and updateMode
	// records the mode and, when it changed, rewrites the feed's row of
	// migration 8's switches table, whose newer version a writer that read
	// the mode from an older snapshot cannot miss (statements.modeSeen);
	// notifyMode, in the same transaction, tells every listening sealer of
	// the switch at its commit.
	setMode, updateMode, notifyMode string
	// sealedRange reads, in one snapshot, the feed's generation and, over
	// the given keys' rows, the lowest and highest seq and whether any still
	// waits unsealed.
	sealedRange string
	// reset takes the feed lock and moves the generation on (a never-written
	// feed goes from 1 to 2); emptyFeed then deletes the feed's rows and
	// notifies. Two statements, not one: a statement that waited for the
	// lock still reads with the snapshot it started with, so a DELETE in the
	// same statement would miss the rows of the writer it waited for. Seqs are
	// not reset.
	reset, emptyFeed string
	// head and generation read the generations row; no row means head 0 and
	// generation 1.
	head, generation string
	// readBatch reads up to $3 rows after seq $2 and, beside them, the
	// feed's generation and head, in one statement and so one snapshot.
	// Both it and head give the head a reader may read up to (readable),
	// and readBatch reads no row past it. The
	// two come as one extra row, told apart by its NULL key, that carries the
	// generation in the seq column and the head, as a JSON number, in the
	// document column. The batch's own rows are then exactly what a plain
	// keyset scan sends, with no per-row copy of the two and no join to sort
	// again, and a batch that finds nothing still learns the generation and
	// the head from the same statement.
	readBatch string

	// lockSinkXact tries the sink's advisory lock for the transaction: a live
	// advisory lease holds it for its session, so getting it proves no live
	// advisory worker holds the sink.
	lockSinkXact string
	// takeRow is the lease-row take: the guarded upsert that registers the
	// sink and records the holder with an expiry, landing only when the row has
	// no holder, its expiry has passed, or its holder is an advisory one (no
	// expiry) and $6 says this transaction holds the sink's advisory lock.
	takeRow string
	// leaseOf reads the sink's recorded holder and expiry, for a refused take
	// to say who holds the sink; a row take runs it in its own transaction,
	// after takeRow locked the row, so it reads the holder that refused it.
	leaseOf string
	// renewRow extends this holder's expiry to at least now+ttl; it never
	// moves it back, and lands nothing once the row names someone else.
	renewRow string
	// clearHolder clears the lease when the row still names this holder.
	clearHolder string
	// claimAdvisory records an advisory holder (no expiry), from the session
	// that holds the lock and only while pg_locks shows it still does; it
	// takes the row when free, expired, or held by another advisory holder
	// (whose session is gone, since this one has the lock).
	claimAdvisory string
	// tryLock takes the advisory lease's session lock; holdsLock asks the
	// session whether it still holds it; unlock lets it go at once. The
	// session is closed after unlock all the same, which releases the lock
	// even when unlock could not run, only a moment later (when the server
	// process exits).
	tryLock, holdsLock, unlock string

	// readCursor reads a sink's cursor (NULLs when absent).
	readCursor string
	// cas is the fenced cursor move: it lands only when the row names the
	// holder and the cursor is the expected one, and the next cursor is of
	// the feed's generation and at or below its head, as the generations row
	// has them (none: generation 1, head 0); it locks the cursor row, so
	// moves of one sink serialise. It returns whether it landed and the
	// generation and head it compared with, which tell a refusal's cause, and
	// a move that landed notifies the cursor channel, all in one statement.
	// The generations row is read from the statement's snapshot, not locked
	// (a writer holds its lock to its commit): a rebuild that commits after
	// that snapshot orders after the move, which then landed just before it,
	// and the head it sees is at most the real one, so the check is never
	// looser than the feed; a worker's next cursor came from a batch that
	// committed before the move began, so it is never refused wrongly.
	// casParks, in the same transaction after a move that landed, applies the
	// park changes (replace or unpark, then park). Keys the move parks are
	// left out of its deletes, because one statement may not both delete and
	// upsert a row; the upsert overwrites them anyway.
	cas, casParks string
	// readParked lists a sink's parked records in key (byte) order.
	readParked string
	// lockFeed is LockTx's feed lock in the locked mode, as a writer takes it.
	lockFeed string
	// unparkOne removes one parked record and says whether there was one.
	unparkOne string
	// restamp gives the key's row (if any) seq head+1, bumps the head, and
	// notifies; run under sealLock. A row never sealed (no seq) is left
	// alone: no sink has seen it, and its seal is the sealer's. A
	// tombstone keeps its deleted_at: it is the same deletion, sent again.
	restamp string
	// oldestTombstone reads the deletion time of the feed's oldest sealed
	// tombstone (migration 4's deleted_at) and its age on the database's
	// clock, from the partial index on tombstones: one index probe, however
	// large the feed. NULLs when the feed has none.
	oldestTombstone string
	// collect deletes, in one statement and so against one snapshot of the
	// cursors, the tombstones at or below every registered sink's cursor,
	// none while a registered sink has no cursor or none is registered, and
	// none whose key is parked for any sink. It locks what it deletes with
	// SKIP LOCKED and never waits on a row: a tombstone a writer (or
	// another collection) holds is left for the next collection. Waiting
	// would let a collection and a transaction that writes several
	// tombstoned keys lock rows in opposite orders, and PostgreSQL's way out
	// of that deadlock may be to fail the writer. A row locked once it was
	// changed is checked again (doc, pending, seq) on its newest version,
	// and its ctid is then that version's, which the statement's snapshot
	// does not see: the delete, by ctid (cheaper than again by key), leaves
	// it for the next collection.
	collect string
	// removeCursor deletes the cursor row unless a live lease row holds it
	// (an advisory holder's liveness was settled by lockSinkXact);
	// cursorExists tells a refused delete from a missing row; removeParked
	// deletes the sink's parks.
	removeCursor, cursorExists, removeParked string
	// describeFeed reads the feed's generation and head and, in the same
	// snapshot, whether the feed is known: it has a generations row or a
	// registered sink (a cursor row); its mode, unsealed count, sealer
	// lease, and its oldest tombstone's deletion time (as oldestTombstone).
	describeFeed string
	// traceKey reads, in one snapshot, the feed's generation and head, the
	// key's row, and per registered sink its cursor, the key's parked record
	// and how many rows lie between the cursor and the key's row; one row
	// with a NULL sink when none is registered. known says the feed exists.
	traceKey string
	// listFeeds names every feed Describe knows: written to, or with a
	// registered sink.
	listFeeds string
	// describeSinks and describeParked are the per-sink report. A sink's
	// pending count is the rows above its cursor. Counted once per sink, that
	// reads rows × sinks index entries; describeSinks instead counts the rows
	// between each cursor and the next one up, each range once (s, kept
	// apart so the planner cannot fold it back into a count per sink), and a
	// sink's count is the sum of the ranges from its cursor up: every row
	// above the lowest cursor is read once.
	describeSinks, describeParked string
}

// concurrentUpsert is migration 3's text of the concurrent mode's upsert,
// which left the write unsealed in the key's row (pending, pending_doc). It
// is kept only so that migration 3 renders as it always did; migration 5
// replaces the function that used it with one over unsealedUpsert.
func (n names) concurrentUpsert(feedName, keys, docs, into string) string {
	if into != "" {
		into = " INTO " + into
	}
	return `WITH m AS (
	SELECT generation FROM ` + n.generations + ` WHERE feed = ` + feedName + ` AND write_mode = 'concurrent'
), w AS (
	INSERT INTO ` + n.rows + ` AS r (feed, key, pending, pending_doc)
	SELECT ` + feedName + `, c.key, true, c.doc::jsonb FROM m, unnest(` + keys + `, ` + docs + `) AS c(key, doc)
	ON CONFLICT (feed, key) DO UPDATE SET pending = true, pending_doc = excluded.pending_doc
)
SELECT generation` + into + ` FROM m`
}

// storeOf is the SQL expression of the name feedExpr's rows are stored
// under in the rows table: the feed's own name, or, once a backfill filled
// a new generation apart (see the package doc's # Backfill), the name
// its generations row gives. Every statement that reads or writes a feed's
// rows finds them through it; a statement holding the feed lock, or
// reading in one snapshot with the rows, sees the name that goes with
// them.
func (n names) storeOf(feedExpr string) string {
	return `coalesce((SELECT s_g.store FROM ` + n.generations + ` AS s_g WHERE s_g.feed = ` + feedExpr + `), ` + feedExpr + `)`
}

// readable is the SQL expression of the head a reader of feedExpr may read
// up to, given the head headExpr: the head itself, or, while a backfill
// batch holds reserved seqs (see the reserved table's migration) whose
// transaction had not ended when the statement's snapshot was taken, the
// seq before the first of them. Every seq at or below it is either in the
// snapshot or will never be written, so a reader that moved past it would
// skip no row; past it, a batch's rows may still commit below seqs a later
// writer has already committed. It reads the statement's own snapshot, so
// the bound and the rows a statement reads agree.
func (n names) readable(headExpr, feedExpr string) string {
	return `least(` + headExpr + `, (SELECT min(v.first_seq) - 1 FROM ` + n.table("reserved") + ` AS v
		WHERE v.feed = ` + feedExpr + ` AND NOT pg_visible_in_snapshot(v.xid, pg_current_snapshot())))`
}

// snapshotTx is true in a transaction whose statements all read the
// snapshot its first statement took (REPEATABLE READ, SERIALIZABLE): there
// a statement after a lock may still read rows as they were before the
// lock's last holder changed them.
const snapshotTx = `current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted')`

// modeSeen is the PL/pgSQL statement a function runs, under the feed's
// write lock shared, after it read the concurrent mode from the feed's row:
// in a snapshotTx, mode_seen (statements.modeSeen). Migration 8's
// functions run it as Write and LockTx run their statements.
func (n names) modeSeen(feedName string) string {
	return `IF ` + snapshotTx + ` THEN PERFORM ` + n.table("mode_seen") + `(` + feedName + `); END IF;`
}

// unsealedUpsert is the concurrent mode's upsert of unsealed writes
// (statements.writeConcurrent), written over the given feed name, keys and
// documents (text or jsonb), returning the generation, into the given
// PL/pgSQL target when into is not empty. Write runs it with parameters,
// and migration 5's write function, which a capture trigger and a backfill
// call, with its own arguments, so both keep one text of the rules.
func (n names) unsealedUpsert(feedName, keys, docs, into string) string {
	if into != "" {
		into = " INTO " + into
	}
	return `WITH m AS (
	SELECT generation FROM ` + n.generations + ` WHERE feed = ` + feedName + ` AND write_mode = 'concurrent'
), w AS (
	INSERT INTO ` + n.unsealed + ` AS u (feed, key, doc)
	SELECT ` + feedName + `, c.key, c.doc::jsonb FROM m, unnest(` + keys + `, ` + docs + `) AS c(key, doc)
	ON CONFLICT (feed, key) DO UPDATE SET doc = excluded.doc
)
SELECT generation` + into + ` FROM m`
}

// sealChanges is a round's third statement, run when the feed has recorded
// changes (a keyed capture's, in the concurrent mode), in the round's
// transaction after seal, and so with a snapshot taken after sealLock was
// granted and after seal's writes: it takes the oldest recorded rows, as
// many as keep the round within $2 keys (one at least), deletes them, and
// reads each of their keys' documents once, through docs, the capture's
// document function, in this snapshot: the table's row as every writer
// that committed before it left it, which is at least as new as each
// write that recorded the key (the row and the record commit together).
// It seals each key whose document differs from its feed row's, as text
// (jsonb's equality first, which is cheaper and holds fewer pairs equal:
// 1.0 = 1.00; a key the table and the feed both lack, or whose tombstone
// the feed has, is left as it is), at head+1.. in key order, moves the head past
// them and notifies once, as seal does. Rounds serialise on the feed
// lock and each reads a later snapshot than the round before, so a key's
// sealed documents follow the table's own history, and each round's seqs
// lie above every earlier round's. It reads only rows at or above $4, a
// sealer's floor (changesFloor; 0 reads them all). It returns the keys it
// took and the rows it sealed, then what the floor learns from it: the
// highest id it took, the lowest visible id above that it left (each NULL
// when there is none), and its snapshot's xmin and xmax (64-bit, so never
// wrapping). Each key's feed row is probed by its primary key (the
// OFFSET keeps the planner from joining the whole feed instead, which it
// did on a feed whose statistics said it was small: a round of 1000 keys
// hashed all 33,000 rows of the feed, three quarters of its time).
func (n names) sealChanges(docs string) string {
	r, ch := n.rows, n.changes
	return `WITH t AS MATERIALIZED (
	SELECT c.id FROM (
		SELECT l.id, l.n, sum(l.n) OVER (ORDER BY l.id) AS run
		FROM (SELECT id, n FROM ` + ch + ` WHERE feed = $1::text AND id >= $4::bigint ORDER BY id LIMIT $2::bigint) AS l
	) AS c WHERE c.run - c.n < $2::bigint
), x AS (
	DELETE FROM ` + ch + ` AS c WHERE c.feed = $1::text AND c.id = ANY (ARRAY(SELECT id FROM t))
	RETURNING c.keys
), k AS (
	SELECT DISTINCT u.key FROM x, unnest(x.keys) AS u(key)
), e AS MATERIALIZED (
	SELECT d.kairos_key COLLATE "C" AS key, d.kairos_doc AS doc FROM ` + docs + `(ARRAY(SELECT key FROM k)) AS d
), w AS MATERIALIZED (
	SELECT e.key, e.doc, row_number() OVER (ORDER BY e.key) AS ord
	FROM e LEFT JOIN LATERAL (SELECT true AS found, r.doc FROM ` + r + ` AS r WHERE r.feed = ` + n.storeOf("$1::text") + ` AND r.key = e.key OFFSET 0) AS r ON true
	WHERE CASE WHEN r.found IS NULL THEN e.doc IS NOT NULL
		ELSE r.doc IS DISTINCT FROM e.doc OR r.doc::text IS DISTINCT FROM e.doc::text END
` + n.sealAt("w") + `
SELECT (SELECT count(*) FROM k), (SELECT count(*) FROM s), (SELECT count(*) FROM n),
	(SELECT max(id) FROM t),
	(SELECT min(l.id) FROM ` + ch + ` AS l WHERE l.feed = $1::text AND l.id > coalesce((SELECT max(id) FROM t), $4::bigint - 1)),
	pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint`
}

// sealAt is the end of a round's seal: the CTEs that move the head past
// the rows of CTE src (key, doc, and ord, their order from 1) and upsert
// them at head+1.. (a delete stamped with the round's time, deleted_at, as
// the locked write stamps its own), s returning a row per row sealed, and
// n, one notify when any was. Both seals end with it, so the two sources of
// a round's writes are sealed by one text of the rule. It opens with the
// "), " that closes the CTE before it, and leaves the WITH open.
func (n names) sealAt(src string) string {
	return `), h AS (
	UPDATE ` + n.generations + ` SET head = head + (SELECT count(*) FROM ` + src + `)
	WHERE feed = $1::text AND EXISTS (SELECT 1 FROM ` + src + `)
	RETURNING head - (SELECT count(*) FROM ` + src + `) AS base, coalesce(store, feed) AS store
), s AS (
	INSERT INTO ` + n.rows + ` AS r (feed, key, seq, doc, deleted_at)
	SELECT h.store, ` + src + `.key, h.base + ` + src + `.ord, ` + src + `.doc, CASE WHEN ` + src + `.doc IS NULL THEN now() END FROM ` + src + `, h
	ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc, deleted_at = excluded.deleted_at
	RETURNING 1
), n AS (
	SELECT pg_notify($3::text, $1::text) FROM (SELECT 1 FROM s LIMIT 1) AS one
)`
}

// lockedUpsertV1 is migrations 6 and 8's text of the locked upsert, which
// wrote the rows under the feed's own name. It is kept only so that those
// migrations render as they always did; migration 10 replaces the function
// that used it with one over lockedUpsert.
//
// It was the locked mode's write (statements.write) over the given
// feed name, change count, keys, documents (text or jsonb) and notify
// channel, returning the generation and the new head, into the given
// PL/pgSQL targets when into is not empty. Write runs it with parameters,
// and migration 6's write_result function, which QueueWrite calls, with its
// own arguments, so both keep one text of the rules.
func (n names) lockedUpsertV1(feedName, count, keys, docs, channel, into string) string {
	if into != "" {
		into = " INTO " + into
	}
	return `WITH g AS (
	INSERT INTO ` + n.generations + ` AS g (feed, head) VALUES (` + feedName + `, ` + count + `)
	ON CONFLICT (feed) DO UPDATE SET head = g.head + excluded.head WHERE g.write_mode = 'locked'
	RETURNING g.generation, g.head
), w AS (
	INSERT INTO ` + n.rows + ` AS r (feed, key, seq, doc, deleted_at)
	SELECT ` + feedName + `, c.key, g.head - ` + count + ` + c.ord, c.doc::jsonb, CASE WHEN c.doc IS NULL THEN now() END
	FROM g, unnest(` + keys + `, ` + docs + `) WITH ORDINALITY AS c(key, doc, ord)
	ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc, deleted_at = excluded.deleted_at
)
SELECT g.generation, g.head` + into + ` FROM g, LATERAL (SELECT pg_notify(` + channel + `, ` + feedName + `)) AS n`
}

// lockedUpsert is the locked mode's write (statements.write) over the given
// feed name, change count, keys, documents (text or jsonb) and notify
// channel, returning the generation and the new head, into the given
// PL/pgSQL targets when into is not empty. Write runs it with parameters,
// and migration 6's write_result function, which QueueWrite calls, with its
// own arguments, so both keep one text of the rules.
func (n names) lockedUpsert(feedName, count, keys, docs, channel, into string) string {
	if into != "" {
		into = " INTO " + into
	}
	return `WITH g AS (
	INSERT INTO ` + n.generations + ` AS g (feed, head) VALUES (` + feedName + `, ` + count + `)
	ON CONFLICT (feed) DO UPDATE SET head = g.head + excluded.head WHERE g.write_mode = 'locked'
	RETURNING g.generation, g.head, coalesce(g.store, g.feed) AS store
), w AS (
	INSERT INTO ` + n.rows + ` AS r (feed, key, seq, doc, deleted_at)
	SELECT g.store, c.key, g.head - ` + count + ` + c.ord, c.doc::jsonb, CASE WHEN c.doc IS NULL THEN now() END
	FROM g, unnest(` + keys + `, ` + docs + `) WITH ORDINALITY AS c(key, doc, ord)
	ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc, deleted_at = excluded.deleted_at
)
SELECT g.generation, g.head` + into + ` FROM g, LATERAL (SELECT pg_notify(` + channel + `, ` + feedName + `)) AS n`
}

func (n names) statements() statements {
	g, r, c, p := n.generations, n.rows, n.cursors, n.parked
	// lockHeld is true when this session holds the session advisory lock
	// with the bigint key $k: such a key shows in pg_locks split into classid
	// (high half), objid (low half) and objsubid 1.
	lockHeld := func(k string) string {
		return `EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
			AND classid = ((` + k + `::bigint >> 32) & 4294967295)::oid AND objid = (` + k + `::bigint & 4294967295)::oid AND objsubid = 1)`
	}
	const now = `coalesce($%d::timestamptz, clock_timestamp())`
	nowAt := func(i int) string { return fmt.Sprintf(now, i) }
	sl, u, ch := n.sealers, n.unsealed, n.changes
	return statements{
		write:           n.lockedUpsert(`$1::text`, `$2::bigint`, `$3::text[]`, `$4::text[]`, `$5::text`, ""),
		writeConcurrent: n.unsealedUpsert(`$1::text`, `$2::text[]`, `$3::text[]`, ""),
		writeResult:     `SELECT written_generation, written_head FROM ` + n.table("write_result") + `($1::text, $2::text[], $3::text[], $4::text, $5::bigint, $6::text)`,
		modeOf:          `SELECT coalesce(max(write_mode), 'locked') FROM ` + g + ` WHERE feed = $1::text`,
		modeIn:          `SELECT coalesce(max(write_mode), 'locked'), current_setting('transaction_isolation') FROM ` + g + ` WHERE feed = $1::text`,
		shareFeed:       `SELECT 1 FROM ` + g + ` WHERE feed = $1::text AND write_mode = 'concurrent'`,
		shareWrite:      `SELECT ` + snapshotTx + ` FROM pg_advisory_xact_lock_shared($1::bigint) AS l`,
		modeSeen:        `SELECT ` + n.table("mode_seen") + `($1::text)`,
		excludeWrite:    `SELECT pg_advisory_xact_lock($1::bigint)`,
		excludeWriteIn:  `SELECT ` + snapshotTx + ` FROM pg_advisory_xact_lock($1::bigint) AS l`,
		lockReset:       `SELECT 1 FROM ` + g + ` WHERE feed = $1::text FOR UPDATE`,
		sealLock:        `SELECT head FROM ` + g + ` WHERE feed = $1::text FOR NO KEY UPDATE`,
		seal: `WITH c AS (
	SELECT key, doc FROM ` + u + ` WHERE feed = $1::text ORDER BY key LIMIT $2::bigint FOR UPDATE SKIP LOCKED
), o AS (
	SELECT key, doc, row_number() OVER (ORDER BY key) AS ord FROM c
), d AS (
	DELETE FROM ` + u + ` AS u USING c WHERE u.feed = $1::text AND u.key = c.key
` + n.sealAt("o") + `
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM n)`,
		probe: `SELECT coalesce((SELECT write_mode FROM ` + g + ` WHERE feed = $1::text), 'locked'),
	EXISTS (SELECT 1 FROM ` + u + ` WHERE feed = $1::text), EXISTS (SELECT 1 FROM ` + ch + ` WHERE feed = $1::text AND id >= $2::bigint)`,
		recorded: `SELECT EXISTS (SELECT 1 FROM ` + ch + ` WHERE feed = $1::text AND id >= $2::bigint)`,
		takeSealer: `INSERT INTO ` + sl + ` AS s (feed, lease_holder, lease_expires_at)
VALUES ($1::text, $2::text, ` + nowAt(3) + ` + $4::bigint * interval '1 microsecond')
ON CONFLICT (feed) DO UPDATE SET lease_holder = excluded.lease_holder, lease_expires_at = excluded.lease_expires_at
WHERE s.lease_holder IS NULL OR s.lease_expires_at <= ` + nowAt(3) + `
RETURNING 1`,
		renewSealer: `UPDATE ` + sl + ` SET lease_expires_at = greatest(lease_expires_at, ` + nowAt(3) + ` + $4::bigint * interval '1 microsecond')
WHERE feed = $1::text AND lease_holder = $2::text
RETURNING 1`,
		clearSealer: `UPDATE ` + sl + ` SET lease_holder = NULL, lease_expires_at = NULL WHERE feed = $1::text AND lease_holder = $2::text`,
		setMode:     `INSERT INTO ` + g + ` (feed) VALUES ($1::text) ON CONFLICT (feed) DO NOTHING`,
		updateMode: `WITH m AS (
	UPDATE ` + g + ` SET write_mode = $2::text WHERE feed = $1::text AND write_mode IS DISTINCT FROM $2::text RETURNING feed
)
INSERT INTO ` + n.table("switches") + ` AS s (feed) SELECT feed FROM m
ON CONFLICT (feed) DO UPDATE SET switched_at = excluded.switched_at`,
		notifyMode: `SELECT pg_notify($1::text, $2::text)`,

		sealedRange: `SELECT coalesce((SELECT generation FROM ` + g + ` WHERE feed = $1::text), 1),
	min(seq), max(seq), EXISTS (SELECT 1 FROM ` + u + ` WHERE feed = $1::text AND key = ANY ($2::text[]))
		OR EXISTS (SELECT 1 FROM ` + ch + ` WHERE feed = $1::text AND keys && $2::text[])
FROM ` + r + ` WHERE feed = ` + n.storeOf("$1::text") + ` AND key = ANY ($2::text[])`,

		reset: `INSERT INTO ` + g + ` AS g (feed, generation) VALUES ($1::text, 2)
ON CONFLICT (feed) DO UPDATE SET generation = g.generation + 1
RETURNING g.generation`,
		emptyFeed: `WITH d AS (DELETE FROM ` + r + ` WHERE feed = ` + n.storeOf("$1::text") + `), e AS (DELETE FROM ` + u + ` WHERE feed = $1::text),
	x AS (DELETE FROM ` + ch + ` WHERE feed = $1::text)
SELECT pg_notify($2::text, $1::text)`,

		head:       `SELECT ` + n.readable("coalesce(max(head), 0)", "$1::text") + ` FROM ` + g + ` WHERE feed = $1::text`,
		generation: `SELECT coalesce(max(generation), 1) FROM ` + g + ` WHERE feed = $1::text`,
		readBatch: `WITH m AS (
	SELECT coalesce(max(generation), 1) AS generation, ` + n.readable("coalesce(max(head), 0)", "$1::text") + ` AS head FROM ` + g + ` WHERE feed = $1::text
)
SELECT NULL::text, m.generation, to_jsonb(m.head) FROM m
UNION ALL
(SELECT key, seq, doc FROM ` + r + ` WHERE feed = ` + n.storeOf("$1::text") + ` AND seq > $2::bigint AND seq <= (SELECT head FROM m) ORDER BY seq LIMIT $3::bigint)`,

		lockSinkXact: `SELECT pg_try_advisory_xact_lock($1::bigint)`,
		takeRow: `INSERT INTO ` + c + ` AS c (feed, sink, lease_holder, lease_expires_at)
VALUES ($1::text, $2::text, $3::text, ` + nowAt(4) + ` + $5::bigint * interval '1 microsecond')
ON CONFLICT (feed, sink) DO UPDATE SET lease_holder = excluded.lease_holder, lease_expires_at = excluded.lease_expires_at
WHERE c.lease_holder IS NULL
   OR c.lease_expires_at <= ` + nowAt(4) + `
   OR (c.lease_expires_at IS NULL AND $6::boolean)
RETURNING 1`,
		leaseOf: `SELECT lease_holder, lease_expires_at FROM ` + c + ` WHERE feed = $1::text AND sink = $2::text`,
		renewRow: `UPDATE ` + c + ` SET lease_expires_at = greatest(lease_expires_at, ` + nowAt(4) + ` + $5::bigint * interval '1 microsecond')
WHERE feed = $1::text AND sink = $2::text AND lease_holder = $3::text
RETURNING 1`,
		clearHolder: `UPDATE ` + c + ` SET lease_holder = NULL, lease_expires_at = NULL
WHERE feed = $1::text AND sink = $2::text AND lease_holder = $3::text`,
		claimAdvisory: `INSERT INTO ` + c + ` AS c (feed, sink, lease_holder, lease_expires_at)
SELECT $1::text, $2::text, $3::text, NULL WHERE ` + lockHeld("$5") + `
ON CONFLICT (feed, sink) DO UPDATE SET lease_holder = excluded.lease_holder, lease_expires_at = NULL
WHERE c.lease_holder IS NULL
   OR c.lease_expires_at IS NULL
   OR c.lease_expires_at <= ` + nowAt(4) + `
RETURNING 1`,
		tryLock:   `SELECT pg_try_advisory_lock($1::bigint)`,
		holdsLock: `SELECT ` + lockHeld("$1"),
		unlock:    `SELECT pg_advisory_unlock($1::bigint)`,

		readCursor: `SELECT generation, seq FROM ` + c + ` WHERE feed = $1::text AND sink = $2::text`,
		cas: `WITH f AS (
	SELECT coalesce(max(generation), 1) AS generation, coalesce(max(head), 0) AS head FROM ` + g + ` WHERE feed = $1::text
), m AS (
	UPDATE ` + c + ` AS c SET generation = $4::bigint, seq = $5::bigint, last_advance_at = ` + nowAt(8) + `
	FROM f
	WHERE c.feed = $1::text AND c.sink = $2::text AND c.lease_holder = $3::text
	  AND c.generation IS NOT DISTINCT FROM $6::bigint AND c.seq IS NOT DISTINCT FROM $7::bigint
	  AND f.generation = $4::bigint AND f.head >= $5::bigint
	RETURNING 1
)
SELECT (SELECT count(*) FROM m, LATERAL (SELECT pg_notify($9::text, $1::text)) AS n), f.generation, f.head FROM f`,
		casParks: `WITH cleared AS (
	DELETE FROM ` + p + ` AS p
	WHERE p.feed = $1::text AND p.sink = $2::text
	  AND ($3::boolean OR p.key = ANY ($4::text[]))
	  AND NOT (p.key = ANY ($5::text[]))
)
INSERT INTO ` + p + ` AS p (feed, sink, key, seq, reason, parked_at)
SELECT $1::text, $2::text, k.key, k.seq, k.reason, k.parked_at
FROM unnest($5::text[], $6::bigint[], $7::text[], $8::timestamptz[]) AS k(key, seq, reason, parked_at)
ON CONFLICT (feed, sink, key) DO UPDATE SET seq = excluded.seq, reason = excluded.reason, parked_at = excluded.parked_at`,
		readParked: `SELECT key, seq, reason, parked_at FROM ` + p + ` WHERE feed = $1::text AND sink = $2::text ORDER BY key`,
		lockFeed:   `SELECT head FROM ` + g + ` WHERE feed = $1::text FOR UPDATE`,
		unparkOne:  `DELETE FROM ` + p + ` WHERE feed = $1::text AND sink = $2::text AND key = $3::text RETURNING seq`,
		restamp: `WITH g AS (
	UPDATE ` + g + ` SET head = head + 1
	WHERE feed = $1::text AND EXISTS (SELECT 1 FROM ` + r + ` WHERE feed = ` + n.storeOf("$1::text") + ` AND key = $2::text AND seq IS NOT NULL)
	RETURNING head, coalesce(store, feed) AS store
), s AS (
	UPDATE ` + r + ` AS r SET seq = g.head FROM g WHERE r.feed = g.store AND r.key = $2::text AND r.seq IS NOT NULL
)
SELECT g.head FROM g, LATERAL (SELECT pg_notify($3::text, $1::text)) AS n`,
		oldestTombstone: `SELECT t.at, extract(epoch FROM clock_timestamp() - t.at)::float8
FROM (SELECT min(deleted_at) AS at FROM ` + r + ` WHERE feed = ` + n.storeOf("$1::text") + ` AND doc IS NULL AND seq IS NOT NULL) AS t`,
		collect: `WITH s AS (
	SELECT count(*) AS sinks, count(seq) AS placed, min(seq) AS low FROM ` + c + ` WHERE feed = $1::text
), k AS MATERIALIZED (
	SELECT r.ctid AS t FROM ` + r + ` AS r, s
	WHERE r.feed = ` + n.storeOf("$1::text") + ` AND r.doc IS NULL AND s.sinks > 0 AND s.placed = s.sinks AND r.seq <= s.low
	  AND NOT EXISTS (SELECT 1 FROM ` + u + ` AS u WHERE u.feed = $1::text AND u.key = r.key)
	  AND NOT EXISTS (SELECT 1 FROM ` + p + ` AS p WHERE p.feed = $1::text AND p.key = r.key)
	FOR UPDATE OF r SKIP LOCKED
), d AS (
	DELETE FROM ` + r + ` AS r WHERE r.ctid = ANY (ARRAY(SELECT t FROM k))
	RETURNING 1
)
SELECT count(*) FROM d`,
		removeCursor: `DELETE FROM ` + c + `
WHERE feed = $1::text AND sink = $2::text
  AND (lease_holder IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ` + nowAt(3) + `)
RETURNING 1`,
		cursorExists: `SELECT count(*) FROM ` + c + ` WHERE feed = $1::text AND sink = $2::text`,
		removeParked: `DELETE FROM ` + p + ` WHERE feed = $1::text AND sink = $2::text`,
		traceKey: `WITH g AS (SELECT generation, head FROM ` + g + ` WHERE feed = $1::text),
k AS (SELECT seq, doc FROM ` + r + ` WHERE feed = ` + n.storeOf("$1::text") + ` AND key = $2::text),
u AS (SELECT doc FROM ` + u + ` WHERE feed = $1::text AND key = $2::text)
SELECT coalesce((SELECT generation FROM g), 1), coalesce((SELECT head FROM g), 0),
	EXISTS (SELECT 1 FROM g) OR EXISTS (SELECT 1 FROM ` + c + ` WHERE feed = $1::text),
	(SELECT seq FROM k), (SELECT doc FROM k),
	EXISTS (SELECT 1 FROM u), (SELECT doc FROM u), EXISTS (SELECT 1 FROM ` + ch + ` WHERE feed = $1::text AND $2::text = ANY (keys)),
	c.sink, c.generation, c.seq, p.seq, p.reason, p.parked_at,
	CASE WHEN c.seq < (SELECT seq FROM k) THEN
		(SELECT count(*) FROM ` + r + ` x WHERE x.feed = ` + n.storeOf("$1::text") + ` AND x.seq > c.seq AND x.seq < (SELECT seq FROM k)) END
FROM (SELECT 1) one
LEFT JOIN ` + c + ` c ON c.feed = $1::text
LEFT JOIN ` + p + ` p ON p.feed = c.feed AND p.sink = c.sink AND p.key = $2::text
ORDER BY c.sink`,
		listFeeds: `SELECT feed FROM ` + g + ` UNION SELECT feed FROM ` + c + ` ORDER BY 1`,
		describeFeed: `SELECT coalesce(max(generation), 1), coalesce(max(head), 0),
	count(*) > 0 OR EXISTS (SELECT 1 FROM ` + c + ` WHERE feed = $1::text),
	coalesce(max(write_mode), 'locked'),
	(SELECT count(*) FROM ` + u + ` WHERE feed = $1::text) + (SELECT coalesce(sum(n), 0) FROM ` + ch + ` WHERE feed = $1::text)::bigint,
	(SELECT lease_holder FROM ` + sl + ` WHERE feed = $1::text),
	(SELECT lease_expires_at FROM ` + sl + ` WHERE feed = $1::text),
	(SELECT min(deleted_at) FROM ` + r + ` WHERE feed = ` + n.storeOf("$1::text") + ` AND doc IS NULL AND seq IS NOT NULL)
FROM ` + g + ` WHERE feed = $1::text`,
		describeSinks: `WITH c AS (
	SELECT sink, generation, seq, last_advance_at, lease_holder, lease_expires_at, coalesce(seq, 0) AS at
	FROM ` + c + ` WHERE feed = $1::text
), p AS (
	SELECT at, lead(at) OVER (ORDER BY at) AS next FROM (SELECT DISTINCT at FROM c) AS d
), s AS MATERIALIZED (
	SELECT p.at, (SELECT count(*) FROM ` + r + ` AS r
		WHERE r.feed = ` + n.storeOf("$1::text") + ` AND r.seq > p.at AND r.seq <= coalesce(p.next, 9223372036854775807)) AS n
	FROM p
)
SELECT c.sink, c.generation, c.seq, c.last_advance_at, c.lease_holder, c.lease_expires_at,
	coalesce((SELECT sum(s.n) FROM s WHERE s.at >= c.at), 0)::bigint
FROM c ORDER BY c.sink`,
		describeParked: `SELECT sink, key, seq, reason, parked_at FROM ` + p + ` WHERE feed = $1::text ORDER BY sink, key`,
	}
}
