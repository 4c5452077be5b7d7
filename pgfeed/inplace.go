package pgfeed

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
)

// An in-place backfill splits its table's key range into shares, one for
// each connection that copies it, each with its position in the
// backfill_shares table (see its migration), so a run that stopped resumes
// every share where its last committed batch left it.
//
// With one connection (a DBTX that is not a pool, or Workers 1) a batch
// takes the feed lock and writes its rows at the head, as a locked-mode
// writer does (inPlaceRun.locked). With more, on a pool, batches run at
// once, each writing at seqs reserved for it before it reads
// (inPlaceRun.parallel), and readers stop below the seqs a batch still
// holds (see the reserved table's migration and names.readable).

// backfillShare is one range of an in-place backfill's table.
type backfillShare struct {
	n int
	// first is the share's first key and upto the next share's, the key's
	// columns as text; nil for the table's start and end.
	first, upto []string
	// position is the last key copied, nil before the first batch.
	position []string
	rows     int64
	done     bool
	// upsertNext is how many more batches upsert before one tries a plain
	// insert again, and backoff how many the last failed try set it to
	// (see inPlaceRun.batch). The worker copying the share alone uses them.
	upsertNext, backoff int
}

// batchKind says which variant of the in-place batch statement to build.
type batchKind struct {
	// from starts at the share's first key, after past the position; with
	// neither the batch starts at the table's start.
	from, after bool
	// upTo stops before the next share's first key.
	upTo bool
	// reserved writes at the seqs reserved from $8 on (inPlaceRun.parallel);
	// otherwise the batch moves the head, holding the feed lock.
	reserved bool
	// plain inserts the rows, failing with a unique violation where the
	// feed holds one of their keys already, instead of upserting them.
	plain bool
}

// inPlaceBatch is the statement of an in-place batch of kind k: $1 the
// feed, $2 how many rows, $3 the channel, $4 the write lock's key, $5 the
// position (after) or the share's first key (from), $6 the next share's
// first key, $7 the share, $8 the first reserved seq. It reads the rows in
// key order, writes them as the locked mode's write function would (each
// key's row replaced with the next seq, a NULL document a tombstone), except
// that a key's row already at a higher seq (a writer's, committed after the
// seqs were reserved) is kept, records the share's progress, ends the
// reservation, and notifies. A batch holding a row the feed refuses hands
// those rows to the write function, which refuses them before it writes
// anything, in either mode.
func (s *Store) inPlaceBatch(c *capture, k batchKind) string {
	w := k.where(c, "$5", "$6")
	// g gives the store and the seq before the batch's first.
	g := `g AS (
	UPDATE ` + s.names.generations + ` AS g SET head = g.head + n.rows FROM n WHERE g.feed = $1::text AND n.rows > 0
	RETURNING g.head - n.rows AS base, coalesce(g.store, g.feed) AS store
)`
	// A locked batch notifies when it wrote a row; a reserved one always,
	// since readers may have stopped below its seqs.
	end, notifyWhen := "", " WHERE n.rows > 0"
	if k.reserved {
		notifyWhen = ""
		g = `g AS (
	SELECT $8::bigint - 1 AS base, ` + s.names.storeOf("$1::text") + ` AS store
)`
		end = `, v AS (
	DELETE FROM ` + s.names.table("reserved") + ` WHERE feed = $1::text AND first_seq = $8::bigint
)`
	}
	// A plain batch inserts its rows; otherwise every row is upserted,
	// guarded (see inPlaceRun.batch for which runs when). Probing each key
	// to insert only the keys the feed lacked was tried and dropped: the
	// probe's plan followed the rows table's statistics, and where they said
	// the table was empty (a new schema, a table vacuumed empty and never
	// analyzed) each probe was a sequential scan, and one copy of 300,000
	// rows ran at 5k–30k rows/s.
	conflict := `
	ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc, deleted_at = excluded.deleted_at
	WHERE r.seq IS NULL OR r.seq < excluded.seq`
	if k.plain {
		conflict = ""
	}
	writes := `, u AS (
	INSERT INTO ` + s.names.rows + ` AS r (feed, key, seq, doc, deleted_at)
	SELECT g.store, o.key, g.base + o.ord, o.doc, CASE WHEN o.doc IS NULL THEN now() END
	FROM o, g` + conflict + `
)`
	return s.batchRead(c, w, "$2", "$1", "$3", "$4") + `), ` + g + `, o AS (
	SELECT b.key, b.doc, row_number() OVER () AS ord FROM b
)` + writes + `, p AS (
	UPDATE ` + s.names.table("backfill_shares") + ` AS f SET position = coalesce(n.last, f.position), rows = f.rows + n.rows,
		updated_at = clock_timestamp()
	FROM n WHERE f.feed = $1::text AND f.share = $7::int
	RETURNING f.rows
)` + end + `
SELECT n.rows, n.last, (SELECT refused FROM x), (SELECT count(pg_notify($3::text, $1::text)) FROM n` + notifyWhen + `),
	$5::text[] IS NULL AND $6::text[] IS NULL AND $8::bigint IS NULL FROM n`
}

// countBatch counts the rows of the next batch of kind k ($1 at most): $2
// is inPlaceBatch's $5, $3 its $6.
func (s *Store) countBatch(c *capture, k batchKind) string {
	_, _, _, tuple := keyParts(c)
	w := k.where(c, "$2", "$3")
	return `SELECT count(*), $2::text[] IS NULL, $3::text[] IS NULL FROM (SELECT FROM ` + c.table + ` AS r` + w + `
	ORDER BY ` + strings.Join(tuple, ", ") + ` LIMIT $1::bigint) AS b`
}

// where is the WHERE clause (empty for the whole table) of a batch of
// kind k over c's table as r, with at the parameter holding the position
// or the share's first key, and upto the one holding the next share's.
func (k batchKind) where(c *capture, at, upto string) string {
	_, _, _, tuple := keyParts(c)
	row := "(" + strings.Join(tuple, ", ") + ")"
	var where []string
	switch {
	case k.from:
		where = append(where, row+" >= "+positionAt(c, at))
	case k.after:
		where = append(where, row+" > "+positionAt(c, at))
	}
	if k.upTo {
		where = append(where, row+" < "+positionAt(c, upto))
	}
	if len(where) == 0 {
		return ""
	}
	return "\n\tWHERE " + strings.Join(where, " AND ")
}

// kindOf is the batch kind that goes on from where sh stands.
func (sh *backfillShare) kindOf(reserved bool) (batchKind, []string) {
	k := batchKind{upTo: sh.upto != nil, reserved: reserved}
	switch {
	case sh.position != nil:
		k.after = true
		return k, sh.position
	case sh.first != nil:
		k.from = true
		return k, sh.first
	}
	return k, nil
}

// inPlaceRun is an in-place backfill under way.
type inPlaceRun struct {
	s      *Store
	ctx    context.Context
	opts   BackfillOptions
	c      *capture
	st     backfillSQL
	fail   func(string, error) error
	shares []*backfillShare

	mu     sync.Mutex // guards the fields below and progress calls
	res    BackfillResult
	copied int64
	report func(done bool)
}

// startInPlace resumes an unfinished in-place run of the same capture
// version, or records a new one split into workers shares.
func (s *Store) startInPlace(ctx context.Context, opts BackfillOptions, c *capture, total int64, workers int,
	fail func(string, error) error) (shares []*backfillShare, resumed bool, err error) {
	f := string(opts.Feed)
	bf, sht := s.names.table("backfills"), s.names.table("backfill_shares")
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		shares, resumed = nil, false
		var version string
		var position []string
		var rows int64
		var finished *time.Time
		err := tx.QueryRow(ctx, `SELECT version, position, rows, finished_at FROM `+bf+` WHERE feed = $1::text FOR UPDATE`, f).Scan(&version, &position, &rows, &finished)
		switch {
		case err != nil && !errors.Is(err, pgx.ErrNoRows):
			return fail("reading the backfill's progress", err)
		case err == nil && finished == nil && version == c.version:
			resumed = true
			list, err := tx.Query(ctx, `SELECT share, first, upto, position, rows, finished_at IS NOT NULL FROM `+sht+` WHERE feed = $1::text ORDER BY share`, f)
			if err != nil {
				return fail("reading the backfill's progress", err)
			}
			shares, err = pgx.CollectRows(list, func(r pgx.CollectableRow) (*backfillShare, error) {
				var sh backfillShare
				return &sh, r.Scan(&sh.n, &sh.first, &sh.upto, &sh.position, &sh.rows, &sh.done)
			})
			if err != nil {
				return fail("reading the backfill's progress", err)
			}
			if len(shares) > 0 {
				return nil
			}
			// A run recorded before backfills had shares: its position
			// and rows are one share's over the whole table.
			shares = []*backfillShare{{position: position, rows: rows}}
		default:
			if _, err := tx.Exec(ctx, `INSERT INTO `+bf+` AS b (feed, version) VALUES ($1::text, $2::text)
ON CONFLICT (feed) DO UPDATE SET version = excluded.version, position = NULL, rows = 0,
	started_at = clock_timestamp(), updated_at = clock_timestamp(), finished_at = NULL`, f, c.version); err != nil {
				return fail("recording the backfill", err)
			}
			shares = []*backfillShare{{}}
			keyAt := s.rebuildStatements(c).keyAt
			for i := 1; i < workers && total > 0; i++ {
				var from []string
				err := tx.QueryRow(ctx, keyAt, total*int64(i)/int64(workers)).Scan(&from)
				if errors.Is(err, pgx.ErrNoRows) {
					break
				}
				if err != nil {
					return fail("finding where a share of "+c.table+" starts", err)
				}
				shares[len(shares)-1].upto = from
				shares = append(shares, &backfillShare{n: i, first: from})
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+sht+` WHERE feed = $1::text`, f); err != nil {
			return fail("recording the backfill", err)
		}
		for _, sh := range shares {
			if _, err := tx.Exec(ctx, `INSERT INTO `+sht+` (feed, share, first, upto, position, rows, finished_at)
VALUES ($1::text, $2::int, $3::text[], $4::text[], $5::text[], $6::bigint, CASE WHEN $7::boolean THEN clock_timestamp() END)`,
				f, sh.n, sh.first, sh.upto, sh.position, sh.rows, sh.done); err != nil {
				return fail("recording the backfill", err)
			}
		}
		return nil
	})
	return shares, resumed, err
}

// maxPlainBackoff caps how many batches of a share upsert after a plain
// insert failed, before the next one tries again (see inPlaceRun.batch).
const maxPlainBackoff = 32

// batch runs one batch of sh in tx and returns how many rows it copied;
// first is the first reserved seq (kind.reserved). It records the batch in
// sh and the run once tx commits, which the caller does.
//
// A batch tries a plain insert first, in a savepoint: a guarded upsert
// costs each row a speculative insertion (a probe of the key's index, a
// lock and a second WAL record), and the plain insert copies a feed that
// holds none of the batch's keys, a table's first backfill, about a
// quarter faster. Where the feed holds one of the keys already (a
// writer's row, or an earlier copy) the insert fails with a unique
// violation, and the batch rolls back to the savepoint and upserts. A
// failed try costs at most one batch's insert, so after one the share's
// next batches upsert without trying, 1, 2, 4 … up to maxPlainBackoff of
// them, until a try succeeds: in a feed that holds most keys, or a table
// whose writers touch a key in every batch, after the first few at most
// one batch in 33 tries in vain.
func (r *inPlaceRun) batch(tx pgx.Tx, sh *backfillShare, limit int64, reserved bool, first int64) (int64, []string, error) {
	k, at := sh.kindOf(reserved)
	var n int64
	var last []string
	run := func(q pgx.Tx, k batchKind) error {
		var refused *int64
		var notified int64
		var ignored *bool
		err := q.QueryRow(r.ctx, r.s.inPlaceBatch(r.c, k), string(r.opts.Feed), limit, r.s.names.channel,
			r.s.writeKey(r.opts.Feed), at, sh.upto, sh.n, first).Scan(&n, &last, &refused, &notified, &ignored)
		r.s.testBatch(k.plain, err)
		if err != nil {
			return err
		}
		if refused != nil {
			// write refuses every row handed to it for refusal; one that
			// returned means the two filters differ.
			return errors.New("the write function took a row the backfill held for refused")
		}
		return nil
	}
	if sh.upsertNext > 0 {
		sh.upsertNext--
		err := run(tx, k)
		return n, last, err
	}
	sp, err := tx.Begin(r.ctx)
	if err != nil {
		return 0, nil, err
	}
	k.plain = true
	err = run(sp, k)
	if err == nil {
		sh.backoff = 0
		err = sp.Commit(r.ctx)
		return n, last, err
	}
	if !isUniqueViolation(err) {
		return 0, nil, err
	}
	if err := sp.Rollback(r.ctx); err != nil {
		return 0, nil, err
	}
	sh.backoff = min(max(2*sh.backoff, 1), maxPlainBackoff)
	sh.upsertNext = sh.backoff
	k.plain = false
	err = run(tx, k)
	return n, last, err
}

// isUniqueViolation says err is PostgreSQL's unique_violation.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// committed records a batch of sh that committed, in the generation gen
// (0: unknown) and, for a locked batch, with the head head after it, and
// reports the progress. It is called outside any transaction: the report
// runs the caller's Progress, which may wait on the database (Uncapture the
// feed, say), and a batch that waited for it inside its transaction would
// hold its locks meanwhile.
func (r *inPlaceRun) committed(sh *backfillShare, n int64, last []string, gen feed.Generation, head feed.Seq) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n > 0 {
		sh.position = last
	}
	sh.rows += n
	r.copied += n
	r.res.Rows += n
	if gen != 0 {
		r.res.Generation = gen
	}
	if head != 0 {
		r.res.Head = head
	}
	r.report(false)
}

// lockBatch takes, in tx, the table's lock and the write lock shared (so
// neither a switch of the write mode nor a reset, nor Uncapture, each of
// which takes it exclusive, runs under a batch); the caller then checks
// the feed still captures the table.
func (r *inPlaceRun) lockBatch(tx pgx.Tx) error {
	if _, err := tx.Exec(r.ctx, r.st.table); err != nil {
		return r.fail("locking table "+r.c.table, err)
	}
	if _, err := tx.Exec(r.ctx, r.st.share, r.s.writeKey(r.opts.Feed)); err != nil {
		return r.fail("taking the write lock", err)
	}
	return nil
}

// locked copies sh one batch a transaction, each holding the feed lock.
func (r *inPlaceRun) locked(sh *backfillShare) error {
	f := string(r.opts.Feed)
	for !sh.done {
		var n int64
		var last []string
		var finished bool
		var generation feed.Generation
		var head feed.Seq
		err := r.s.readCommitted(r.ctx, func(tx pgx.Tx) error {
			if err := r.lockBatch(tx); err != nil {
				return err
			}
			// The feed lock in a statement of its own: the batch's read
			// then takes its snapshot after every locked-mode writer and
			// every sealing round before it has committed, and those after
			// it wait for this commit (see the package doc's # Backfill).
			var gen, h int64
			var captured bool
			if err := tx.QueryRow(r.ctx, r.st.lock, f).Scan(&gen, &h, &captured); err != nil {
				return r.fail("taking the feed lock", err)
			}
			if !captured {
				return feed.Invalid("options.feed", "names feed %s, whose capture was removed while the backfill ran", f)
			}
			var err error
			n, last, err = r.batch(tx, sh, int64(r.opts.BatchSize), false, 0)
			if err != nil {
				return err
			}
			generation, head = feed.Generation(gen), feed.Seq(h+n)
			if n < int64(r.opts.BatchSize) {
				finished = true
				return r.finishShare(tx, sh)
			}
			return nil
		})
		if err != nil {
			return r.batchFailed(err)
		}
		r.committed(sh, n, last, generation, head)
		sh.done = finished
	}
	return nil
}

// finishShare records in q (a batch's transaction, or a connection) that
// sh is copied.
func (r *inPlaceRun) finishShare(q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sh *backfillShare) error {
	if _, err := q.Exec(r.ctx, `UPDATE `+r.s.names.table("backfill_shares")+` SET finished_at = clock_timestamp(), updated_at = clock_timestamp() WHERE feed = $1::text AND share = $2::int`,
		string(r.opts.Feed), sh.n); err != nil {
		return r.fail("recording the backfill", err)
	}
	return nil
}

// batchFailed is the error of a batch that failed with err: as it is when
// it is already one of Backfill's, a write failure otherwise.
func (r *inPlaceRun) batchFailed(err error) error {
	var failed *feed.WriteFailedError
	var invalid *feed.InvalidError
	if errors.As(err, &failed) || errors.As(err, &invalid) {
		return err
	}
	return r.fail("copying a batch", err)
}

// parallel copies the shares not yet done at once, each batch in a
// transaction of its own connection, at seqs reserved for it. A batch:
//
//   - counts the rows it will copy, at most BatchSize, in a statement
//     before its transaction;
//   - takes the round lock shared (Store.roundKey), so that no sealing
//     round and no RetryParked hands out a seq until it commits, and
//     learns its transaction's id;
//   - has that many seqs reserved by the coordinator's connection, whose
//     statement takes the feed lock (the generations row, which locked-mode
//     writers and sealing rounds take), moves the head past them and enters
//     them in the reserved table with the batch's transaction, committed at
//     once;
//   - takes the table's lock and the write lock shared, as a locked batch
//     does, and checks the capture is still there;
//   - reads its rows, in a snapshot taken after the reservation: every
//     writer that held the feed lock before it is in the snapshot, and
//     every one after it writes above the reserved seqs;
//   - writes each row at its reserved seq, keeping a key's row that is
//     already at a higher seq (such a writer's), records its share's
//     position, deletes its reservation, notifies and commits.
//
// A writer's change therefore still wins over the copy of its row (see
// the package doc's # Backfill), and readers, which stop below the first
// seq of a reservation whose transaction is open (names.readable), never
// pass a batch's seqs before its rows are there. While a batch waits for
// its reservation it holds the round lock and nothing else: the
// coordinator may wait there for a writer that holds the feed lock, and a
// writer that went on to wait for a lock the batch held (an ALTER or a
// TRUNCATE of the table, in the same transaction) would close a cycle
// through this process that PostgreSQL could not see.
func (r *inPlaceRun) parallel(pool *pgxpool.Pool) error {
	f := string(r.opts.Feed)
	var todo []*backfillShare
	for _, sh := range r.shares {
		if !sh.done {
			todo = append(todo, sh)
		}
	}
	workers := min(len(todo), r.opts.Workers, int(pool.Config().MaxConns)-1)
	// Every connection is taken before any lock: captured writers that
	// wait for a lock a batch holds hold connections of their own, perhaps
	// of this pool (see backfillGeneration).
	conns := make([]*pgxpool.Conn, 0, workers+1)
	defer func() {
		for _, pc := range conns {
			pc.Release()
		}
	}()
	for range workers + 1 {
		pc, err := pool.Acquire(r.ctx)
		if err != nil {
			return r.fail("connecting the copy's workers", err)
		}
		conns = append(conns, pc)
	}
	coord := conns[0]
	// The generations row the reservations update, if the feed has none
	// yet; looked for first, since an insert that met the row would wait
	// for whichever writer holds it.
	if _, err := coord.Exec(r.ctx, `INSERT INTO `+r.s.names.generations+` (feed) SELECT $1::text
WHERE NOT EXISTS (SELECT FROM `+r.s.names.generations+` WHERE feed = $1::text) ON CONFLICT (feed) DO NOTHING`, f); err != nil {
		return r.fail("taking the feed lock", err)
	}
	if _, err := coord.Exec(r.ctx, r.st.sweepReserved, f, r.s.names.channel); err != nil {
		return r.fail("deleting the reservations of batches that ended", err)
	}
	var reserving sync.Mutex
	// reserve runs in READ COMMITTED whatever the session's default: in
	// REPEATABLE READ its update of the generations row would fail with
	// 40001 after waiting for a writer or a round that changed it.
	reserve := func(ctx context.Context, xid string, n int64) (gen, first int64, err error) {
		reserving.Lock()
		defer reserving.Unlock()
		err = pgx.BeginTxFunc(ctx, coord, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, r.st.reserve, f, n, xid).Scan(&gen, &first)
		})
		return gen, first, err
	}
	// ended deletes the reservation of a batch that failed and wakes the
	// feed's readers, which may have stopped below it; best effort (the
	// reservation holds no reader back once its transaction ended, and
	// readers poll).
	ended := func() {
		reserving.Lock()
		defer reserving.Unlock()
		_, _ = coord.Exec(context.WithoutCancel(r.ctx), r.st.sweepReserved, f, r.s.names.channel)
	}

	outer := r.ctx
	ctx, cancel := context.WithCancel(outer)
	defer cancel()
	r.ctx = ctx
	defer func() { r.ctx = outer }()
	queue := make(chan *backfillShare, len(todo))
	for _, sh := range todo {
		queue <- sh
	}
	close(queue)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, pc := range conns[1:] {
		wg.Go(func() {
			for sh := range queue {
				err := r.copyReserved(ctx, pc, sh, reserve, ended)
				if err == nil {
					continue
				}
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel()
				return
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if _, err := coord.Exec(outer, r.st.sweepReserved, f, r.s.names.channel); err != nil {
		r.s.logger.Warn("pgfeed: deleting the reservations of a backfill's batches; the next backfill deletes them", "feed", f, "error", err)
	}
	return nil
}

// copyReserved copies sh on pc, one reserved batch a transaction (see
// parallel); ended is told of each batch that failed after its seqs may
// have been reserved.
func (r *inPlaceRun) copyReserved(ctx context.Context, pc *pgxpool.Conn, sh *backfillShare,
	reserve func(context.Context, string, int64) (int64, int64, error), ended func()) error {
	f := string(r.opts.Feed)
	// A batch's rows wait for a writer's uncommitted row of the same key,
	// and a writer that goes on to write a key the batch copied waits for
	// the batch: PostgreSQL rolls one of the two back. When it is the
	// batch, nothing of it stands (its reservation ends with it), and the
	// batch is copied again from its share's position, now after the
	// writer, whose row it keeps.
	retries := 0
	for !sh.done {
		k, at := sh.kindOf(true)
		// The count in a statement of its own, before the batch's
		// transaction: while it waits for its reservation, a batch holds
		// nothing but the round lock (see parallel). The batch copies at
		// most that many rows, so its reservation is exact but for rows
		// deleted meanwhile; rows inserted meanwhile are a captured
		// writer's, in the feed already. Only a count of 0 ends the share.
		var count int64
		var ignored [2]bool
		if err := pc.QueryRow(ctx, r.s.countBatch(r.c, k), int64(r.opts.BatchSize), at, sh.upto).Scan(&count, &ignored[0], &ignored[1]); err != nil {
			return r.fail("counting a batch", err)
		}
		if count == 0 {
			if err := r.finishShare(pc, sh); err != nil {
				return err
			}
			r.committed(sh, 0, nil, 0, 0)
			sh.done = true
			break
		}
		var n int64
		var last []string
		var generation feed.Generation
		err := pgx.BeginTxFunc(ctx, pc, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			// The round lock shared, before the seqs are reserved (see
			// Store.roundKey), and the transaction's id for the reservation.
			var xid string
			var captured bool
			if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text, EXISTS (SELECT FROM `+r.s.names.table("captures")+` WHERE feed = $1::text)
FROM (SELECT pg_advisory_xact_lock_shared($2::bigint)) AS l`, f, r.s.roundKey(r.opts.Feed)).Scan(&xid, &captured); err != nil {
				return r.fail("beginning a batch", err)
			}
			if !captured {
				return feed.Invalid("options.feed", "names feed %s, whose capture was removed while the backfill ran", f)
			}
			gen, first, err := reserve(ctx, xid, count)
			if err != nil {
				return r.fail("reserving a batch's seqs", err)
			}
			if r.s.afterReserve != nil {
				r.s.afterReserve(sh.n)
			}
			if err := r.lockBatch(tx); err != nil {
				return err
			}
			// Uncapture takes the table's lock and the write lock
			// exclusive: under both, the capture is there or gone for good.
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+r.s.names.table("captures")+` WHERE feed = $1::text)`, f).Scan(&captured); err != nil {
				return r.fail("beginning a batch", err)
			}
			if !captured {
				return feed.Invalid("options.feed", "names feed %s, whose capture was removed while the backfill ran", f)
			}
			n, last, err = r.batch(tx, sh, count, true, first)
			generation = feed.Generation(gen)
			return err
		})
		if err != nil {
			ended()
			if isDeadlock(err) && retries < maxBatchRetries && ctx.Err() == nil {
				retries++
				r.s.logger.Info("pgfeed: a backfill batch was rolled back to end a deadlock with a writer; copying it again",
					"feed", f, "share", sh.n, "retry", retries)
				continue
			}
			return r.batchFailed(err)
		}
		retries = 0
		r.committed(sh, n, last, generation, 0)
	}
	return nil
}

// maxBatchRetries is how many times in a row a reserved batch that
// PostgreSQL rolled back to end a deadlock is copied again before the
// backfill fails (see inPlaceRun.copyReserved).
const maxBatchRetries = 5

// isDeadlock says err is PostgreSQL's deadlock_detected.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// finish records that every share is copied, and the run's rows.
func (r *inPlaceRun) finish() error {
	_, err := r.s.db.Exec(r.ctx, `UPDATE `+r.s.names.table("backfills")+` SET position = NULL,
	rows = (SELECT coalesce(sum(rows), 0) FROM `+r.s.names.table("backfill_shares")+` WHERE feed = $1::text),
	updated_at = clock_timestamp(), finished_at = clock_timestamp()
WHERE feed = $1::text AND finished_at IS NULL`, string(r.opts.Feed))
	if err != nil {
		return r.fail("recording the backfill", err)
	}
	return nil
}
