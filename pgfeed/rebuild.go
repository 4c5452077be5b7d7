package pgfeed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
)

// DefaultBackfillWorkers is how many connections a backfill as a new
// generation copies with at once (BackfillOptions.Workers). Two reached
// 1.4–1.6 times one's rate on the 2-core machine of BENCHMARKS.md: the copy
// is bound by the server's CPU, so more than its cores gain nothing.
const DefaultBackfillWorkers = 2

// copyLockTimeout bounds each lock wait of a worker of a backfill as a new
// generation. A worker takes the table's lock after the coordinator holds
// the feed's write lock, so a TRUNCATE, an Uncapture or an ALTER of the
// table that came in between queues for the table behind the
// coordinator's own lock, the worker queues behind it, and the coordinator
// waits for the worker in Go, where no deadlock detector sees it: without
// a bound, that would hold every captured writer of the feed for ever.
// Nothing else a worker does waits for a lock (it writes rows no one else
// knows of), so a wait this long is that, and the backfill fails, leaving
// the feed as it was, and lets the other session go on.
const copyLockTimeout = 5 * time.Second

// sweepBatch is how many rows of a store no feed points at one statement
// deletes, each in a transaction of its own, so that deleting a large one
// holds no lock and no snapshot for long.
const sweepBatch = 10000

// A backfill as a new generation, on a pool, copies the table into the
// rows table under a fresh store name (see the package doc's # Backfill)
// from several connections at once, each reading the table in one
// snapshot and committing its share unseen, and then points the feed at
// that name in the transaction that moves the generation:
//
//   - The coordinator's transaction takes the feed's write lock exclusive
//     and its generations row, as a reset does, so every captured writer
//     waits until the generation moves, and exports its snapshot, taken
//     after both: the table as every writer before the lock left it.
//   - The workers import that snapshot (REPEATABLE READ), which the
//     coordinator keeps open. The first counts the table and picks the key
//     at which each worker's share starts, so each share's size, and so the
//     seqs it writes (head+1.., in key order within the share), are known
//     before any row is copied. Each worker then copies its share in
//     keyset batches, with plain inserts: nothing else writes the new
//     store.
//   - The coordinator checks the capture is still the one the copy read,
//     and moves the generation, the head past the copy and the store in
//     one statement, deletes the unsealed writes and recorded keys as a
//     reset does, and commits. The old store's rows are deleted after,
//     in batches (sweepStores), outside the locks.
//
// The new store is entered in the stores table (filling) before any worker
// writes, so the rows of a copy that failed are found and deleted: at once
// when the coordinator is alive to do it, else by the next backfill as a
// new generation of the feed, which deletes filling stores only under the
// feed's backfill lock, so never one a live backfill fills.
func (s *Store) backfillGeneration(ctx context.Context, pool *pgxpool.Pool, opts BackfillOptions, c *capture,
	fail func(string, error) error, progress func(rows, total int64)) (BackfillResult, error) {
	f := string(opts.Feed)
	workers := opts.Workers
	if maxConns := int(pool.Config().MaxConns) - 1; workers > maxConns {
		workers = max(maxConns, 1)
	}
	var res BackfillResult
	// Every connection is taken before any lock: captured writers that
	// wait for the write lock hold connections of their own, perhaps of
	// this pool, and a worker waiting for one of those would wait for
	// ever.
	conns := make([]*pgxpool.Conn, 0, workers+1)
	defer func() {
		for _, pc := range conns {
			pc.Release()
		}
	}()
	for range workers + 1 {
		pc, err := pool.Acquire(ctx)
		if err != nil {
			return res, fail("connecting the copy's workers", err)
		}
		conns = append(conns, pc)
	}
	coord, err := conns[0].BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return res, fail("beginning the new generation", err)
	}
	defer func() { _ = coord.Rollback(context.WithoutCancel(ctx)) }()
	wconns := conns[1:]

	// The backfill lock first: one backfill as a new generation of a feed
	// at a time, and only its holder deletes the feed's filling stores.
	var locked bool
	if err := coord.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1::bigint)`, s.backfillKey(opts.Feed)).Scan(&locked); err != nil {
		return res, fail("taking the backfill lock", err)
	}
	if !locked {
		return res, fail("taking the backfill lock", errors.New("another backfill of this feed as a new generation is running"))
	}
	if err := s.sweepStores(ctx, coord, f, "filling"); err != nil {
		return res, fail("deleting the rows of an earlier backfill that failed", err)
	}
	if _, err := coord.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, s.writeKey(opts.Feed)); err != nil {
		return res, fail("taking the write lock", err)
	}
	var gen, head int64
	if err := coord.QueryRow(ctx, `INSERT INTO `+s.names.generations+` AS g (feed) VALUES ($1::text)
ON CONFLICT (feed) DO UPDATE SET head = g.head
RETURNING g.generation, g.head`, f).Scan(&gen, &head); err != nil {
		return res, fail("taking the feed lock", err)
	}
	var snapshot string
	if err := coord.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		return res, fail("exporting the copy's snapshot", err)
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	store := f + "/" + hex.EncodeToString(suffix[:])

	// The workers' connections, each in the coordinator's snapshot; the
	// first also enters the store as filling, committed at once, before
	// any row is written under it.
	if _, err := wconns[0].Exec(ctx, `INSERT INTO `+s.names.table("stores")+` (store, feed, state) VALUES ($1::text, $2::text, 'filling')`, store, f); err != nil {
		return res, fail("entering the new store", err)
	}
	txs := make([]pgx.Tx, len(wconns))
	defer func() {
		for _, tx := range txs {
			if tx != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
			}
		}
	}()
	for i, pc := range wconns {
		tx, err := pc.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err == nil {
			_, err = tx.Exec(ctx, `SET TRANSACTION SNAPSHOT `+quoteLiteral(snapshot))
		}
		if err == nil {
			_, err = tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, copyLockTimeout.Milliseconds()))
		}
		if err != nil {
			if tx != nil {
				_ = tx.Rollback(ctx)
			}
			return res, fail("importing the copy's snapshot", err)
		}
		txs[i] = tx
	}

	// abandon ends a copy that failed with err as what: the rows the
	// workers wrote go with the store, and a lock timeout says what it
	// means.
	abandon := func(what string, err error) error {
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55P03" {
			err = fmt.Errorf("a worker waited more than %v for a lock on table %s, which another session (a TRUNCATE, ALTER TABLE or Uncapture of it, say) asked for after the copy held the feed's writers back; the feed is as it was, run the backfill again: %w", copyLockTimeout, c.table, err)
		}
		if swept := s.sweepStores(context.WithoutCancel(ctx), coord, f, "filling"); swept == nil {
			_ = coord.Commit(context.WithoutCancel(ctx))
		}
		return fail(what, err)
	}
	// The shares: worker i copies the rows from the one at offset
	// total*i/n, in key order, up to the next share's first.
	var total int64
	if err := txs[0].QueryRow(ctx, `SELECT count(*) FROM `+c.table).Scan(&total); err != nil {
		return res, abandon("counting the rows of "+c.table, err)
	}
	st := s.rebuildStatements(c)
	type share struct {
		from  []string // the share's first key, nil for the table's start
		base  int64    // the rows before the share
		count int64
	}
	var shares []share
	for i := range len(txs) {
		at := total * int64(i) / int64(len(txs))
		if i > 0 && at == shares[len(shares)-1].base {
			continue
		}
		var from []string
		if i > 0 {
			if err := txs[0].QueryRow(ctx, st.keyAt, at).Scan(&from); err != nil {
				return res, abandon("finding where a share of "+c.table+" starts", err)
			}
		}
		shares = append(shares, share{from: from, base: at})
	}
	for i := range shares {
		end := total
		if i+1 < len(shares) {
			end = shares[i+1].base
		}
		shares[i].count = end - shares[i].base
	}
	progress(0, total)

	// The copy, each share by its own worker.
	copyCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu     sync.Mutex
		copied int64
		wg     sync.WaitGroup
		// first is the first worker's failure: the others' come of the
		// cancellation it causes, and say nothing of the copy.
		first error
	)
	for i, sh := range shares {
		var upTo []string
		if i+1 < len(shares) {
			upTo = shares[i+1].from
		}
		tx := txs[i]
		wg.Go(func() {
			n, err := s.copyShare(copyCtx, tx, st, opts, store, head+sh.base, sh.from, upTo, func(n int64) {
				mu.Lock()
				defer mu.Unlock()
				copied += n
				progress(copied, total)
			})
			switch {
			case err != nil:
			case n != sh.count:
				err = fmt.Errorf("a share of %s held %d rows at the count and %d at the copy, in one snapshot", c.table, sh.count, n)
			default:
				err = tx.Commit(copyCtx)
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel()
			}
		})
	}
	wg.Wait()
	if err := first; err != nil {
		// Whatever the workers committed goes with the store.
		return res, abandon("copying the table", err)
	}

	// The move: the capture must be the one the copy read.
	var version *string
	if err := coord.QueryRow(ctx, `SELECT version FROM `+s.names.table("captures")+` WHERE feed = $1::text`, f).Scan(&version); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return res, fail("reading the capture", err)
	}
	if version == nil || *version != c.version {
		_ = s.sweepStores(context.WithoutCancel(ctx), coord, f, "filling")
		_ = coord.Commit(context.WithoutCancel(ctx))
		return res, feed.Invalid("options.feed", "names feed %s, whose capture was changed or removed while the backfill copied its table; run the backfill again", f)
	}
	var old string
	if err := coord.QueryRow(ctx, st.move, f, total, store, s.names.channel, c.version).Scan(&gen, &head, &old); err != nil {
		return res, fail("moving to the new generation", err)
	}
	if err := coord.Commit(ctx); err != nil {
		return res, fail("committing the new generation", err)
	}
	res.Rows, res.Generation, res.Head = total, feed.Generation(gen), feed.Seq(head)
	// The old generation's rows: nothing reads or writes them any more.
	if err := s.sweepStores(context.WithoutCancel(ctx), conns[0], f, "retired"); err != nil {
		s.logger.Warn("pgfeed: deleting the rows of the feed's generation before the backfill; CollectTombstones deletes them later", "feed", f, "store", old, "error", err)
	}
	return res, nil
}

// backfillKey is the advisory key of f's backfill lock (see
// backfillGeneration).
func (s *Store) backfillKey(f feed.FeedName) int64 {
	return lockKey("backfill", s.names.schema, s.names.prefix, string(f))
}

// rebuildSQL are the statements of a backfill as a new generation.
type rebuildSQL struct {
	// keyAt reads the key columns, as text, of the row at offset $1 in key
	// order: where a share starts.
	keyAt string
	// batch copies a batch of a share: see rebuildBatch.
	batch func(from, after, upTo bool) string
	// move moves feed $1 to the new generation: the head past the $2
	// rows copied, the store $3, the old store entered as retired and the
	// new one's entry gone, the unsealed writes and recorded keys deleted
	// as a reset deletes them, the backfill recorded as finished at capture
	// version $5, and a notify on channel $4. It returns the generation,
	// the head and the old store.
	move string
}

func (s *Store) rebuildStatements(c *capture) rebuildSQL {
	_, _, _, tuple := keyParts(c)
	var keyText []string
	for _, t := range tuple {
		keyText = append(keyText, t+"::text")
	}
	g, u, ch, st, bf := s.names.generations, s.names.unsealed, s.names.changes, s.names.table("stores"), s.names.table("backfills")
	return rebuildSQL{
		keyAt: `SELECT ARRAY[` + strings.Join(keyText, ", ") + `] FROM ` + c.table + ` AS r ORDER BY ` + strings.Join(tuple, ", ") + ` OFFSET $1::bigint LIMIT 1`,
		// A batch reads the share's rows from its first key ($4, from) or
		// after the last one copied ($4, after), before the next share's
		// first ($5, upTo), and inserts them under the store $1 at seqs
		// $3+1.. in key order. Every variant names every parameter (the
		// last column), so that one argument list serves them all. A batch holding a row the feed refuses
		// hands those rows to the write function ($6 the feed, $7 the
		// channel, $8 the write lock's key), which refuses them with its
		// own error before it writes anything, and the statement fails.
		batch: func(from, after, upTo bool) string {
			w := batchKind{from: from, after: after, upTo: upTo}.where(c, "$4", "$5")
			return s.batchRead(c, w, "$2", "$6", "$7", "$8") + `), w AS (
	INSERT INTO ` + s.names.rows + ` (feed, key, seq, doc, deleted_at)
	SELECT $1::text, o.key, $3::bigint + o.ord, o.doc, CASE WHEN o.doc IS NULL THEN now() END
	FROM (SELECT b.key, b.doc, row_number() OVER () AS ord FROM b) AS o
)
SELECT n.rows, n.last, (SELECT refused FROM x), $4::text[] IS NULL AND $5::text[] IS NULL FROM n`
		},
		move: `WITH o AS (
	SELECT coalesce(store, feed) AS old FROM ` + g + ` WHERE feed = $1::text
), g AS (
	UPDATE ` + g + ` SET generation = generation + 1, head = head + $2::bigint, store = $3::text
	WHERE feed = $1::text
	RETURNING generation, head
), r AS (
	INSERT INTO ` + st + ` (store, feed, state) SELECT o.old, $1::text, 'retired' FROM o
	ON CONFLICT (store) DO UPDATE SET state = 'retired', since = clock_timestamp()
), f AS (
	DELETE FROM ` + st + ` WHERE store = $3::text
), d AS (
	DELETE FROM ` + u + ` WHERE feed = $1::text
), x AS (
	DELETE FROM ` + ch + ` WHERE feed = $1::text
), h AS (
	DELETE FROM ` + s.names.table("backfill_shares") + ` WHERE feed = $1::text
), b AS (
	INSERT INTO ` + bf + ` AS b (feed, version, position, rows, finished_at) VALUES ($1::text, $5::text, NULL, $2::bigint, clock_timestamp())
	ON CONFLICT (feed) DO UPDATE SET version = excluded.version, position = NULL, rows = excluded.rows,
		started_at = clock_timestamp(), updated_at = clock_timestamp(), finished_at = clock_timestamp()
)
SELECT g.generation, g.head, o.old FROM g, o, LATERAL (SELECT pg_notify($4::text, $1::text)) AS n`,
	}
}

// copyShare copies one share of the table into store at seqs base+1..,
// from its first key from (nil: the table's start) up to the next share's
// first, upTo (nil: the table's end), in batches of opts.BatchSize, and
// says how many rows it copied; done is told each batch's count.
func (s *Store) copyShare(ctx context.Context, tx pgx.Tx, st rebuildSQL, opts BackfillOptions, store string, base int64,
	from, upTo []string, done func(int64)) (int64, error) {
	var n int64
	pos, first := from, true
	for {
		q := st.batch(first && pos != nil, !first, upTo != nil)
		var got int64
		var last []string
		var refused *int64
		var unbounded bool
		if err := tx.QueryRow(ctx, q, store, int64(opts.BatchSize), base+n, pos, upTo,
			string(opts.Feed), s.names.channel, s.writeKey(opts.Feed)).Scan(&got, &last, &refused, &unbounded); err != nil {
			return n, err
		}
		if refused != nil {
			// write refuses every row handed to it for refusal; one that
			// returned means the two filters differ.
			return n, errors.New("the write function took a row the backfill held for refused")
		}
		n += got
		if got > 0 {
			done(got)
			pos, first = last, false
		}
		if got < int64(opts.BatchSize) {
			return n, nil
		}
	}
}

// sweepStores deletes the rows stored under f's stores in the given state
// (filling or retired: see the stores table's migration), a batch per
// statement, and then their entries. On q a transaction, every batch is
// part of it; on the pool, each commits alone.
func (s *Store) sweepStores(ctx context.Context, q DBTX, f, state string) error {
	rows, err := q.Query(ctx, `SELECT store FROM `+s.names.table("stores")+` WHERE feed = $1::text AND state = $2::text ORDER BY store`, f, state)
	if err != nil {
		return err
	}
	stores, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, store := range stores {
		// In key order from the last key deleted, so that no batch walks
		// the dead index entries of the batches before it (keys are never
		// empty, so the first starts after '').
		after := ""
		for {
			var n int64
			var last *string
			err := q.QueryRow(ctx, `WITH d AS (
	DELETE FROM `+s.names.rows+` WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM `+s.names.rows+` WHERE feed = $1::text AND key > $2::text ORDER BY key LIMIT $3::bigint))
	RETURNING key
)
SELECT count(*), max(key) FROM d`, store, after, int64(sweepBatch)).Scan(&n, &last)
			if err != nil {
				return err
			}
			if n < sweepBatch || last == nil {
				break
			}
			after = *last
		}
		if _, err := q.Exec(ctx, `DELETE FROM `+s.names.table("stores")+` WHERE store = $1::text AND state = $2::text`, store, state); err != nil {
			return err
		}
	}
	return nil
}
