package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/metrics"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

const collectedTotal = "kairos_feed_tombstones_collected_total"

// kairos run collects tombstones on its own, every collect.interval, and
// only those safe to collect. Three feeds, each with the daemon's file
// sink: "orders" has no other sink, so its deletes' tombstones go once the
// sink passes them; "held" has a second registered sink that never moves,
// which keeps them; "parked" has a second sink that has passed them but
// parked one deleted key, which keeps that key's tombstone and no other. Once the sink that never
// moves is removed (and a reload that turned collection off has been
// undone by another), "held"'s tombstones go too, with no kairos collect
// run, and the oldest tombstone's age drops to 0.
func TestRunCollectsTombstones(t *testing.T) {
	t.Parallel()
	feeds := []feed.FeedName{"orders", "held", "parked"}
	d := newFileDaemon(t, "log:\n  level: debug\ncollect:\n  interval: 200ms\n", feeds...)
	schema, addr, text, cfg, pool, st := d.schema, d.addr, d.text, d.cfg, d.pool, d.st
	ctx := t.Context()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO "` + schema + `".feed_cursors (feed, sink, generation, seq) VALUES ('held', 'offline', 1, 0)`)
	for _, f := range feeds {
		if _, err := st.WriteCommitted(ctx, f, []feed.Change{feed.Put("a", []byte(`{}`)), feed.Put("b", []byte(`{}`)), feed.Put("c", []byte(`{}`))}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.WriteCommitted(ctx, f, []feed.Change{feed.Delete("a"), feed.Delete("b")}); err != nil {
			t.Fatal(err)
		}
	}
	// "parked" has a second sink, one that has passed every delete but
	// parked a's, as its rejection of the delete would leave it.
	exec(`INSERT INTO "` + schema + `".feed_cursors (feed, sink, generation, seq) SELECT feed, 'rejecting', generation, head FROM "` + schema + `".feed_generations WHERE feed = 'parked'`)
	exec(`INSERT INTO "` + schema + `".feed_parked (feed, sink, key, seq, reason, parked_at) SELECT feed, 'rejecting', key, seq, 'rejected', now() FROM "` + schema + `".feed_rows WHERE feed = 'parked' AND key = 'a'`)
	tombstones := func(f feed.FeedName) string {
		t.Helper()
		var keys string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(key, ',' ORDER BY key), '') FROM "`+schema+`".feed_rows WHERE feed = $1 AND doc IS NULL`, string(f)).Scan(&keys); err != nil {
			t.Fatal(err)
		}
		return keys
	}

	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, 1)
	logs := &syncWriter{}
	go func() {
		done <- run(dctx, []string{"run", "-c", cfg, "--tombstone-poll", "100ms", "--config-poll", "100ms"}, io.Discard, logs)
	}()
	metric := func(name string, f feed.FeedName) float64 {
		v, _ := value(scrape(addr), name, string(f), "")
		return v
	}
	waitFor(t, "orders' tombstones collected by the daemon", 30*time.Second, func() bool {
		return tombstones("orders") == "" && metric(collectedTotal, "orders") == 2
	}, logs)
	// Every sink of the daemon has passed its feed's deletes.
	waitFor(t, "the daemon's sinks past their feeds' rows", 30*time.Second, func() bool {
		var behind int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::text[]) AS f(feed) LEFT JOIN "`+schema+`".feed_cursors c ON c.feed = f.feed AND c.sink = 'file'
WHERE c.seq IS NULL OR c.seq < (SELECT max(seq) FROM "`+schema+`".feed_rows r WHERE r.feed = f.feed)`, []string{"orders", "held", "parked"}).Scan(&behind); err != nil {
			t.Fatal(err)
		}
		return behind == 0
	}, logs)
	waitFor(t, "the parked feed's unparked tombstone collected", 30*time.Second, func() bool {
		return tombstones("parked") == "a" && metric(collectedTotal, "parked") == 1
	}, logs)
	// Several collections later, what is held back is still there.
	time.Sleep(time.Second)
	if got := tombstones("held"); got != "a,b" {
		t.Fatalf("held's tombstones = %q, want a,b kept while the offline sink has not passed them; daemon log:\n%s", got, logs.String())
	}
	if got := tombstones("parked"); got != "a" {
		t.Fatalf("parked's tombstones = %q, want a, kept while it is parked; daemon log:\n%s", got, logs.String())
	}
	if v := metric(collectedTotal, "held"); v != 0 {
		t.Errorf("%s{held} = %v while nothing was collected", collectedTotal, v)
	}
	if v := metric(tombstoneAge, "held"); v <= 0 {
		t.Errorf("%s{held} = %v with its tombstones held back", tombstoneAge, v)
	}
	waitFor(t, "orders' oldest tombstone age back to 0", 10*time.Second, func() bool {
		v, ok := value(scrape(addr), tombstoneAge, "orders", "")
		return ok && v == 0
	}, logs)

	// A reload turns collection off: with the offline sink gone, held's
	// tombstones could go, and stay. A reload turning it on again
	// collects them.
	reload := func(interval string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(strings.Replace(text, "interval: 200ms", "interval: "+interval, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the reload to collect.interval "+interval, 30*time.Second, func() bool {
			return strings.Contains(logs.String(), `msg="reload: collect.interval changed" interval=`+interval)
		}, logs)
	}
	reload("0s")
	time.Sleep(100 * time.Millisecond) // a collection under way when it applied ends
	if _, err := st.RemoveSink(ctx, feed.SinkID{Feed: "held", Sink: "offline"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if got := tombstones("held"); got != "a,b" {
		t.Fatalf("held's tombstones = %q with collection turned off, want a,b; daemon log:\n%s", got, logs.String())
	}
	reload("150ms")
	waitFor(t, "held's tombstones collected once the offline sink is gone", 30*time.Second, func() bool {
		v, ok := value(scrape(addr), tombstoneAge, "held", "")
		return tombstones("held") == "" && metric(collectedTotal, "held") == 2 && ok && v == 0
	}, logs)
	stopInProcess(t, cancel, done, logs)
	out := logs.String()
	for _, want := range []string{`msg="tombstones collected" feed=orders count=2`, `msg="tombstones collected" feed=held count=2`, `msg="no tombstones to collect"`, "collect_interval=200ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("the daemon's log has no %q:\n%s", want, out)
		}
	}
}

// collectEnv is a migrated store with one feed, for collections raced
// against each other and against writers.
func collectEnv(t *testing.T) (*pgfeed.Store, *pgxpool.Pool, string) {
	t.Helper()
	schema := pgtest.Schema(t)
	pool := pgtest.PoolWith(t, pgtest.URL(), func(c *pgxpool.Config) { c.MaxConns = 12 })
	if _, err := pgfeed.Migrate(t.Context(), pool, pgfeed.Options{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	st, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, pool, schema
}

// tombstoned writes keys as documents, deletes them, and moves sink s of f
// past the deletes: every one of them is a tombstone safe to collect.
func tombstoned(t *testing.T, st *pgfeed.Store, pool *pgxpool.Pool, schema string, f feed.FeedName, keys []feed.Key) {
	t.Helper()
	var puts, dels []feed.Change
	for _, k := range keys {
		puts = append(puts, feed.Put(k, []byte(`{}`)))
		dels = append(dels, feed.Delete(k))
	}
	for _, cs := range [][]feed.Change{puts, dels} {
		if _, err := st.WriteCommitted(t.Context(), f, cs); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(t.Context(), `INSERT INTO "`+schema+`".feed_cursors (feed, sink, generation, seq)
SELECT feed, 's', generation, head FROM "`+schema+`".feed_generations WHERE feed = $1
ON CONFLICT (feed, sink) DO UPDATE SET seq = excluded.seq`, string(f)); err != nil {
		t.Fatal(err)
	}
}

// Daemons over one database each collect, on their own schedules, so
// collections meet each other and the application's writes. Each round
// here runs two collections against a transaction that writes a third of
// the tombstoned keys back, in the opposite order to the collections'.
// None fails: a collection never waits on a row (it skips what another
// holds), so it can never deadlock with a writer, and PostgreSQL never
// has to fail the application's write to break one. Every tombstone is
// deleted once: the counts add up to what went, give or take keys written
// back after their collection, and every key written back is a document.
func TestConcurrentCollections(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, pool, schema := collectEnv(t)
	const f, rounds, keys = feed.FeedName("orders"), 40, 300
	for round := range rounds {
		var ks []feed.Key
		for i := range keys {
			ks = append(ks, feed.Key(fmt.Sprintf("r%02d-k%04d", round, i)))
		}
		tombstoned(t, st, pool, schema, f, ks)
		var back []feed.Change
		for i := keys - 1; i >= 0; i -= 3 {
			back = append(back, feed.Put(ks[i], []byte(`{"back":true}`)))
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var counts []int
		var errs []error
		for range 2 {
			wg.Go(func() {
				n, err := st.CollectTombstones(ctx, f)
				mu.Lock()
				defer mu.Unlock()
				counts, errs = append(counts, n), append(errs, err)
			})
		}
		wg.Go(func() {
			_, err := st.WriteCommitted(ctx, f, back)
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err)
		})
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		// What a collection skipped, a later one takes.
		n, err := st.CollectTombstones(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		counts = append(counts, n)
		var gone, docs int
		if err := pool.QueryRow(ctx, `SELECT $2::int - count(*), count(*) FILTER (WHERE doc IS NOT NULL) FROM "`+schema+`".feed_rows WHERE feed = $1 AND key LIKE $3`,
			string(f), keys, fmt.Sprintf("r%02d-%%", round)).Scan(&gone, &docs); err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, n := range counts {
			total += n
		}
		// A key collected and then written back counts as collected and
		// is a document again: each collected key is gone or back.
		if docs != len(back) || total < gone || total > gone+docs || gone+docs != keys {
			t.Fatalf("round %d: collections counted %v (%d); %d tombstones went, %d keys written back are documents (want %d), of %d keys",
				round, counts, total, gone, docs, len(back), keys)
		}
	}
}

// A collection does not wait for a tombstone another transaction holds (a
// writer's, or another daemon's collection): it leaves it, and takes it
// once it is free.
func TestCollectionSkipsALockedTombstone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, pool, schema := collectEnv(t)
	const f = feed.FeedName("orders")
	tombstoned(t, st, pool, schema, f, []feed.Key{"a", "b", "c"})
	hold, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(context.Background())
	if _, err := hold.Exec(ctx, `SELECT 1 FROM "`+schema+`".feed_rows WHERE feed = $1 AND key = 'b' FOR UPDATE`, string(f)); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if n, err := st.CollectTombstones(cctx, f); err != nil || n != 2 {
		t.Fatalf("CollectTombstones while b is held = %d, %v; want 2 (a and c), at once", n, err)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := st.CollectTombstones(ctx, f); err != nil || n != 1 {
		t.Fatalf("CollectTombstones once b is free = %d, %v; want 1", n, err)
	}
}

// The collector runs nothing while collect.interval is 0, starts when a
// reload sets one, stops again when a reload sets 0, and a failed
// collection is logged and counted without stopping it.
func TestCollectorInterval(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	c := newCollector(0)
	c.feeds = func() []feed.FeedName { return []feed.FeedName{"orders"} }
	c.counts = metrics.NewCollections()
	logs := &syncWriter{}
	c.log = slog.New(slog.NewTextHandler(logs, nil))
	c.url = "postgres://kairos:hunter2@db/app"
	c.collect = func(context.Context, feed.FeedName) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return 0, errors.New("connecting to postgres://kairos:hunter2@db/app: refused")
		}
		return 1, nil
	}
	n := func() int { mu.Lock(); defer mu.Unlock(); return calls }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.run(ctx) }()
	time.Sleep(300 * time.Millisecond)
	if got := n(); got != 0 {
		t.Fatalf("%d collections with collect.interval 0", got)
	}
	c.setInterval(20 * time.Millisecond)
	waitFor(t, "collections once an interval is set, past a failed one", 10*time.Second, func() bool { return n() >= 3 }, logs)
	c.setInterval(0)
	time.Sleep(100 * time.Millisecond) // a collection under way ends
	stopped := n()
	time.Sleep(300 * time.Millisecond)
	if got := n(); got != stopped {
		t.Errorf("%d collections after collect.interval was set back to 0", got-stopped)
	}
	cancel()
	<-done
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.counts)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, fam := range fams {
		got[fam.GetName()] = fam.GetMetric()[0].GetCounter().GetValue()
	}
	if got["kairos_feed_tombstone_collection_errors_total"] != 1 || got[collectedTotal] != float64(stopped-1) {
		t.Errorf("counters = %v; want 1 error and %d collected", got, stopped-1)
	}
	out := logs.String()
	if !strings.Contains(out, "collecting tombstones failed") || strings.Contains(out, "hunter2") {
		t.Errorf("the failed collection's log line is missing, or shows the password:\n%s", out)
	}
}
