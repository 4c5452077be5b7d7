package pgfeed_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestReadersStopBelowAReservation is the reader's side of a parallel
// in-place backfill, driven by hand: a transaction has seqs reserved for
// it (the head moved past them, the reservation entered with its id, as
// the backfill's coordinator does), and a writer then commits a row above
// them. Until the transaction commits, a read must stop below the
// reserved seqs, and Head must say so; a reader that went on to the
// writer's row would move its cursor past the reserved seqs and never read
// the row the transaction then commits there. Once it commits, with its
// row and the end of its reservation, both rows read in seq order; a
// reservation whose transaction rolled back holds no reader.
func TestReadersStopBelowAReservation(t *testing.T) {
	t.Parallel()
	e, _ := backfillEnv(t, 0)
	ctx := t.Context()
	write := func(key string) feed.Seq {
		t.Helper()
		r, err := e.s.WriteCommitted(ctx, "t", []feed.Change{feed.Put(feed.Key(key), []byte(`{"k": "`+key+`"}`))})
		if err != nil {
			t.Fatal(err)
		}
		return r.Last
	}
	// reserve opens a transaction, reserves the next seq for it, and
	// returns the transaction and the seq.
	reserve := func() (pgx.Tx, int64) {
		t.Helper()
		tx, err := e.d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		var xid string
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		var seq int64
		if err := e.d.pool.QueryRow(ctx, `WITH g AS (
	UPDATE `+e.q("feed_generations")+` SET head = head + 1 WHERE feed = 't' RETURNING head
), v AS (
	INSERT INTO `+e.q("feed_reserved")+` (feed, first_seq, last_seq, xid) SELECT 't', head, head, $1::text::xid8 FROM g
)
SELECT head FROM g`, xid).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return tx, seq
	}
	// read reads the feed after seq after and returns the keys by seq, and
	// the batch's head; Head must agree with it.
	read := func(after feed.Seq) (map[feed.Seq]string, feed.Seq) {
		t.Helper()
		b, err := e.s.ReadBatch(ctx, "t", after, feed.BatchLimit{Records: 100})
		if err != nil {
			t.Fatal(err)
		}
		h, err := e.s.Head(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		if h != b.Head {
			t.Fatalf("Head = %d, and a batch read just before says %d", h, b.Head)
		}
		got := map[feed.Seq]string{}
		for _, r := range b.Records {
			got[r.Seq] = string(r.Key)
		}
		return got, b.Head
	}
	expect := func(step string, after feed.Seq, want map[feed.Seq]string, head feed.Seq) {
		t.Helper()
		got, h := read(after)
		if !maps.Equal(got, want) || h != head {
			t.Fatalf("%s: read after %d = %v, head %d; want %v, head %d", step, after, got, h, want, head)
		}
	}

	a := write("a")
	tx, r := reserve()
	b := write("b")
	if r != int64(a)+1 || b != a+2 {
		t.Fatalf("seqs a %d, reserved %d, b %d; want three in a row", a, r, b)
	}
	expect("reserved, b committed above", a, map[feed.Seq]string{}, a)
	expect("reserved, from the start", 0, map[feed.Seq]string{a: "a"}, a)
	for _, q := range []string{
		`INSERT INTO ` + e.q("feed_rows") + ` (feed, key, seq, doc) VALUES ('t', 'r', $1, '{}')`,
		`DELETE FROM ` + e.q("feed_reserved") + ` WHERE feed = 't' AND first_seq = $1`,
	} {
		if _, err := tx.Exec(ctx, q, r); err != nil {
			t.Fatal(err)
		}
	}
	expect("reserved row written, not committed", a, map[feed.Seq]string{}, a)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	expect("reserved row committed", a, map[feed.Seq]string{feed.Seq(r): "r", b: "b"}, b)

	tx, r = reserve()
	c := write("c")
	expect("reserved again", b, map[feed.Seq]string{}, b)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	expect("reservation rolled back", b, map[feed.Seq]string{c: "c"}, c)
	if r != int64(b)+1 {
		t.Fatalf("reserved %d after b at %d", r, b)
	}
}

// TestBackfillMeetsAWriter: a locked-mode writer updates rows 5 and 15 of
// the table right after the first batch's seqs are reserved, before it
// reads, and holds its transaction open; the batch's upsert of the key the
// writer wrote comes to wait for it, and the writer then commits, its rows
// at seqs above the batch's. Its change must win, and the feed end equal
// to the table, whether the feed lacked the keys (the writer's insert is
// the row the upsert meets) or held them: the upsert finds the writer's
// row at a higher seq and must keep it. One that wrote over it left the
// document the writer replaced, or the batch's stale copy of it.
func TestBackfillMeetsAWriter(t *testing.T) {
	t.Parallel()
	for _, held := range []bool{false, true} {
		name := "keys the feed lacks"
		if held {
			name = "keys the feed holds"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			backfillMeetsAWriter(t, held)
		})
	}
}

func backfillMeetsAWriter(t *testing.T, held bool) {
	e, table := backfillEnv(t, 20)
	ctx := t.Context()
	if held {
		e.exec(t, `UPDATE `+e.q("t")+` SET v = 'before the backfill' WHERE id IN (5, 15)`)
	}
	var once sync.Once
	writers := make(chan pgx.Tx, 1)
	pgfeed.AfterReserve(e.s, func(int) {
		once.Do(func() {
			if tx := e.openWriter(ctx, t, `UPDATE `+e.q("t")+` SET v = 'the writer''s' WHERE id IN (5, 15)`); tx != nil {
				writers <- tx
			}
		})
	})
	done := e.backfillAside(ctx)
	e.waitBlockedOn(t, "WITH b AS MATERIALIZED")
	if err := (<-writers).Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Backfill: %v", err)
	}
	e.same(t, "backfill past a writer", "t", e.want(t, table))
}

// TestBackfillRetryParkedWaitsForABatch: the feed holds a stale document
// of key 5 (written before the table's row changed outside the capture),
// parked for a sink; right after a batch's seqs are reserved, before it
// reads, the sink's operator retries the key. The retry must wait for the
// batch, and then restamp the batch's copy. A retry that restamped at
// once would put the stale row above the batch's seqs, where the batch's
// write keeps it (a writer's row at a higher seq wins), and the feed would
// keep the stale document.
func TestBackfillRetryParkedWaitsForABatch(t *testing.T) {
	t.Parallel()
	e, table := backfillEnv(t, 20)
	ctx := t.Context()
	if _, err := e.s.WriteCommitted(ctx, "t", []feed.Change{feed.Put("5", []byte(`{"stale": true}`))}); err != nil {
		t.Fatal(err)
	}
	e.exec(t, `INSERT INTO `+e.q("feed_parked")+` (feed, sink, key, seq, reason, parked_at) VALUES ('t', 's', '5', 1, 'refused', now())`)
	var once sync.Once
	retried := make(chan error, 1)
	pgfeed.AfterReserve(e.s, func(int) {
		once.Do(func() {
			go func() {
				ok, err := e.s.RetryParked(ctx, feed.SinkID{Feed: "t", Sink: "s"}, "5")
				if err == nil && !ok {
					err = errors.New("RetryParked found key 5 not parked")
				}
				retried <- err
			}()
			// The retry either ends at once, or waits for the batch.
			select {
			case err := <-retried:
				retried <- err
			case <-time.After(300 * time.Millisecond):
			}
		})
	})
	if _, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: 100, Workers: 2, Progress: func(pgfeed.BackfillProgress) {}}); err != nil {
		t.Fatalf("Backfill: %v", err)
	}
	if err := <-retried; err != nil {
		t.Fatalf("RetryParked: %v", err)
	}
	e.same(t, "backfill past a retried key", "t", e.want(t, table))
}

// TestBackfillBatchWaitsHoldingNoTableLock: a locked-mode writer holds the
// feed lock (it updated row 1) while a backfill copied from two
// connections comes to wait for it to reserve its next batch's seqs; the
// writer then locks the table (as an ALTER TABLE or a TRUNCATE in the same
// transaction would) and commits. The lock must be granted and both must
// finish: a batch that held its table lock while it waited for its
// reservation would wait for the writer through the backfill's own
// connection, the writer for the batch, and PostgreSQL would see no
// deadlock to break (the writer's lock wait times out here instead).
func TestBackfillBatchWaitsHoldingNoTableLock(t *testing.T) {
	t.Parallel()
	e, table := backfillEnv(t, 2000)
	ctx := t.Context()
	// A committed write first, so the feed's generations row exists and
	// the backfill waits for the writer only for its seqs.
	e.exec(t, `UPDATE `+e.q("t")+` SET v = 'written before' WHERE id = 2`)
	w, err := e.d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Rollback(context.Background()) }()
	if _, err := w.Exec(ctx, `UPDATE `+e.q("t")+` SET v = 'the writer''s' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	done := e.backfillAside(ctx)
	e.waitBlockedOn(t, "WITH g AS")
	if _, err := w.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Exec(ctx, `LOCK TABLE `+e.q("t")+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatalf("the writer's table lock, while a batch waited for its seqs: %v", err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Backfill: %v", err)
	}
	e.same(t, "backfill past a writer that locked the table", "t", e.want(t, table))
}

// TestBackfillCopiesADeadlockedBatchAgain: right after the seqs of the
// first share's batch are reserved, a writer changes key 5. The batch
// copies keys 1 to 4 and waits for the writer's row of 5; the writer then
// changes key 3 and waits for the batch, which holds its copy of 3.
// PostgreSQL ends the deadlock by rolling the batch back (the writer's
// session waits longer before it looks for one). The backfill must copy
// the batch again, not fail, and end with the writer's changes in the
// feed.
func TestBackfillCopiesADeadlockedBatchAgain(t *testing.T) {
	t.Parallel()
	e, table := backfillEnv(t, 20)
	ctx := t.Context()
	var deadlocks atomic.Int32
	pgfeed.OnBatch(e.s, func(_ bool, err error) {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			deadlocks.Add(1)
		}
	})
	var once sync.Once
	writers := make(chan pgx.Tx, 1)
	pgfeed.AfterReserve(e.s, func(share int) {
		if share != 0 {
			return
		}
		once.Do(func() {
			if tx := e.openWriter(ctx, t, `SET LOCAL deadlock_timeout = '60s'`,
				`UPDATE `+e.q("t")+` SET v = 'the writer''s first' WHERE id = 5`); tx != nil {
				writers <- tx
			}
		})
	})
	done := e.backfillAside(ctx)
	writer := <-writers
	e.waitBlockedOn(t, "WITH b AS MATERIALIZED")
	if _, err := writer.Exec(ctx, `UPDATE `+e.q("t")+` SET v = 'the writer''s second' WHERE id = 3`); err != nil {
		_ = writer.Rollback(ctx)
		t.Fatalf("the writer's second change: %v; want the batch, not the writer, rolled back", err)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Backfill: %v", err)
	}
	if deadlocks.Load() == 0 {
		t.Fatal("no batch met a deadlock; the test did not set up the one it is about")
	}
	e.same(t, "backfill past a deadlock", "t", e.want(t, table))
}

// backfillAside starts a backfill of feed t copied from two connections, in
// batches of 100, and returns where its error will arrive.
func (e capEnv) backfillAside(ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: 100, Workers: 2, Progress: func(pgfeed.BackfillProgress) {}})
		done <- err
	}()
	return done
}

// openWriter begins a transaction and runs stmts in it, for a writer the
// test holds open; nil if it could not begin. It reports with t.Error, as
// the backfill's hooks that call it run outside the test's goroutine.
func (e capEnv) openWriter(ctx context.Context, t *testing.T, stmts ...string) pgx.Tx {
	tx, err := e.d.pool.Begin(ctx)
	if err != nil {
		t.Error(err)
		return nil
	}
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Error(err)
		}
	}
	return tx
}
