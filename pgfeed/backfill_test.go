package pgfeed_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// backfillEnv is a captured table t(id int PRIMARY KEY, v text) holding rows
// 1..n written before the capture, so the feed starts empty.
func backfillEnv(t *testing.T, n int) (capEnv, string) {
	t.Helper()
	return backfillEnvIn(t, n, capModes[0])
}

// capMode is a way the backfill tests capture their table: a write mode,
// and the capture's document expression. In the concurrent mode a capture
// without one records keys (keyed), and one with an expression writes its
// documents unsealed; the expression here gives the same documents.
type capMode struct {
	name     string
	mode     feed.WriteMode
	document string
}

var capModes = []capMode{
	{"locked", feed.WriteLocked, ""},
	{"concurrent", feed.WriteConcurrent, ""},
	{"concurrent_expression", feed.WriteConcurrent, "to_jsonb(r)"},
}

// backfillEnvIn is backfillEnv with feed t captured in the given way.
func backfillEnvIn(t *testing.T, n int, m capMode) (capEnv, string) {
	t.Helper()
	e := newCapEnv(t, `CREATE TABLE %[1]s.t (id int PRIMARY KEY, v text NOT NULL)`)
	e.concurrent = m.mode == feed.WriteConcurrent
	e.exec(t, fmt.Sprintf(`INSERT INTO %s SELECT i, 'v' || i FROM generate_series(1, %d) AS i`, e.q("t"), n))
	if _, err := e.s.Capture(t.Context(), pgfeed.CaptureSpec{Feed: "t", Schema: e.d.schema, Table: "t", Document: m.document}); err != nil {
		t.Fatal(err)
	}
	e.inMode(t, "t")
	return e, `SELECT id::text, to_jsonb(r)::text FROM ` + e.q("t") + ` AS r`
}

// inBothModes runs test once per capMode, as parallel subtests.
func inBothModes(t *testing.T, test func(t *testing.T, m capMode)) {
	t.Parallel()
	for _, m := range capModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			test(t, m)
		})
	}
}

// waitBlocked waits until a backend running a statement on the test's
// schema waits for a lock (the feed lock, in these tests), and returns its
// pid. A wait to extend a table is not one: two batches that insert at
// once meet there for an instant, before either waits for the feed lock.
func (e capEnv) waitBlocked(t *testing.T) int32 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var pid int32
		err := e.d.pool.QueryRow(t.Context(), `SELECT a.pid FROM pg_stat_activity a
			WHERE a.pid <> pg_backend_pid() AND a.wait_event_type = 'Lock' AND a.wait_event <> 'extend' AND strpos(a.query, $1) > 0 LIMIT 1`,
			`"`+e.d.schema+`".`).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no backend came to wait for the feed lock")
	return 0
}

// holdFeedLock opens a transaction that updates row id of t, so its trigger
// takes the feed lock (in the concurrent mode: the write lock shared and
// the key's feed row) and holds it, and the table row's lock, until the
// returned function commits (or, given false, rolls back).
func (e capEnv) holdFeedLock(t *testing.T, id int, v string) func(commit bool) {
	t.Helper()
	ctx := t.Context()
	tx, err := e.d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+e.q("t")+` SET v = $2 WHERE id = $1`, id, v); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) })
	return func(commit bool) {
		once.Do(func() {
			if commit {
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
				}
				return
			}
			_ = tx.Rollback(ctx)
		})
	}
}

// TestBackfillTakesTheLockBeforeItReads is the rule that a captured
// writer's change wins over the backfill's copy: a writer has updated row 5
// and holds the feed lock; the backfill starts and waits for the lock; the
// writer commits. The backfill must copy row 5 as the writer left it. A
// backfill that read the table before it held the lock copies the old row
// at a seq above the writer's, and the feed keeps the stale document. In
// the concurrent mode the writer holds no feed lock: the backfill copies
// row 5 as committed before the writer and ends while the writer is open,
// and the writer's commit is sealed above the copy, so it still wins.
func TestBackfillTakesTheLockBeforeItReads(t *testing.T) {
	inBothModes(t, backfillTakesTheLockBeforeItReads)
}

func backfillTakesTheLockBeforeItReads(t *testing.T, m capMode) {
	e, table := backfillEnvIn(t, 10, m)
	ctx := t.Context()
	release := e.holdFeedLock(t, 5, "written while the backfill waited")
	type result struct {
		r   pgfeed.BackfillResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", Progress: func(pgfeed.BackfillProgress) {}})
		done <- result{r, err}
	}()
	var res result
	if e.concurrent {
		res = <-done
		release(true)
	} else {
		e.waitBlocked(t)
		release(true)
		res = <-done
	}
	if res.err != nil || res.r.Rows != 10 {
		t.Fatalf("Backfill = %+v, %v; want 10 rows", res.r, res.err)
	}
	e.same(t, "backfill after a waiting writer", "t", e.want(t, table))
}

// TestBackfillWaitsForARound is the concurrent mode's form of the rule
// above: a sealing round holds the feed lock; a backfill starts and comes
// to wait for it; a writer then changes row 5 and commits, and the round,
// whose seal reads after that commit, seals the change. The backfill must
// copy row 5 as the writer left it. A batch that read the table before it
// held the lock would copy the row as it was before the writer and write
// that above the round's seal, and no later round would mend it: the
// writer's write is sealed already.
func TestBackfillWaitsForARound(t *testing.T) {
	t.Parallel()
	for _, m := range capModes {
		if m.mode != feed.WriteConcurrent {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e, table := backfillEnvIn(t, 10, m)
			ctx := t.Context()
			locked, proceed := make(chan struct{}), make(chan struct{})
			sealed := make(chan error, 1)
			go func() {
				_, err := pgfeed.SealRoundGated(ctx, e.s, "t", locked, proceed)
				sealed <- err
			}()
			<-locked
			done := make(chan error, 1)
			go func() {
				_, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", Progress: func(pgfeed.BackfillProgress) {}})
				done <- err
			}()
			e.waitBlocked(t)
			e.exec(t, `UPDATE `+e.q("t")+` SET v = 'written while the backfill waited' WHERE id = 5`)
			close(proceed)
			if err := <-sealed; err != nil {
				t.Fatalf("the round: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("Backfill: %v", err)
			}
			e.same(t, "backfill after a round that sealed a writer", "t", e.want(t, table))
		})
	}
}

// TestBackfillKeyMovedWhileItWaits: a writer has moved row 5 to key 100005
// and holds its transaction open; a backfill of batches of 10 over rows
// 1..20 waits for it (for the feed lock, in the locked mode), then the
// writer commits. Rows 11..20 must still be copied: a batch that took its
// position from a locking read would get row 5 back with its new key,
// 100005, as the batch's last, and the next batch would start past rows
// 11..20. In the concurrent mode the backfill waits for nobody: it copies
// key 5 as its snapshot has it, and the writer's commit, sealed after,
// tombstones 5 and writes 100005.
func TestBackfillKeyMovedWhileItWaits(t *testing.T) {
	inBothModes(t, func(t *testing.T, m capMode) {
		e, table := backfillEnvIn(t, 20, m)
		ctx := t.Context()
		tx, err := e.d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(ctx, `UPDATE `+e.q("t")+` SET id = 100005 WHERE id = 5`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: 10, Progress: func(pgfeed.BackfillProgress) {}})
			done <- err
		}()
		if e.concurrent {
			if err := <-done; err != nil {
				t.Fatalf("Backfill: %v", err)
			}
		} else {
			e.waitBlocked(t)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if !e.concurrent {
			if err := <-done; err != nil {
				t.Fatalf("Backfill: %v", err)
			}
		}
		e.same(t, "backfill after a key moved", "t", e.want(t, table))
	})
}

// TestBackfillKeepsARowCollectedUnderIt: key 5 has a row in the table and a
// tombstone in the feed (a Write deleted it there; a captured delete and an
// uncaptured insert, as replication apply makes, leave the same), and every
// sink has passed the tombstone. A collection deletes it and holds its
// transaction open; a locked-mode backfill then takes its snapshot, which
// still sees the tombstone, and comes to write key 5; the collection then
// commits or rolls back. The feed must end equal to the table, the head
// moved by the 20 rows copied, in each case: a batch that left out, or
// updated, the keys its snapshot saw in the feed would lose key 5 when the
// collection commits; one that skipped the keys its insert met in the feed
// would keep the tombstone when it rolls back, or key 6's stale document
// (the third case) always.
func TestBackfillKeepsARowCollectedUnderIt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		commit, stale bool
	}{
		{"collected", true, false},
		{"collection rolled back", false, false},
		{"collected, another key stale", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e, table := backfillEnv(t, 20)
			ctx := t.Context()
			changes := []feed.Change{feed.Delete("5")}
			if c.stale {
				changes = append(changes, feed.Put("6", []byte(`{"stale": true}`)))
			}
			if _, err := e.s.WriteCommitted(ctx, "t", changes); err != nil {
				t.Fatal(err)
			}
			gen, head := e.head(t, "t")
			e.exec(t, `INSERT INTO `+e.q("feed_cursors")+` (feed, sink, generation, seq) VALUES ('t', 's', $1, $2)`, int64(gen), int64(head))
			tx, err := e.d.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			collector, err := pgfeed.New(ctx, tx, pgfeed.Options{Schema: e.d.schema, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer collector.Close()
			if n, err := collector.CollectTombstones(ctx, "t"); err != nil || n != 1 {
				t.Fatalf("CollectTombstones = %d, %v; want 1", n, err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", Progress: func(pgfeed.BackfillProgress) {}})
				done <- err
			}()
			e.waitBlocked(t)
			if c.commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("Backfill: %v", err)
			}
			e.same(t, "backfill over a tombstone under collection", "t", e.want(t, table))
			if _, h := e.head(t, "t"); h != head+20 {
				t.Fatalf("the head is %d; want %d, moved by the 20 rows copied", h, head+20)
			}
		})
	}
}

// TestBackfillRacingWriters: writers update, delete, insert and move (change
// the key of) rows all over the table (before, at and after the backfill's
// position) while it runs in small batches, with one worker and with two;
// the feed ends equal to the table, row for row, and so does a reader that
// followed the feed all along, batch after batch from its last seq, as a
// sink's worker does: with two workers a batch's rows commit below seqs a
// writer has already committed, and a reader that passed them would never
// read them. In the concurrent mode a sealer runs all along, so a key's
// copy and its writers' writes are sealed in every interleaving.
func TestBackfillRacingWriters(t *testing.T) {
	inBothModes(t, func(t *testing.T, m capMode) {
		for _, workers := range []int{1, 2} {
			t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
				t.Parallel()
				backfillRacingWriters(t, m, workers)
			})
		}
	})
}

// follow reads feed f from its start until stop is closed, and then once
// more to its end after settled is closed, applying each batch to a copy
// of the feed's live documents, which it returns.
func (e capEnv) follow(t *testing.T, f feed.FeedName, stop, settled <-chan struct{}) <-chan map[string]string {
	out := make(chan map[string]string, 1)
	go func() {
		copy := map[string]string{}
		var after feed.Seq
		final := false
		for {
			b, err := e.s.ReadBatch(t.Context(), f, after, feed.BatchLimit{Records: 200})
			if err != nil {
				t.Error(err)
				out <- nil
				return
			}
			for _, r := range b.Records {
				if r.Doc == nil {
					delete(copy, string(r.Key))
				} else {
					copy[string(r.Key)] = string(r.Doc)
				}
				after = r.Seq
			}
			if b.More {
				continue
			}
			if final {
				out <- copy
				return
			}
			select {
			case <-stop:
				<-settled
				final = true
			default:
				time.Sleep(time.Millisecond)
			}
		}
	}()
	return out
}

func backfillRacingWriters(t *testing.T, m capMode, workers int) {
	const rows = 3000
	e, table := backfillEnvIn(t, rows, m)
	ctx := t.Context()
	stopFollowing, settled := make(chan struct{}), make(chan struct{})
	followed := e.follow(t, "t", stopFollowing, settled)
	if e.concurrent {
		sealCtx, stopSealer := context.WithCancel(ctx)
		sealed := make(chan error, 1)
		go func() { sealed <- e.s.RunSealer(sealCtx, "t") }()
		t.Cleanup(func() { stopSealer(); <-sealed })
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes, moved atomic.Int64
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := 1 + rnd.IntN(rows+200)
				var err error
				switch rnd.IntN(5) {
				case 4:
					// A key change, to a key no other write takes (a key
					// moved before could have been inserted again since).
					_, err = e.d.pool.Exec(ctx, `UPDATE `+e.q("t")+` SET id = $2, v = v || '>' WHERE id = $1`, id, 100000+moved.Add(1))
				case 0:
					_, err = e.d.pool.Exec(ctx, `DELETE FROM `+e.q("t")+` WHERE id = $1`, id)
				case 1:
					_, err = e.d.pool.Exec(ctx, `INSERT INTO `+e.q("t")+` VALUES ($1, 'new') ON CONFLICT (id) DO UPDATE SET v = 'reinserted'`, id)
				default:
					_, err = e.d.pool.Exec(ctx, `UPDATE `+e.q("t")+` SET v = v || '+' WHERE id BETWEEN $1 AND $1 + 3`, id)
				}
				if err != nil {
					errs <- err
					return
				}
				writes.Add(1)
			}
		}()
	}
	var batches atomic.Int64
	res, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: 50, Workers: workers, Progress: func(p pgfeed.BackfillProgress) {
		batches.Add(1)
		// The writers start first, so the count the backfill starts with is
		// near the table's first size, not equal to it. A copy may also
		// read rows the writers insert or move ahead of it, one at most a
		// write.
		if p.Total < rows-100 || p.Total > rows+100 || p.Rows > rows+200+writes.Load() {
			t.Errorf("progress %+v; want a total near %d", p, rows)
		}
	}})
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	if err != nil {
		t.Fatalf("Backfill: %v", err)
	}
	if writes.Load() < 20 || batches.Load() < 20 {
		t.Fatalf("%d writes raced %d batches; the test needs more of both", writes.Load(), batches.Load())
	}
	t.Logf("%d writes raced %d batches, %d rows copied", writes.Load(), batches.Load(), res.Rows)
	close(stopFollowing)
	want := e.want(t, table)
	e.same(t, "backfill racing writers", "t", want)
	close(settled)
	if got := <-followed; !maps.Equal(got, want) {
		missing, stale := 0, 0
		for k, v := range want {
			if g, ok := got[k]; !ok {
				missing++
			} else if g != v {
				stale++
			}
		}
		t.Fatalf("a reader that followed the feed holds %d keys, the table %d: %d missing, %d stale", len(got), len(want), missing, stale)
	}
}

// TestBackfillResumes: a backfill whose backend is killed mid-batch, and
// then one whose context is cancelled mid-batch, each resume where the last
// committed batch left off, and the last run finishes with the feed equal to
// the table, every row copied once. With one worker the batches run in
// turn, so each run records exactly its batches and the head counts the
// copies; with two, each share resumes at its own position, a batch of the
// other share may land before the interruption does, and a batch cancelled
// after its seqs were reserved leaves them unused, so the rows recorded
// count the copies instead.
func TestBackfillResumes(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			backfillResumes(t, workers)
		})
	}
}

func backfillResumes(t *testing.T, workers int) {
	const rows = 1000
	e, table := backfillEnv(t, rows)
	ctx := t.Context()
	// interrupt runs a backfill that, after its third batch, finds the feed
	// lock held by a writer; while it waits, stop interrupts it, and the
	// writer rolls back. It returns how many rows the run recorded.
	interrupt := func(stop func(pid int32, cancel context.CancelFunc)) int64 {
		t.Helper()
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var n int
		var release func(bool)
		held := make(chan struct{}) // closed once release is set
		done := make(chan error, 1)
		go func() {
			_, err := e.s.Backfill(rctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: 100, Workers: workers, Progress: func(pgfeed.BackfillProgress) {
				if n++; n == 3 {
					release = e.holdFeedLock(t, 1, "rolled back")
					close(held)
				}
			}})
			done <- err
		}()
		// Only then look for the backend that waits: with two workers, one
		// may wait on the other's lock before the third batch, and stopping
		// that one left the writer never started (release nil).
		select {
		case <-held:
		case err := <-done:
			t.Fatalf("the backfill ended before its third batch: %v", err)
		}
		pid := e.waitBlocked(t)
		stop(pid, cancel)
		err := <-done
		release(false)
		if err == nil {
			t.Fatal("an interrupted backfill returned no error")
		}
		var recorded int64
		if err := e.d.pool.QueryRow(ctx, `SELECT sum(s.rows) FROM `+e.q("feed_backfill_shares")+` AS s JOIN `+e.q("feed_backfills")+` AS b USING (feed)
			WHERE feed = 't' AND b.finished_at IS NULL`).Scan(&recorded); err != nil {
			t.Fatal(err)
		}
		return recorded
	}
	killed := interrupt(func(pid int32, _ context.CancelFunc) {
		if _, err := e.d.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
	})
	cancelled := interrupt(func(_ int32, cancel context.CancelFunc) { cancel() })
	switch {
	case workers == 1 && (killed != 300 || cancelled != 600):
		t.Fatalf("the runs recorded %d and then %d rows; want 300 and 600", killed, cancelled)
	case killed < 300 || cancelled < killed+300 || cancelled >= rows:
		t.Fatalf("the runs recorded %d and then %d rows; want at least 300, then at least 300 more, and not all %d", killed, cancelled, rows)
	}
	res, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: 100, Workers: workers, Progress: func(pgfeed.BackfillProgress) {}})
	if err != nil || !res.Resumed || res.Rows != rows {
		t.Fatalf("the last run = %+v, %v; want %d rows, resumed", res, err, rows)
	}
	e.same(t, "resumed backfill", "t", e.want(t, table))
	if _, h := e.head(t, "t"); (workers == 1 && h != rows) || h < rows {
		t.Fatalf("the head is %d after copying %d rows; want %d, each row copied once", h, rows, rows)
	}
	// A finished backfill starts over when run again.
	again, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", Workers: workers, Progress: func(pgfeed.BackfillProgress) {}})
	if err != nil || again.Resumed || again.Rows != rows {
		t.Fatalf("a backfill after a finished one = %+v, %v; want a fresh run of %d rows", again, err, rows)
	}
}

// TestBackfillInsertsPlainly: a batch of keys the feed lacks inserts its
// rows plainly. In a feed that holds every key already (a second backfill
// in place) the plain insert fails, the batch upserts instead, and after a
// failed try the share's next batches upsert without trying, more of them
// after each failure, so few of a full feed's batches try at all.
func TestBackfillInsertsPlainly(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			backfillInsertsPlainly(t, workers)
		})
	}
}

func backfillInsertsPlainly(t *testing.T, workers int) {
	const rows, size = 4000, 20
	const batches = rows / size
	e, table := backfillEnv(t, rows)
	ctx := t.Context()
	var mu sync.Mutex
	var plain, tries, upserts int
	pgfeed.OnBatch(e.s, func(p bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case p && err == nil:
			plain++
		case p:
			tries++
		case err == nil:
			upserts++
		}
	})
	counts := func() (int, int, int) {
		mu.Lock()
		defer mu.Unlock()
		p, f, u := plain, tries, upserts
		plain, tries, upserts = 0, 0, 0
		return p, f, u
	}
	backfill := func(step string) {
		t.Helper()
		res, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: size, Workers: workers, Progress: func(pgfeed.BackfillProgress) {}})
		if err != nil || res.Rows != rows {
			t.Fatalf("%s = %+v, %v; want %d rows", step, res, err, rows)
		}
		e.same(t, step, "t", e.want(t, table))
	}
	backfill("the first backfill")
	if p, f, u := counts(); p < batches || f != 0 || u != 0 {
		t.Fatalf("the first backfill's batches: %d plain, %d failed tries, %d upserts; want all of at least %d plain", p, f, u, batches)
	}
	_, first := e.head(t, "t")
	backfill("the second backfill")
	p, f, u := counts()
	if p != 0 || u < batches || f == 0 || f*5 > batches {
		t.Fatalf("the second backfill's batches: %d plain, %d failed tries, %d upserts; want none plain, at least %d upserts, and between 1 and %d tries",
			p, f, u, batches, batches/5)
	}
	var stale int
	if err := e.d.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.q("feed_rows")+` WHERE feed = 't' AND seq <= $1::bigint`, int64(first)).Scan(&stale); err != nil {
		t.Fatal(err)
	}
	if stale != 0 {
		t.Fatalf("%d rows are still at the first backfill's seqs; want every key copied again above them", stale)
	}
}

// TestBackfillNewGeneration: a backfill into a new generation empties the
// feed of what the table no longer holds (here a key written by Write
// directly) and fills it in one transaction; sinks see one new generation.
func TestBackfillNewGeneration(t *testing.T) {
	inBothModes(t, backfillNewGeneration)
}

func backfillNewGeneration(t *testing.T, m capMode) {
	e, table := backfillEnvIn(t, 500, m)
	ctx := t.Context()
	if _, err := e.s.WriteCommitted(ctx, "t", []feed.Change{feed.Put("stray", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	g0, _ := e.head(t, "t")
	res, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true, BatchSize: 64, Progress: func(pgfeed.BackfillProgress) {}})
	if err != nil || res.Rows != 500 || res.Generation != g0+1 {
		t.Fatalf("Backfill = %+v, %v; want 500 rows in generation %d", res, err, g0+1)
	}
	// The new generation commits whole: a sink that resyncs it at once
	// must find every row sealed, none left for the sealer.
	if n, h := e.unsealed(t, "t"); n != 0 || h != res.Head || h < 500 {
		t.Fatalf("the new generation committed with %d writes unsealed and head %d (Backfill said %d); want none, and every row sealed", n, h, res.Head)
	}
	// Its rows hold the seqs right below the head, each once: a sink that
	// reads up to the head has read them all.
	rows := e.feedRows(t, "t")
	seqs := map[int64]bool{}
	for k, r := range rows {
		if r.seq <= int64(res.Head)-int64(len(rows)) || r.seq > int64(res.Head) || seqs[r.seq] {
			t.Fatalf("key %s at seq %d: want each seq of %d..%d once", k, r.seq, int64(res.Head)-int64(len(rows))+1, res.Head)
		}
		seqs[r.seq] = true
	}
	e.same(t, "new generation", "t", e.want(t, table))
	if ts := e.tombstones(t, "t"); len(ts) != 0 {
		t.Fatalf("the new generation has tombstones %q", ts)
	}
}

// TestBackfillBadInput: a feed that captures nothing, a negative batch
// size, and a capture the table has outgrown are refused before anything is
// copied.
func TestBackfillBadInput(t *testing.T) {
	t.Parallel()
	e, _ := backfillEnv(t, 3)
	ctx := t.Context()
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: "t", Schema: e.d.schema, Table: "t", Include: []string{"id"}}); err != nil {
		t.Fatal(err)
	}
	e.exec(t, `ALTER TABLE `+e.q("t")+` ADD COLUMN extra int`) // Include now drops "extra" too
	for _, c := range []struct {
		opts pgfeed.BackfillOptions
		says string
	}{
		{pgfeed.BackfillOptions{Feed: "none"}, "captures no table"},
		{pgfeed.BackfillOptions{Feed: "t", BatchSize: -1}, "options.batch_size"},
		{pgfeed.BackfillOptions{Feed: "t"}, "run Capture again"},
	} {
		_, err := e.s.Backfill(ctx, c.opts)
		var inv *feed.InvalidError
		if !errors.As(err, &inv) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Backfill(%+v) = %v; want an InvalidError that says %q", c.opts, err, c.says)
		}
	}
	if _, h := e.head(t, "t"); h != 0 {
		t.Fatalf("refused backfills moved the head to %d", h)
	}
}

// TestBackfillRefusesWhatWriteRefuses: a row already in the table whose
// document the feed refuses (JSON null from the capture's expression) or
// whose key it refuses (over 512 bytes) fails the backfill with the feed's
// own reason, and the batch it was in writes nothing: no row, no head, no
// progress; as a new generation, the whole copy rolls back. The capture's
// trigger would have refused the same row; the backfill must not let
// through what the trigger cannot.
func TestBackfillRefusesWhatWriteRefuses(t *testing.T) {
	inBothModes(t, func(t *testing.T, m capMode) {
		ctx := t.Context()
		for _, c := range []struct {
			name, insert, document, want string
		}{
			{"JSON null", `INSERT INTO %[1]s VALUES (1000, 'null')`,
				`CASE WHEN r.v = 'null' THEN 'null'::jsonb ELSE to_jsonb(r) END`, "its document is JSON null"},
			{"long key", `CREATE UNIQUE INDEX ON %[1]s (v); INSERT INTO %[1]s VALUES (-1, repeat('k', 600))`,
				``, "more than the 512 allowed"},
		} {
			t.Run(c.name, func(t *testing.T) {
				e, _ := backfillEnvIn(t, 20, m)
				e.exec(t, fmt.Sprintf(c.insert, e.q("t")))
				spec := pgfeed.CaptureSpec{Feed: "t", Schema: e.d.schema, Table: "t", Document: c.document}
				if c.document == "" {
					// The key is the text column, so a long value is a long key.
					spec.Key = []string{"v"}
				}
				if _, err := e.s.Capture(ctx, spec); err != nil {
					t.Fatal(err)
				}
				// The insert went through the trigger of the first capture:
				// that row is in the feed already; the backfill must add
				// nothing to it.
				before := e.feedRows(t, "t")
				g0, _ := e.head(t, "t")
				_, h0 := e.unsealed(t, "t")
				// In place, and as a new generation, whose copy is written
				// by a statement of its own. In place with one worker, so
				// that the table is one batch: with more, another share's
				// batch may commit before the refused one fails, as an
				// earlier batch of one worker does.
				for _, fresh := range []bool{false, true} {
					_, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: 100, NewGeneration: fresh, Workers: 1})
					if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, feed.ErrWriteFailed) {
						t.Fatalf("Backfill (new generation %v) over a row the feed refuses = %v; want a write failure saying %q", fresh, err, c.want)
					}
					if n, head := e.unsealed(t, "t"); n != 0 || head != h0 {
						t.Errorf("new generation %v: the refused batch left %d unsealed rows and head %d; want none and %d", fresh, n, head, h0)
					}
					if g, _ := e.head(t, "t"); g != g0 {
						t.Errorf("new generation %v: the refused backfill left the feed at generation %d; want %d", fresh, g, g0)
					}
					if rows := e.feedRows(t, "t"); len(rows) != len(before) {
						t.Errorf("new generation %v: the refused batch wrote %d rows; the feed had %d", fresh, len(rows)-len(before), len(before))
					}
				}
			})
		}
	})
}

// TestBackfillWakesReaders: every batch of an in-place backfill in the
// locked mode, and the move of a new generation, wake the feed's
// subscribers as a write does, so a waiting sink copies at once rather than
// at its next poll.
func TestBackfillWakesReaders(t *testing.T) {
	t.Parallel()
	e, _ := backfillEnv(t, 300)
	ctx := t.Context()
	sub, err := e.s.Subscribe(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, fresh := range []bool{false, true} {
		select { // whatever woke it before this backfill
		case <-sub.C():
		default:
		}
		if _, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: fresh, BatchSize: 100, Progress: func(pgfeed.BackfillProgress) {}}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sub.C():
		case <-time.After(10 * time.Second):
			t.Fatalf("new generation %v: no subscriber woke within 10s of the backfill", fresh)
		}
	}
}

// waitBlockedOn waits until a backend whose statement starts with prefix
// waits for a lock, other than to extend a table (see waitBlocked).
func (e capEnv) waitBlockedOn(t *testing.T, prefix string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		err := e.d.pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND wait_event <> 'extend' AND starts_with(query, $1) AND strpos(query, $2) > 0)`,
			prefix, `"`+e.d.schema+`".`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no statement %q came to wait for a lock", prefix)
}

// TestBackfillBeforeATruncate: a locked-mode writer holds the feed lock;
// an in-place backfill comes to wait for it, and a TRUNCATE of the table
// is run. Both must succeed, the TRUNCATE after the batch, and the feed
// end equal to the table. A batch that took the write lock before the
// table's lock would hold it shared while the TRUNCATE, holding the
// table, waited for it exclusive in its trigger; the batch's read would
// then wait for the table, and PostgreSQL would end the deadlock by
// failing one of them.
func TestBackfillBeforeATruncate(t *testing.T) {
	t.Parallel()
	e, table := backfillEnv(t, 10)
	ctx := t.Context()
	g, err := e.d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.Rollback(context.Background()) }()
	if _, err := g.Exec(ctx, `INSERT INTO `+e.q("feed_generations")+` AS g (feed) VALUES ('t') ON CONFLICT (feed) DO UPDATE SET head = g.head`); err != nil {
		t.Fatal(err)
	}
	backfilled := make(chan error, 1)
	go func() {
		_, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", Progress: func(pgfeed.BackfillProgress) {}})
		backfilled <- err
	}()
	e.waitBlocked(t)
	truncated := make(chan error, 1)
	go func() {
		_, err := e.d.pool.Exec(ctx, `TRUNCATE `+e.q("t"))
		truncated <- err
	}()
	e.waitBlockedOn(t, "TRUNCATE")
	if err := g.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-backfilled; err != nil {
		t.Errorf("Backfill: %v", err)
	}
	if err := <-truncated; err != nil {
		t.Errorf("TRUNCATE: %v", err)
	}
	e.same(t, "a backfill, then a TRUNCATE", "t", e.want(t, table))
}
