package pgfeed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
)

// Defaults of BackfillOptions.
const (
	// DefaultBackfillBatch is how many rows one backfill batch copies. A
	// batch on one connection holds the feed lock while it reads and
	// writes, so captured writers of the table in the locked mode (in the
	// concurrent mode, the sealer's rounds, not the writers) wait at most
	// one batch (5000 rows took 0.1–0.3 s on the 2-core machine of
	// BENCHMARKS.md); batches copied from several connections hold it only
	// to reserve their seqs, and rounds wait for the batches under way.
	// Smaller batches wait less and copy slower, since each costs a commit
	// and a few round trips (1000-row batches copied about a quarter fewer
	// rows a second).
	DefaultBackfillBatch = 5000
	// DefaultBackfillLogEvery is how often the default progress report
	// logs.
	DefaultBackfillLogEvery = 10 * time.Second
)

// BackfillOptions say which captured feed to fill from its table, and how.
type BackfillOptions struct {
	// Feed is a captured feed (see Capture); the backfill copies its table
	// with the capture's own key and document. Required.
	Feed feed.FeedName
	// BatchSize is how many rows a batch copies. Must not be negative.
	// Defaults to DefaultBackfillBatch.
	BatchSize int
	// NewGeneration copies the table into a new generation of the feed
	// instead of in place: every sink fills a fresh copy and publishes it,
	// and keys no longer in the table are gone from every sink. The copy
	// holds the feed lock (in the concurrent mode, the feed's write lock
	// exclusive) until the generation moves, so captured writers wait for
	// it, and it is not resumable: a crash leaves the feed as it was (see
	// the package doc's # Backfill). Defaults to false: in place, batch by
	// batch, resumable.
	NewGeneration bool
	// Workers is how many connections copy at once, when the store's DBTX
	// is a *pgxpool.Pool: a new generation's shares of the table (one more
	// connection is kept for the transaction that moves the generation), or
	// an in-place backfill's (one more reserves the batches' seqs), so at
	// most the pool's MaxConns less one copy. An in-place run splits the
	// table into this many shares when it starts, and a run that resumes
	// keeps its shares. Must not be negative. Defaults to
	// DefaultBackfillWorkers. On another DBTX, a new generation is copied in
	// the one transaction that moves it, and an in-place backfill one batch
	// at a time.
	Workers int
	// Progress is called after every batch, and once at the end with Done
	// set. Defaults to an Info log line through the store's Logger at most
	// every DefaultBackfillLogEvery, and at the end.
	Progress func(BackfillProgress)
}

// BackfillProgress is a backfill's progress after a batch.
type BackfillProgress struct {
	Feed feed.FeedName
	// Rows is how many rows are copied, by this run and the runs it
	// resumed.
	Rows int64
	// Total is the table's row count when the run started (the planner's
	// estimate when it has one), 0 when unknown.
	Total int64
	// Rate is this run's rows per second.
	Rate float64
	// ETA is the time left at Rate, 0 when unknown.
	ETA time.Duration
	// Resumed says this run continued an earlier one that stopped.
	Resumed bool
	// Done says the table is copied.
	Done bool
}

// BackfillResult says what a backfill did.
type BackfillResult struct {
	// Rows is how many rows are copied, resumed runs included.
	Rows int64
	// Resumed says the run continued an earlier one.
	Resumed bool
	// Generation is the feed's generation when the run ended.
	Generation feed.Generation
	// Head is the feed's head after the last batch.
	Head feed.Seq
}

// backfillSQL are a backfill's statements for one capture.
type backfillSQL struct {
	// table is c.lockTable().
	table string
	// share takes the feed's write lock shared (as a concurrent writer
	// does), so neither a switch of the write mode nor a reset, nor
	// Uncapture, each of which takes it exclusive, runs under a batch.
	share string
	// head reads the feed's head.
	head string
	// lock takes the feed lock, the generations row that locked-mode
	// writers and sealing rounds take (creating it if need be), and
	// returns the generation, the head, and whether the feed still has a
	// capture.
	lock string
	// reserve hands $2 seqs of feed $1 to the batch whose transaction is
	// $3 (see inPlaceRun.parallel): it takes the feed lock, moves the head
	// past them, enters them in the reserved table, and returns the
	// generation and the first of them. sweepReserved deletes the
	// reservations of feed $1 whose batches ended, and notifies on channel
	// $2: readers may have stopped below one.
	reserve, sweepReserved string
	// firstFresh and nextFresh copy a batch of a backfill as a new
	// generation from the start or after the position $5 ($1 the feed, $2
	// the batch size, $3 the channel, $4 the write lock's key), in either
	// mode: the reset emptied the feed and holds
	// every writer back, and a capture's keys are unique in its table, so
	// each batch inserts its rows with their seqs, no upsert. A batch
	// holding a row the feed refuses hands those rows to the write
	// function, which refuses them with its own error before it writes
	// anything, and the statement fails.
	firstFresh, nextFresh string
}

// lockTable takes the lock a reader takes on c's table (ACCESS SHARE, on
// every partition too). A backfill takes it before any lock of the feed:
// a writer takes its table's lock before its trigger takes the feed's, and
// so do TRUNCATE and Uncapture, so a backfill that held the feed's lock and
// then waited for the table could deadlock with them.
func (c *capture) lockTable() string {
	return `LOCK TABLE ` + c.table + ` IN ACCESS SHARE MODE`
}

// keyParts are the pieces of SQL a keyset copy of c's table is written
// with: the key columns of row r selected as o1, o2, … (cols), ordered in
// CTE b (order), read back as text (pos), and as a row value of r (tuple).
func keyParts(c *capture) (cols, order, pos, tuple []string) {
	for i, k := range c.key {
		q := "r." + quoteIdent(k.name)
		cols = append(cols, fmt.Sprintf("%s AS o%d", q, i+1))
		order = append(order, fmt.Sprintf("b.o%d", i+1))
		pos = append(pos, fmt.Sprintf("(b.o%d)::text", i+1))
		tuple = append(tuple, q)
	}
	return cols, order, pos, tuple
}

// positionAt is the row value of the position given as parameter p (the
// key's columns as text, in key order), each cast back to its column's
// type.
func positionAt(c *capture, p string) string {
	var at []string
	for i, k := range c.key {
		at = append(at, fmt.Sprintf("(%s::text[])[%d]::%s", p, i+1, k.typ))
	}
	return "(" + strings.Join(at, ", ") + ")"
}

// batchRead is the head of every backfill batch's statement, its last
// CTE left open for the batch's own to follow: b, up to limit rows of c's
// table in key order from where (batchKind.where), with their key and
// document; n, how many and the last one's key columns as text; and x,
// which hands the rows the feed refuses to the write function (feed,
// channel and key the parameters of its feed, channel and write lock key),
// which refuses them with its own error before anything is written, so the
// statement fails.
func (s *Store) batchRead(c *capture, where, limit, feedP, channel, key string) string {
	cols, order, pos, tuple := keyParts(c)
	return `WITH b AS MATERIALIZED (
	SELECT ` + c.keyExpr + ` AS key, ` + c.docExpr + ` AS doc, ` + strings.Join(cols, ", ") + `
	FROM ` + c.table + ` AS r` + where + `
	ORDER BY ` + strings.Join(tuple, ", ") + `
	LIMIT ` + limit + `::bigint
), n AS (
	SELECT count(*) AS rows, (SELECT ARRAY[` + strings.Join(pos, ", ") + `] FROM b ORDER BY ` + strings.Join(order, " DESC, ") + ` DESC LIMIT 1) AS last FROM b
), x AS (
	SELECT ` + s.names.table("write") + `(` + feedP + `::text, array_agg(b.key), array_agg(b.doc), ` + channel + `::text, ` + key + `::bigint) AS refused
	FROM b WHERE b.key IS NULL OR b.key = '' OR octet_length(b.key) > 512 OR b.doc = 'null'::jsonb
	HAVING count(*) > 0`
}

func (s *Store) backfillStatements(c *capture) backfillSQL {
	g := s.names.generations
	// after is the WHERE that starts a batch after the position $5 (the
	// last key's columns as text).
	after := batchKind{after: true}.where(c, "$5", "")
	fresh := func(where string) string {
		return s.batchRead(c, where, "$2", "$1", "$3", "$4") + `), g AS (
	UPDATE ` + s.names.generations + ` AS g SET head = g.head + n.rows FROM n WHERE g.feed = $1::text AND n.rows > 0
	RETURNING g.head, coalesce(g.store, g.feed) AS store
), w AS (
	INSERT INTO ` + s.names.rows + ` (feed, key, seq, doc, deleted_at)
	SELECT g.store, o.key, g.head - n.rows + o.ord, o.doc, CASE WHEN o.doc IS NULL THEN now() END
	FROM (SELECT b.key, b.doc, row_number() OVER () AS ord FROM b) AS o, g, n
), p AS (
	UPDATE ` + s.names.table("backfills") + ` AS f SET position = coalesce(n.last, f.position), rows = f.rows + n.rows,
		updated_at = clock_timestamp(), finished_at = CASE WHEN n.rows < $2::bigint THEN clock_timestamp() END
	FROM n WHERE f.feed = $1::text
	RETURNING f.rows
)
SELECT n.rows, (SELECT head FROM g), (SELECT rows FROM p), n.last, (SELECT refused FROM x) FROM n`
	}
	return backfillSQL{
		firstFresh: fresh(""),
		nextFresh:  fresh(after),
		lock: `INSERT INTO ` + g + ` AS g (feed) VALUES ($1::text)
ON CONFLICT (feed) DO UPDATE SET head = g.head
RETURNING g.generation, g.head, EXISTS (SELECT FROM ` + s.names.table("captures") + ` WHERE feed = $1::text)`,
		table: c.lockTable(),
		share: `SELECT pg_advisory_xact_lock_shared($1::bigint)`,
		head:  `SELECT coalesce(max(head), 0) FROM ` + g + ` WHERE feed = $1::text`,
		reserve: `WITH g AS (
	UPDATE ` + g + ` AS g SET head = g.head + $2::bigint WHERE g.feed = $1::text
	RETURNING g.generation, g.head
), v AS (
	INSERT INTO ` + s.names.table("reserved") + ` (feed, first_seq, last_seq, xid)
	SELECT $1::text, g.head - $2::bigint + 1, g.head, $3::text::xid8 FROM g
)
SELECT g.generation, g.head - $2::bigint + 1 FROM g`,
		sweepReserved: `WITH d AS (
	DELETE FROM ` + s.names.table("reserved") + ` WHERE feed = $1::text AND pg_visible_in_snapshot(xid, pg_current_snapshot())
)
SELECT pg_notify($2::text, $1::text)`,
	}
}

// Backfill copies every row of a captured feed's table into the feed, in
// batches in the order of the capture's key, while the table's writers go
// on; see the package doc's # Backfill for why a writer's change always
// wins over the copy of the same row. In place (the default), each batch
// commits with its share's position, and a backfill that stopped (a crash,
// ctx cancelled) resumes there when run again; one that finished starts
// over.
// With NewGeneration the copy is one transaction that moves the feed to a
// new generation. It returns when the table is copied, or with ctx's error
// (the batch in flight rolled back).
func (s *Store) Backfill(ctx context.Context, opts BackfillOptions) (BackfillResult, error) {
	if err := opts.Feed.Validate(); err != nil {
		return BackfillResult{}, feed.Invalid("options.feed", "%v", err)
	}
	switch {
	case opts.BatchSize < 0:
		return BackfillResult{}, feed.Invalid("options.batch_size", "is %d; it must not be negative", opts.BatchSize)
	case opts.BatchSize == 0:
		opts.BatchSize = DefaultBackfillBatch
	}
	switch {
	case opts.Workers < 0:
		return BackfillResult{}, feed.Invalid("options.workers", "is %d; it must not be negative", opts.Workers)
	case opts.Workers == 0:
		opts.Workers = DefaultBackfillWorkers
	}
	progress := opts.Progress
	if progress == nil {
		var last time.Time
		progress = func(p BackfillProgress) {
			if !p.Done && time.Since(last) < DefaultBackfillLogEvery {
				return
			}
			last = time.Now()
			s.logger.Info("pgfeed: backfill", "feed", string(p.Feed), "rows", p.Rows, "total", p.Total,
				"rate", fmt.Sprintf("%.0f/s", p.Rate), "eta", p.ETA.Round(time.Second), "done", p.Done)
		}
	}

	c, total, err := s.installedCapture(ctx, opts.Feed)
	if err != nil {
		return BackfillResult{}, err
	}
	st := s.backfillStatements(c)
	f := string(opts.Feed)
	bf := s.names.table("backfills")
	fail := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("backfill of feed %s: %s: %w", f, what, ctx.Err())
		}
		return feed.WriteFailed("backfill of feed "+f+": "+what, err)
	}

	var (
		res      BackfillResult
		position []string
		began    = time.Now()
		copied   int64 // by this run
	)
	report := func(done bool) {
		p := BackfillProgress{Feed: opts.Feed, Rows: res.Rows, Total: total, Resumed: res.Resumed, Done: done}
		if secs := time.Since(began).Seconds(); secs > 0 {
			p.Rate = float64(copied) / secs
		}
		if p.Rate > 0 && total > res.Rows && !done {
			p.ETA = time.Duration(float64(total-res.Rows) / p.Rate * float64(time.Second))
		}
		progress(p)
	}
	// batch runs one batch of a new generation in tx, which holds the feed
	// lock, and says whether the table is copied.
	key := s.writeKey(opts.Feed)
	batch := func(tx pgx.Tx) (bool, error) {
		q, args := st.firstFresh, []any{f, int64(opts.BatchSize), s.names.channel, key}
		if position != nil {
			q, args = st.nextFresh, append(args, position)
		}
		var n int64
		var head, rows *int64
		var last []string
		var refused *int64
		if err := tx.QueryRow(ctx, q, args...).Scan(&n, &head, &rows, &last, &refused); err != nil {
			return false, fail("copying a batch", err)
		}
		if refused != nil {
			// write refuses every row handed to it for refusal; one that
			// returned means the two filters differ.
			return false, fail("copying a batch", errors.New("the write function took a row the backfill held for refused"))
		}
		if n > 0 {
			position = last
		}
		if head != nil {
			res.Head = feed.Seq(*head)
		}
		if rows != nil {
			res.Rows = *rows
		}
		copied += n
		return n < int64(opts.BatchSize), nil
	}
	// Batches run in READ COMMITTED whatever the session's default, so
	// that each statement reads a snapshot of its own start: the one after
	// the feed lock must see every writer the lock waited for. A failure
	// to begin or commit one is a write failure like any other of its
	// statements.
	readCommitted := func(fn func(pgx.Tx) error) error {
		err := s.readCommitted(ctx, fn)
		var failed *feed.WriteFailedError
		var invalid *feed.InvalidError
		if err != nil && ctx.Err() == nil && !errors.As(err, &failed) && !errors.As(err, &invalid) {
			return fail("running a batch's transaction", err)
		}
		return err
	}

	if pool, ok := s.db.(*pgxpool.Pool); ok && opts.NewGeneration {
		done, err := s.backfillGeneration(ctx, pool, opts, c, fail, func(rows, t int64) {
			res.Rows, copied, total = rows, rows, t
			report(false)
		})
		if err != nil {
			return BackfillResult{}, err
		}
		res = done
		report(true)
		return res, nil
	}
	if opts.NewGeneration {
		err := readCommitted(func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, st.table); err != nil {
				return fail("locking table "+c.table, err)
			}
			var gen int64
			if err := tx.QueryRow(ctx, `SELECT `+s.names.table("reset")+`($1::text, $2::text, $3::bigint)`, f, s.names.channel, key).Scan(&gen); err != nil {
				return fail("moving to a new generation", err)
			}
			res.Generation = feed.Generation(gen)
			if _, err := tx.Exec(ctx, `INSERT INTO `+bf+` AS b (feed, version) VALUES ($1::text, $2::text)
ON CONFLICT (feed) DO UPDATE SET version = excluded.version, position = NULL, rows = 0,
	started_at = clock_timestamp(), updated_at = clock_timestamp(), finished_at = NULL`, f, c.version); err != nil {
				return fail("recording the backfill", err)
			}
			// The reset holds the write lock exclusive and the feed's
			// generations row to the commit, so every captured writer's
			// feed write, and every sealing round, lands after the copy, in
			// either mode; the copy is written sealed, seqs and all, as the
			// locked mode writes, so the new generation commits whole and
			// every sink publishes it complete. No row is read FOR SHARE (a
			// writer that changed a row and waits for the lock in its
			// trigger would deadlock with a read that waits for its row).
			for {
				done, err := batch(tx)
				if err != nil {
					return err
				}
				report(false)
				if done {
					break
				}
			}
			var h int64
			if err := tx.QueryRow(ctx, st.head, f).Scan(&h); err != nil {
				return fail("reading the head", err)
			}
			res.Head = feed.Seq(h)
			return nil
		})
		if err != nil {
			return BackfillResult{}, err
		}
		report(true)
		return res, nil
	}

	// In place: resume an unfinished run of the same capture version, or
	// start one, split into a share for each connection that copies.
	workers := 1
	pool, onPool := s.db.(*pgxpool.Pool)
	if onPool {
		workers = max(1, min(opts.Workers, int(pool.Config().MaxConns)-1))
	}
	shares, resumed, err := s.startInPlace(ctx, opts, c, total, workers, fail)
	if err != nil {
		return BackfillResult{}, err
	}
	r := &inPlaceRun{s: s, ctx: ctx, opts: opts, c: c, st: st, fail: fail, shares: shares}
	r.res.Resumed = resumed
	unfinished := 0
	for _, sh := range shares {
		r.res.Rows += sh.rows
		if !sh.done {
			unfinished++
		}
	}
	r.report = func(done bool) {
		res, copied = r.res, r.copied
		report(done)
	}
	if onPool && workers > 1 && unfinished > 1 {
		err = r.parallel(pool)
	} else {
		for _, sh := range shares {
			if err = r.locked(sh); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = r.finish()
	}
	if err != nil {
		return r.res, err
	}
	if r.res.Generation, err = s.Generation(ctx, opts.Feed); err == nil {
		r.res.Head, err = s.Head(ctx, opts.Feed)
	}
	if err != nil {
		return r.res, err
	}
	res = r.res
	report(true)
	return res, nil
}

// installedCapture is f's capture as installed, resolved again (its spec
// must still give the SQL installed, or the backfill would copy rows in
// another shape than the trigger writes them), and the table's row count,
// the planner's estimate when it has one.
func (s *Store) installedCapture(ctx context.Context, f feed.FeedName) (*capture, int64, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, 0, feed.Unreadable("reading the capture of feed "+string(f), err)
	}
	// Read only; the search_path resolveCapture sets goes with the rollback.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var spec CaptureSpec
	var version string
	err = tx.QueryRow(ctx, `SELECT spec, version FROM `+s.names.table("captures")+` WHERE feed = $1::text`, string(f)).Scan(&spec, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, feed.Invalid("options.feed", "names feed %s, which captures no table; run Capture first", f)
	}
	if err != nil {
		return nil, 0, feed.Unreadable("reading the capture of feed "+string(f), err)
	}
	c, err := s.resolveCapture(ctx, tx, spec)
	if err != nil {
		return nil, 0, err
	}
	// A table without the triggers would change under the copy with no
	// feed write to win over it, and one that still carries them writes
	// rows the copy does not have.
	if len(c.uncovered) > 0 {
		return nil, 0, feed.Invalid("options.feed", "names feed %s, whose capture of table %s does not cover %s (a partition created or attached since, or a capture trigger dropped or disabled): its writes would not reach the feed; run Capture again", f, c.table, strings.Join(c.uncovered, ", "))
	}
	if len(c.stray) > 0 {
		return nil, 0, feed.Invalid("options.feed", "names feed %s, whose capture triggers are still on %s, no longer table %s or under it (a partition detached since): its writes would reach the feed; run Capture again", f, strings.Join(c.stray, ", "), c.table)
	}
	if c.version != version {
		return nil, 0, feed.Invalid("options.feed", "names feed %s, whose capture of table %s was installed at version %s, and the table now gives version %s; run Capture again", f, c.table, version, c.version)
	}
	var total *int64
	err = tx.QueryRow(ctx, `SELECT CASE WHEN reltuples > 0 THEN reltuples::bigint END FROM pg_catalog.pg_class WHERE oid = $1::oid`, c.relid).Scan(&total)
	if err == nil && total == nil {
		err = tx.QueryRow(ctx, `SELECT count(*) FROM `+c.table).Scan(&total)
	}
	if err != nil {
		return nil, 0, feed.Unreadable("counting the rows of "+c.table, err)
	}
	return c, *total, nil
}
