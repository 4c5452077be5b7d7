package pgfeed_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// storeOf is the name feed f's rows are stored under, as its generations
// row gives it.
func (e capEnv) storeOf(t testing.TB, f feed.FeedName) string {
	t.Helper()
	var store string
	if err := e.d.pool.QueryRow(t.Context(), `SELECT coalesce((SELECT store FROM `+e.q("feed_generations")+` WHERE feed = $1), $1)`, string(f)).Scan(&store); err != nil {
		t.Fatal(err)
	}
	return store
}

// strays counts the rows stored under a name no feed points at, and the
// entries of the stores table.
func (e capEnv) strays(t testing.TB) (rows, entries int64) {
	t.Helper()
	err := e.d.pool.QueryRow(t.Context(), `SELECT
	(SELECT count(*) FROM `+e.q("feed_rows")+` AS r WHERE NOT EXISTS (SELECT FROM `+e.q("feed_generations")+` AS g WHERE coalesce(g.store, g.feed) = r.feed)),
	(SELECT count(*) FROM `+e.q("feed_stores")+`)`).Scan(&rows, &entries)
	if err != nil {
		t.Fatal(err)
	}
	return rows, entries
}

// TestBackfillNewGenerationApart: a backfill as a new generation copies the
// table from several connections into a store of its own, moves the feed to
// it, and deletes the rows of the store it left; a second one does the same
// from that store. Rows left under a store no feed points at (a backfill
// that died) are deleted by the next backfill as a new generation (a
// filling store) or by CollectTombstones (a retired one).
func TestBackfillNewGenerationApart(t *testing.T) {
	inBothModes(t, func(t *testing.T, m capMode) {
		const n = 3000
		e, table := backfillEnvIn(t, n, m)
		ctx := t.Context()
		e.exec(t, `UPDATE `+e.q("t")+` SET v = 'changed' WHERE id <= 10`)
		e.settle(t, "t")
		if s := e.storeOf(t, "t"); s != "t" {
			t.Fatalf("before any backfill the feed is stored under %q; want its own name", s)
		}
		stored := func() int64 {
			var c int64
			if err := e.d.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.q("feed_rows")+` WHERE feed = 't'`).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		}
		if c := stored(); c != 10 {
			t.Fatalf("the feed holds %d rows under its own name; want the 10 updated", c)
		}
		// A store a backfill that died was filling, and one a feed left
		// whose rows were never deleted.
		e.exec(t, `INSERT INTO `+e.q("feed_stores")+` (store, feed, state) VALUES ('t/dead', 't', 'filling'), ('t/old', 't', 'retired')`)
		e.exec(t, `INSERT INTO `+e.q("feed_rows")+` (feed, key, seq, doc) SELECT s, 'k' || i, i, '{}' FROM unnest(ARRAY['t/dead', 't/old']) AS s, generate_series(1, 25000) AS i`)

		var progress []pgfeed.BackfillProgress
		g0, _ := e.head(t, "t")
		res, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true, Workers: 3, BatchSize: 128,
			Progress: func(p pgfeed.BackfillProgress) { progress = append(progress, p) }})
		if err != nil || res.Rows != n || res.Generation != g0+1 {
			t.Fatalf("Backfill = %+v, %v; want %d rows in generation %d", res, err, n, g0+1)
		}
		first := e.storeOf(t, "t")
		if first == "t" || !strings.HasPrefix(first, "t/") {
			t.Fatalf("after the backfill the feed is stored under %q; want a store of its own", first)
		}
		if c := stored(); c != 0 {
			t.Fatalf("%d rows are left under the store the feed left", c)
		}
		e.same(t, "first new generation", "t", e.want(t, table))
		if last := progress[len(progress)-1]; !last.Done || last.Rows != n || last.Total != n {
			t.Fatalf("the last progress report is %+v; want done, %d of %d rows", last, n, n)
		}
		if len(progress) < 3 {
			t.Fatalf("%d progress reports for %d rows in batches of 128; want one a batch", len(progress), n)
		}
		// The dead backfill's store went before the copy, the retired
		// ones (the feed's own name's, t/old) after the move.
		if rows, entries := e.strays(t); rows != 0 || entries != 0 {
			t.Fatalf("after the backfill %d rows lie under %d stores no feed points at; want none", rows, entries)
		}
		// A retired store whose deletion did not finish is collected.
		e.exec(t, `INSERT INTO `+e.q("feed_stores")+` (store, feed, state) VALUES ('t/left', 't', 'retired')`)
		e.exec(t, `INSERT INTO `+e.q("feed_rows")+` (feed, key, seq, doc) SELECT 't/left', 'k' || i, i, '{}' FROM generate_series(1, 12000) AS i`)
		if rows, entries := e.strays(t); rows != 12000 || entries != 1 {
			t.Fatalf("%d rows lie under %d stores no feed points at; want 12000 under one", rows, entries)
		}
		if _, err := e.s.CollectTombstones(ctx, "t"); err != nil {
			t.Fatal(err)
		}
		if rows, entries := e.strays(t); rows != 0 || entries != 0 {
			t.Fatalf("after a collection %d rows lie under %d stores no feed points at; want none", rows, entries)
		}

		// The feed's writes, reads and rebuilds go on in its store.
		e.exec(t, `UPDATE `+e.q("t")+` SET v = 'again' WHERE id BETWEEN 100 AND 110`)
		e.exec(t, `DELETE FROM `+e.q("t")+` WHERE id = 2000`)
		e.settle(t, "t")
		e.same(t, "writes after the move", "t", e.want(t, table))
		res, err = e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true, Workers: 2, BatchSize: 500})
		if err != nil || res.Rows != n-1 {
			t.Fatalf("a second Backfill = %+v, %v; want %d rows", res, err, n-1)
		}
		if second := e.storeOf(t, "t"); second == first || second == "t" {
			t.Fatalf("after a second backfill the feed is stored under %q; want a new store", second)
		}
		if rows, entries := e.strays(t); rows != 0 || entries != 0 {
			t.Fatalf("after a second backfill %d rows lie under %d stores no feed points at; want none", rows, entries)
		}
		e.same(t, "second new generation", "t", e.want(t, table))
		// A TRUNCATE empties the store the feed is in.
		e.exec(t, `TRUNCATE `+e.q("t"))
		if rows := e.feedRows(t, "t"); len(rows) != 0 {
			t.Fatalf("after a TRUNCATE the feed holds %d rows", len(rows))
		}
	})
}

// TestBackfillNewGenerationFails: a backfill as a new generation that
// stops after some of its workers committed their share (cancelled here,
// after its first batch) leaves the feed as it was, in its generation and
// its store, and no row under any other.
func TestBackfillNewGenerationFails(t *testing.T) {
	t.Parallel()
	e, table := backfillEnv(t, 2000)
	ctx := t.Context()
	e.exec(t, `UPDATE `+e.q("t")+` SET v = 'changed' WHERE id <= 5`)
	before := e.feedRows(t, "t")
	g0, h0 := e.head(t, "t")
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err := e.s.Backfill(bctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true, Workers: 2, BatchSize: 100,
		Progress: func(p pgfeed.BackfillProgress) {
			if p.Rows >= 300 {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled Backfill = %v; want context.Canceled", err)
	}
	if g, h := e.head(t, "t"); g != g0 || h != h0 {
		t.Fatalf("after a failed backfill the feed is at generation %d head %d; want %d and %d", g, h, g0, h0)
	}
	if s := e.storeOf(t, "t"); s != "t" {
		t.Fatalf("after a failed backfill the feed is stored under %q; want its own name", s)
	}
	if rows := e.feedRows(t, "t"); len(rows) != len(before) {
		t.Fatalf("after a failed backfill the feed holds %d rows; want the %d it had", len(rows), len(before))
	}
	if rows, entries := e.strays(t); rows != 0 || entries != 0 {
		t.Fatalf("a failed backfill left %d rows under %d stores no feed points at; want none", rows, entries)
	}
	// A negative worker count is refused before anything runs.
	if _, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true, Workers: -1}); err == nil || !strings.Contains(err.Error(), "options.workers") {
		t.Fatalf("Backfill with -1 workers = %v; want it refused naming options.workers", err)
	}
	if _, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true, Workers: 2, BatchSize: 100}); err != nil {
		t.Fatal(err)
	}
	e.same(t, "after the failed one, a backfill", "t", e.want(t, table))
}

// TestBackfillNewGenerationSmallPool: on a pool of two connections the copy
// runs with one worker beside the transaction that moves the generation,
// whatever Workers asks; on a single connection, in that transaction.
func TestBackfillNewGenerationSmallPool(t *testing.T) {
	t.Parallel()
	e, table := backfillEnv(t, 700)
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	small, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	st, err := pgfeed.New(ctx, small, pgfeed.Options{Schema: e.d.schema, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if res, err := st.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true, Workers: 8, BatchSize: 50}); err != nil || res.Rows != 700 {
		t.Fatalf("Backfill on a pool of 2 = %+v, %v; want 700 rows", res, err)
	}
	e.same(t, "on a pool of two", "t", e.want(t, table))
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	one, err := pgfeed.New(ctx, conn, pgfeed.Options{Schema: e.d.schema, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	e.exec(t, `UPDATE `+e.q("t")+` SET v = 'one' WHERE id = 7`)
	store := e.storeOf(t, "t")
	if res, err := one.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true}); err != nil || res.Rows != 700 {
		t.Fatalf("Backfill on one connection = %+v, %v; want 700 rows", res, err)
	}
	if s := e.storeOf(t, "t"); s != store {
		t.Fatalf("a backfill on one connection moved the feed from store %q to %q; want it kept", store, s)
	}
	e.same(t, "on one connection", "t", e.want(t, table))
	if rows, entries := e.strays(t); rows != 0 || entries != 0 {
		t.Fatalf("%d rows lie under %d stores no feed points at; want none", rows, entries)
	}
}

// TestBackfillNewGenerationYields: a writer holds the feed's write lock
// shared, so a backfill as a new generation waits for it; a TRUNCATE of
// the table (or an Uncapture of the feed) then takes the table and waits
// for the write lock behind the backfill, and the writer commits. The
// copy's workers, which ask for the table after that, wait for the other
// session, which waits for the coordinator, which waits for the workers
// outside PostgreSQL's sight: the backfill must give up, saying why, and
// leave the feed as it was, and the other session must then go on.
// Without the bound on the workers' lock waits all three wait for ever
// (here, until the test's deadline), and with them every captured writer
// of the feed.
func TestBackfillNewGenerationYields(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// other is the other session's work; then checks what it left.
		other func(ctx context.Context, e capEnv) error
		then  func(t *testing.T, e capEnv, gen feed.Generation, table string)
	}{
		{"to a TRUNCATE", func(ctx context.Context, e capEnv) error {
			_, err := e.d.pool.Exec(ctx, `TRUNCATE `+e.q("t"))
			return err
		}, func(t *testing.T, e capEnv, gen feed.Generation, table string) {
			if g, _ := e.head(t, "t"); g != gen+1 {
				t.Fatalf("generation %d after the TRUNCATE; want %d, the one before the backfill and the TRUNCATE's move", g, gen+1)
			}
			e.same(t, "a backfill that gave up, then a TRUNCATE", "t", e.want(t, table))
		}},
		{"to an Uncapture", func(ctx context.Context, e capEnv) error {
			found, err := e.s.Uncapture(ctx, "t")
			if err == nil && !found {
				err = errors.New("Uncapture found no capture")
			}
			return err
		}, func(t *testing.T, e capEnv, gen feed.Generation, _ string) {
			if g, h := e.head(t, "t"); g != gen || h != 0 {
				t.Fatalf("generation %d, head %d after the backfill gave up; want %d and 0, as before", g, h, gen)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			backfillYields(t, c.other, c.then)
		})
	}
}

func backfillYields(t *testing.T, other func(context.Context, capEnv) error, then func(*testing.T, capEnv, feed.Generation, string)) {
	e, table := backfillEnv(t, 100)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	key := pgfeed.WriteLockKey(e.s, "t")
	y, err := e.d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = y.Rollback(context.Background()) }()
	if _, err := y.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1::bigint)`, key); err != nil {
		t.Fatal(err)
	}
	// waiters waits until n sessions wait for the write lock exclusive.
	waiters := func(n int, what string) {
		deadline := time.Now().Add(20 * time.Second)
		for got := 0; got < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s never came to wait for the write lock", what)
			}
			if err := e.d.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
				AND mode = 'ExclusiveLock' AND (classid::bigint << 32 | objid::bigint) = $1::bigint`, key).Scan(&got); err != nil {
				t.Fatal(err)
			}
		}
	}
	gen, _ := e.head(t, "t")
	backfilled := make(chan error, 1)
	go func() {
		_, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", NewGeneration: true, Progress: func(pgfeed.BackfillProgress) {}})
		backfilled <- err
	}()
	waiters(1, "the backfill")
	done := make(chan error, 1)
	go func() { done <- other(ctx, e) }()
	waiters(2, "the other session")
	if err := y.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-backfilled
	var failed *feed.WriteFailedError
	if !errors.As(err, &failed) || !strings.Contains(err.Error(), "waited more than") {
		t.Fatalf("Backfill = %v; want a WriteFailedError saying a worker waited for a lock", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the other session: %v", err)
	}
	then(t, e, gen, table)
	var strays int
	if err := e.d.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.q("feed_stores")+` WHERE feed = 't' AND state = 'filling'`).Scan(&strays); err != nil {
		t.Fatal(err)
	}
	if strays != 0 {
		t.Fatalf("%d filling stores left; the failed copy's should be deleted", strays)
	}
}
