package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// measureCapture is group K, table capture (issue 14): what the capture
// trigger costs plain-SQL writers, and the backfill's rate.
//
//   - K update: one UPDATE of CaptureRows rows of a captured table against
//     the same UPDATE of an identical table without the trigger, in the same
//     schema, the two taking turns statement by statement; milliseconds per
//     statement, each side's median over CaptureUpdates statements.
//   - K update floor: the captured UPDATE against the same UPDATE plus the
//     same rows upserted raw into a table built like the feed's, in one
//     transaction: the trigger's own overhead above the write it must do.
//   - K update unchanged: the same UPDATE of a table captured with the
//     updated column left out of the document, against the UPDATE without
//     the trigger: an UPDATE that changes no document writes no feed row,
//     so this is the trigger's cost without the feed write.
//   - K update concurrent: the same UPDATE of a table captured into a feed
//     in the concurrent write mode, against the same bare UPDATE: the
//     trigger records the statement's keys, and no sealer runs while it
//     is timed.
//   - K update concurrent sealed: the same, timed until the sealer's
//     rounds (run one after the other right after the UPDATE, as a caught
//     up sealer would) have sealed it: the whole cost of the write, the
//     documents the sealer reads from the table included.
//   - K writers: Writers concurrent writers commit single-row upserts into
//     a captured table, against the same into a table without the trigger,
//     for WritersFor each, one after the other; commits per second. The
//     trigger writes in the feed's locked mode, so the captured writers
//     serialise on the feed lock from their write to their commit.
//   - K writers concurrent: the same, the captured table's feed in the
//     concurrent write mode with its sealer running beside the writers (so
//     the figure pays for sealing too); the baseline is measured again in
//     the same way, right beside it.
//   - K backfill: an in-place Backfill of a BackfillRows-row table, copied
//     from DefaultBackfillWorkers connections at once (each a share of the
//     table, at seqs reserved for each batch), against a raw keyset scan of
//     the same table that reads each row's key and to_jsonb document to the
//     client in batches of the same size; rows per second.
//   - K backfill floor: the same rows copied by plain INSERT … SELECT, one
//     keyset batch of the same size per transaction, into a table built
//     like the feed's rows (its two unique indexes), against the same scan:
//     what any copy of the table into the feed's shape reaches at best.
//   - K backfill concurrent: the same in-place Backfill into a second feed
//     in the concurrent write mode, its sealer running beside it, timed
//     until every copied row is sealed, against the same scan.
//   - K backfill new generation: the Backfill of the same table as a new
//     generation of the first feed (the table-shaped rebuild: one
//     transaction, plain inserts of sealed rows), against the same scan.
//   - K backfill rebuild: the same, while the feed holds the whole table
//     already (the reset deletes every row before the copy writes them
//     again), as a rebuild of a mirrored table finds it; the row above
//     starts from an empty feed.
//   - K backfill again: the in-place Backfill of the first feed while it
//     holds every key already (an untimed in-place backfill fills it
//     first), as a second backfill finds it: each batch's plain insert
//     meets a key the feed holds, and the batch upserts instead.
//   - K backfill floor parallel: the floor's copy split by id between two
//     connections running at once. One backend's copy into the feed's
//     shape cannot reach the target; this row says what a copy shared by
//     backends reaches on the same machine, the figure a redesign of the
//     rebuild would be judged by.
func (e *env) measureCapture(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, int32(sz.Writers)+2, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	var upd, updBase, updFloor, updSame, updSameBase, updC, updCSealed, wr, wrBase, wc, wcBase, bf, bfBase, bfFloor, bfFloor2, bfc, bfg, bfRebuild, bfAgain []float64
	for r := range sz.Runs {
		if err := func() error {
			s, err := e.newSchema(ctx, admin)
			if err != nil {
				return err
			}
			defer s.drop()
			st, err := s.store(ctx, admin)
			if err != nil {
				return err
			}
			defer st.Close()
			u, err := e.captureUpdate(ctx, admin, s, st, r)
			if err != nil {
				return err
			}
			upd, updBase, updFloor = append(upd, u.captured), append(updBase, u.raw), append(updFloor, u.floor)
			updSame, updSameBase = append(updSame, u.unchanged), append(updSameBase, u.raw)
			updC, updCSealed = append(updC, u.concurrent), append(updCSealed, u.sealed)
			a, b, err := e.captureWriters(ctx, admin, s, st, r, feed.WriteLocked)
			if err != nil {
				return err
			}
			wr, wrBase = append(wr, a), append(wrBase, b)
			a, b, err = e.captureWriters(ctx, admin, s, st, r, feed.WriteConcurrent)
			if err != nil {
				return err
			}
			wc, wcBase = append(wc, a), append(wcBase, b)
			k, err := e.captureBackfill(ctx, admin, s, st, r)
			if err != nil {
				return err
			}
			bf, bfBase, bfFloor, bfc, bfg = append(bf, k.locked), append(bfBase, k.scan), append(bfFloor, k.floor), append(bfc, k.concurrent), append(bfg, k.fresh)
			bfFloor2, bfRebuild, bfAgain = append(bfFloor2, k.floorParallel), append(bfRebuild, k.rebuild), append(bfAgain, k.again)
			return nil
		}(); err != nil {
			return nil, err
		}
	}
	return []Row{
		newRow("K update", fmt.Sprintf("one UPDATE of %d rows of a captured table (the trigger writes %d feed rows); baseline: the same UPDATE without the trigger", sz.CaptureRows, sz.CaptureRows),
			"ms", upd, updBase, "figure/baseline", div, "≤ 1.5×", func(_, r float64) bool { return r <= 1.5 }),
		newRow("K update floor", "the same captured UPDATE; baseline: the same UPDATE and, in its transaction, the same rows upserted into a table like the feed's by one statement (what any feed write costs at least)",
			"ms", upd, updFloor, "figure/baseline", div, "", nil),
		newRow("K update unchanged", fmt.Sprintf("one UPDATE of %d rows of a captured table, of a column the document leaves out (no feed write); baseline: the same UPDATE without the trigger", sz.CaptureRows),
			"ms", updSame, updSameBase, "figure/baseline", div, "", nil),
		newRow("K update concurrent", fmt.Sprintf("one UPDATE of %d rows of a table captured in the concurrent write mode (the trigger records the keys); baseline: the same UPDATE without the trigger", sz.CaptureRows),
			"ms", updC, updBase, "figure/baseline", div, "≤ 1.5×", func(_, r float64) bool { return r <= 1.5 }),
		newRow("K update concurrent sealed", "the same, timed until the sealer has sealed every row it changed (the documents read from the table); baseline: the same UPDATE without the trigger",
			"ms", updCSealed, updBase, "figure/baseline", div, "", nil),
		newRow("K writers", fmt.Sprintf("%d concurrent writers, single-row upserts into a captured table (locked mode), commit rate; baseline: the same without the trigger", sz.Writers),
			"commits/s", wr, wrBase, "figure/baseline", div, "", nil),
		newRow("K writers concurrent", fmt.Sprintf("%d concurrent writers, single-row upserts into a captured table (concurrent mode, its sealer running), commit rate; baseline: the same without the trigger", sz.Writers),
			"commits/s", wc, wcBase, "figure/baseline", div, "≥ 0.5×", func(_, r float64) bool { return r >= 0.5 }),
		newRow("K backfill", fmt.Sprintf("in-place backfill of a %d-row table from %d connections, batches of %d; baseline: a raw keyset scan of the table reading each row's key and to_jsonb", sz.BackfillRows, pgfeed.DefaultBackfillWorkers, pgfeed.DefaultBackfillBatch),
			"rows/s", bf, bfBase, "figure/baseline", div, "≥ 0.5×", func(_, r float64) bool { return r >= 0.5 }),
		newRow("K backfill floor", fmt.Sprintf("the same rows copied by plain INSERT … SELECT, a keyset batch of %d per transaction, into a table like the feed's rows (no lock, no upsert, no progress); baseline: the same scan", pgfeed.DefaultBackfillBatch),
			"rows/s", bfFloor, bfBase, "figure/baseline", div, "", nil),
		newRow("K backfill concurrent", "in-place backfill of the same table into a feed in the concurrent write mode, its sealer running, timed until every row is sealed; baseline: the same scan",
			"rows/s", bfc, bfBase, "figure/baseline", div, "≥ 0.5×", func(_, r float64) bool { return r >= 0.5 }),
		newRow("K backfill new generation", "backfill of the same table as a new generation of the locked-mode feed (the table-shaped rebuild: two connections copy into rows stored apart, the generation moves in one transaction); baseline: the same scan",
			"rows/s", bfg, bfBase, "figure/baseline", div, "≥ 0.5×", func(_, r float64) bool { return r >= 0.5 }),
		newRow("K backfill rebuild", "the same new-generation backfill of the feed while it holds the whole table already (the reset deletes its rows first), as a rebuild finds it; baseline: the same scan",
			"rows/s", bfRebuild, bfBase, "figure/baseline", div, "", nil),
		newRow("K backfill again", "the in-place backfill of the locked-mode feed while it holds every key already, as a second backfill finds it (each batch's plain insert fails, and it upserts); baseline: the same scan",
			"rows/s", bfAgain, bfBase, "figure/baseline", div, "", nil),
		newRow("K backfill floor parallel", "the floor's copy shared by two connections at once, each copying half the ids (what a copy split across backends reaches on this machine); baseline: the same scan",
			"rows/s", bfFloor2, bfBase, "figure/baseline", div, "", nil),
	}, nil
}

// captureTables creates two identical tables of n rows, name_cap (captured
// into feed name) and name_raw.
func captureTables(ctx context.Context, admin *pgxpool.Pool, s *schema, st *pgfeed.Store, name string, n int) (capd, raw string, err error) {
	capd, raw = s.qualify(name+"_cap"), s.qualify(name+"_raw")
	for _, t := range []string{capd, raw} {
		if err := fillTable(ctx, admin, t, n); err != nil {
			return "", "", err
		}
		if _, err := admin.Exec(ctx, `VACUUM (ANALYZE) `+t); err != nil {
			return "", "", err
		}
	}
	_, err = st.Capture(ctx, pgfeed.CaptureSpec{Feed: feed.FeedName("k_" + name), Schema: s.name, Table: name + "_cap"})
	return capd, raw, err
}

// updateTimes are K update's sides, each the median of one run's statements.
type updateTimes struct{ captured, raw, floor, unchanged, concurrent, sealed float64 }

func (e *env) captureUpdate(ctx context.Context, admin *pgxpool.Pool, s *schema, st *pgfeed.Store, run int) (updateTimes, error) {
	sz := e.sizes
	capT, raw, err := captureTables(ctx, admin, s, st, "upd", sz.CaptureRows)
	if err != nil {
		return updateTimes{}, err
	}
	// The floor: the same UPDATE, and the same rows upserted into a table
	// built like the feed's, in one transaction; what any feed written in
	// the transaction must cost at least.
	fl, ff := s.qualify("upd_floor"), s.qualify("upd_floor_rows")
	if err := fillTable(ctx, admin, fl, sz.CaptureRows); err != nil {
		return updateTimes{}, err
	}
	if _, err := admin.Exec(ctx, `CREATE TABLE `+ff+` (LIKE `+s.table("rows")+` INCLUDING ALL)`); err != nil {
		return updateTimes{}, err
	}
	// Unchanged: a table whose capture leaves the updated column out.
	same := s.qualify("upd_same")
	if err := fillTable(ctx, admin, same, sz.CaptureRows); err != nil {
		return updateTimes{}, err
	}
	if _, err := admin.Exec(ctx, `VACUUM (ANALYZE) `+same); err != nil {
		return updateTimes{}, err
	}
	if _, err := st.Capture(ctx, pgfeed.CaptureSpec{Feed: "k_upd_same", Schema: s.name, Table: "upd_same", Exclude: []string{"n"}}); err != nil {
		return updateTimes{}, err
	}
	// Concurrent: a table captured into a feed in the concurrent mode,
	// sealed by rounds run right after each UPDATE.
	cc := s.qualify("upd_cc")
	if err := fillTable(ctx, admin, cc, sz.CaptureRows); err != nil {
		return updateTimes{}, err
	}
	if _, err := admin.Exec(ctx, `VACUUM (ANALYZE) `+cc); err != nil {
		return updateTimes{}, err
	}
	if err := st.SetWriteMode(ctx, "k_upd_cc", feed.WriteConcurrent); err != nil {
		return updateTimes{}, err
	}
	if _, err := st.Capture(ctx, pgfeed.CaptureSpec{Feed: "k_upd_cc", Schema: s.name, Table: "upd_cc"}); err != nil {
		return updateTimes{}, err
	}
	var sealed []float64
	seal := func(start time.Time) error {
		for {
			n, err := st.SealRound(ctx, "k_upd_cc")
			if err != nil {
				return err
			}
			if n == 0 {
				sealed = append(sealed, float64(time.Since(start).Nanoseconds())/1e6)
				return nil
			}
		}
	}
	var next int64
	sides := [5]func() error{
		func() error { _, err := admin.Exec(ctx, `UPDATE `+capT+` SET n = n + 1`); return err },
		func() error { _, err := admin.Exec(ctx, `UPDATE `+raw+` SET n = n + 1`); return err },
		func() error {
			next += int64(sz.CaptureRows)
			return pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE `+fl+` SET n = n + 1`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+ff+` AS f (feed, key, seq, doc)
SELECT 'k', r.id::text, $1::bigint + r.id, to_jsonb(r) FROM `+fl+` AS r
ON CONFLICT (feed, key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc`, next)
				return err
			})
		},
		func() error { _, err := admin.Exec(ctx, `UPDATE `+same+` SET n = n + 1`); return err },
		func() error { _, err := admin.Exec(ctx, `UPDATE `+cc+` SET n = n + 1`); return err },
	}
	var per [5][]float64
	for i := range sz.CaptureUpdates + 1 { // the first round is the warm-up
		for j := range 5 {
			k := (i + j + run) % 5
			start := time.Now()
			if err := sides[k](); err != nil {
				return updateTimes{}, err
			}
			if i > 0 {
				per[k] = append(per[k], float64(time.Since(start).Nanoseconds())/1e6)
			}
			if k == 4 {
				if err := seal(start); err != nil {
					return updateTimes{}, err
				}
				if i == 0 {
					sealed = sealed[:0]
				}
			}
		}
	}
	return updateTimes{summarize(per[0]).Median, summarize(per[1]).Median, summarize(per[2]).Median, summarize(per[3]).Median,
		summarize(per[4]).Median, summarize(sealed).Median}, nil
}

func (e *env) captureWriters(ctx context.Context, admin *pgxpool.Pool, s *schema, st *pgfeed.Store, run int, mode feed.WriteMode) (float64, float64, error) {
	sz := e.sizes
	name := "wr"
	if mode == feed.WriteConcurrent {
		name = "wrc"
	}
	capd, raw, err := captureTables(ctx, admin, s, st, name, 1)
	if err != nil {
		return 0, 0, err
	}
	if mode == feed.WriteConcurrent {
		f := feed.FeedName("k_" + name)
		if err := st.SetWriteMode(ctx, f, mode); err != nil {
			return 0, 0, err
		}
		sealCtx, stop := context.WithCancel(ctx)
		sealed := make(chan error, 1)
		go func() { sealed <- st.RunSealer(sealCtx, f) }()
		defer func() { stop(); <-sealed }()
	}
	rate := func(t string) (float64, error) {
		q := `INSERT INTO ` + t + ` (id, n, name, pad) VALUES ($1::int, 0, $2::text, 'x') ON CONFLICT (id) DO UPDATE SET n = ` + t + `.n + 1`
		var commits atomic.Int64
		var firstErr error
		var once sync.Once
		writeFor := func(d time.Duration, count bool) {
			var wg sync.WaitGroup
			stop := time.Now().Add(d)
			for w := range sz.Writers {
				wg.Go(func() {
					for i := 0; time.Now().Before(stop); i++ {
						id := w*10_000_000 + i%100_000
						if _, err := admin.Exec(ctx, q, id, fmt.Sprintf("item-%d", id)); err != nil {
							once.Do(func() { firstErr = err })
							return
						}
						if count {
							commits.Add(1)
						}
					}
				})
			}
			wg.Wait()
		}
		writeFor(sz.WritersFor/5, false)
		start := time.Now()
		writeFor(sz.WritersFor, true)
		if firstErr != nil {
			return 0, firstErr
		}
		return float64(commits.Load()) / time.Since(start).Seconds(), nil
	}
	tables := []string{capd, raw}
	var out [2]float64
	for j := range 2 {
		k := (j + run) % 2
		if out[k], err = rate(tables[k]); err != nil {
			return 0, 0, err
		}
	}
	return out[0], out[1], nil
}

// backfillRates are K backfill's sides, rows per second.
type backfillRates struct {
	locked, scan, floor, concurrent, fresh, floorParallel, rebuild, again float64
}

func (e *env) captureBackfill(ctx context.Context, admin *pgxpool.Pool, s *schema, st *pgfeed.Store, run int) (backfillRates, error) {
	sz := e.sizes
	batch := pgfeed.DefaultBackfillBatch
	t := s.qualify("bf")
	if err := fillTable(ctx, admin, t, sz.BackfillRows); err != nil {
		return backfillRates{}, err
	}
	if _, err := admin.Exec(ctx, `VACUUM (ANALYZE) `+t); err != nil {
		return backfillRates{}, err
	}
	// Two feeds capture the table, one in each write mode; a backfill only
	// reads the table, so neither's trigger fires.
	for _, f := range []feed.FeedName{"k_bf", "k_bfc"} {
		if _, err := st.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: s.name, Table: "bf"}); err != nil {
			return backfillRates{}, err
		}
	}
	if err := st.SetWriteMode(ctx, "k_bfc", feed.WriteConcurrent); err != nil {
		return backfillRates{}, err
	}
	floorT := s.qualify("bf_floor_rows")
	if _, err := admin.Exec(ctx, `CREATE TABLE `+floorT+` (LIKE `+s.table("rows")+` INCLUDING ALL)`); err != nil {
		return backfillRates{}, err
	}
	// checkpoint writes out what every side before dirtied, so that each
	// starts alike: a million-row copy writes about a gigabyte of WAL, and
	// a checkpoint that falls inside the next copy (every 5 minutes, or at
	// max_wal_size) has that copy write a full page image of each page it
	// touches first. (The in-place rows swung by twice and more before it
	// was added, 58k–134k rows/s in one invocation, and still did after:
	// this was not the cause; see BENCHMARKS.md.)
	checkpoint := func() error {
		_, err := admin.Exec(ctx, `CHECKPOINT`)
		return err
	}
	// empty leaves f with no rows, vacuumed, so each copy starts alike.
	empty := func(table, f string) error {
		if _, err := admin.Exec(ctx, `DELETE FROM `+table+` WHERE feed = $1::text`, f); err != nil {
			return err
		}
		if _, err := admin.Exec(ctx, `VACUUM `+table); err != nil {
			return err
		}
		return checkpoint()
	}
	// emptyFeed is empty for a feed's rows, which a new-generation
	// backfill moves under a store name of their own: deleting by the
	// feed's name alone left the last new generation's million rows in
	// place, and the next in-place backfill copied into a full feed.
	emptyFeed := func(f feed.FeedName) error {
		var store string
		if err := admin.QueryRow(ctx, `SELECT coalesce(max(coalesce(store, feed)), $1::text) FROM `+s.table("generations")+` WHERE feed = $1::text`, string(f)).Scan(&store); err != nil {
			return err
		}
		if err := empty(s.table("rows"), store); err != nil {
			return err
		}
		var left bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+s.table("rows")+` WHERE feed = $1::text)`, store).Scan(&left); err != nil {
			return err
		}
		if left {
			return fmt.Errorf("feed %s still has rows stored under %s after emptying it", f, store)
		}
		return nil
	}
	backfill := func(f feed.FeedName, fresh bool) (float64, error) {
		if err := emptyFeed(f); err != nil {
			return 0, err
		}
		var sealed chan error
		stop := func() {}
		if f == "k_bfc" {
			var sealCtx context.Context
			sealCtx, stop = context.WithCancel(ctx)
			sealed = make(chan error, 1)
			go func() { sealed <- st.RunSealer(sealCtx, f) }()
		}
		defer func() {
			stop()
			if sealed != nil {
				<-sealed
			}
		}()
		start := time.Now()
		// The longest wait between two batches' commits, logged below: a
		// copy whose rate falls says whether it fell everywhere or stalled.
		var last time.Time
		var longest time.Duration
		var longestAt int64
		res, err := st.Backfill(ctx, pgfeed.BackfillOptions{Feed: f, NewGeneration: fresh, Progress: func(p pgfeed.BackfillProgress) {
			now := time.Now()
			if d := now.Sub(last); !last.IsZero() && d > longest {
				longest, longestAt = d, p.Rows
			}
			last = now
		}})
		if err != nil {
			return 0, err
		}
		fmt.Fprintf(e.log, "bench: K backfill of %s (new generation %v): %d rows in %v, longest wait between batches %v (at row %d)\n",
			f, fresh, res.Rows, time.Since(start).Round(time.Millisecond), longest.Round(time.Millisecond), longestAt)
		for sealed != nil {
			var waiting bool
			if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+s.table("unsealed")+` WHERE feed = $1::text)
	OR EXISTS (SELECT FROM `+s.table("changes")+` WHERE feed = $1::text)`, string(f)).Scan(&waiting); err != nil {
				return 0, err
			}
			if !waiting {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		return float64(res.Rows) / time.Since(start).Seconds(), nil
	}
	scan := func() (float64, error) {
		if err := checkpoint(); err != nil {
			return 0, err
		}
		start := time.Now()
		var n int64
		after := int32(0)
		for {
			rows, err := admin.Query(ctx, `SELECT r.id, r.id::text, to_jsonb(r)::text FROM `+t+` AS r WHERE r.id > $1::int ORDER BY r.id LIMIT $2::int`, after, batch)
			if err != nil {
				return 0, err
			}
			got := 0
			var key, doc string
			for rows.Next() {
				if err := rows.Scan(&after, &key, &doc); err != nil {
					return 0, err
				}
				got++
			}
			if err := rows.Err(); err != nil {
				return 0, err
			}
			n += int64(got)
			if got < batch {
				break
			}
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}
	// copyRange copies the rows with ids in (after, upTo] into the floor
	// table, a keyset batch per statement, and says how many it copied.
	copyRange := func(after, upTo int32) (int64, error) {
		var n int64
		for {
			var got int64
			var last *int32
			err := admin.QueryRow(ctx, `WITH b AS MATERIALIZED (
	SELECT r.id, r.id::text AS key, to_jsonb(r) AS doc FROM `+t+` AS r WHERE r.id > $1::int AND r.id <= $3::int ORDER BY r.id LIMIT $2::int
), w AS (
	INSERT INTO `+floorT+` (feed, key, seq, doc) SELECT 'k', b.key, b.id, b.doc FROM b
)
SELECT count(*), max(b.id) FROM b`, after, batch, upTo).Scan(&got, &last)
			if err != nil {
				return 0, err
			}
			n += got
			if got < int64(batch) {
				return n, nil
			}
			after = *last
		}
	}
	floor := func() (float64, error) {
		if err := empty(floorT, "k"); err != nil {
			return 0, err
		}
		start := time.Now()
		n, err := copyRange(0, math.MaxInt32)
		if err != nil {
			return 0, err
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}
	// floorParallel is floor shared by two connections, each copying half
	// the ids at the same time.
	floorParallel := func() (float64, error) {
		if err := empty(floorT, "k"); err != nil {
			return 0, err
		}
		half := int32(sz.BackfillRows / 2)
		start := time.Now()
		var wg sync.WaitGroup
		var n [2]int64
		var errs [2]error
		for i, r := range [2][2]int32{{0, half}, {half, math.MaxInt32}} {
			wg.Go(func() { n[i], errs[i] = copyRange(r[0], r[1]) })
		}
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			return 0, err
		}
		return float64(n[0]+n[1]) / time.Since(start).Seconds(), nil
	}
	// refill times a backfill of the first feed, a new generation (fresh)
	// or in place, while it holds every key already: an untimed backfill
	// of the same kind fills it first. As a new generation it is a
	// rebuild, whose reset deletes every row before the copy writes them
	// again; in place, each batch's plain insert meets a key the feed
	// holds, and the batch upserts.
	refill := func(fresh bool) (float64, error) {
		if _, err := backfill("k_bf", fresh); err != nil {
			return 0, err
		}
		if _, err := admin.Exec(ctx, `VACUUM `+s.table("rows")); err != nil {
			return 0, err
		}
		if err := checkpoint(); err != nil {
			return 0, err
		}
		start := time.Now()
		res, err := st.Backfill(ctx, pgfeed.BackfillOptions{Feed: "k_bf", NewGeneration: fresh, Progress: func(pgfeed.BackfillProgress) {}})
		if err != nil {
			return 0, err
		}
		return float64(res.Rows) / time.Since(start).Seconds(), nil
	}
	// The order rotates from run to run.
	sides := [8]func() (float64, error){
		func() (float64, error) { return backfill("k_bf", false) },
		scan,
		floor,
		func() (float64, error) { return backfill("k_bfc", false) },
		func() (float64, error) { return backfill("k_bf", true) },
		floorParallel,
		func() (float64, error) { return refill(true) },
		func() (float64, error) { return refill(false) },
	}
	names := [8]string{"in place", "scan", "floor", "in place, concurrent mode", "new generation", "floor parallel", "rebuild", "in place again"}
	var out [8]float64
	for j := range len(sides) {
		k := (j + run) % len(sides)
		var err error
		if out[k], err = sides[k](); err != nil {
			return backfillRates{}, err
		}
		// Each side's rate as it is measured: the table gives only each
		// row's median and range, and the order a side ran in is one cause
		// to rule out when its runs disagree.
		fmt.Fprintf(e.log, "bench: K backfill, run %d, side %d: %s, %.0f rows/s\n", run+1, j+1, names[k], out[k])
	}
	return backfillRates{out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]}, nil
}

// fillTable creates table t with rows 1..n of about 170 bytes each.
func fillTable(ctx context.Context, admin *pgxpool.Pool, t string, n int) error {
	if _, err := admin.Exec(ctx, `CREATE TABLE `+t+` (id int PRIMARY KEY, n int NOT NULL, name text NOT NULL, pad text NOT NULL)`); err != nil {
		return err
	}
	_, err := admin.Exec(ctx, `INSERT INTO `+t+` SELECT i, 0, 'item-' || i, repeat(md5(i::text), 4) FROM generate_series(1, $1::int) AS i`, n)
	return err
}
