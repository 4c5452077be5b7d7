package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// scrape parses the daemon's /metrics at addr; nil while it does not answer.
func scrape(addr string) map[string]*dto.MetricFamily {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil
	}
	return fams
}

const tombstoneAge = "kairos_feed_oldest_tombstone_age_seconds"

// fileDaemon is a daemon's setting for tests of what it does to feeds: a
// migrated schema of the test's own, a config file (text, at cfg) giving
// each feed a file sink, polled every 100 ms, and the HTTP server on addr,
// with settings added at the top level; and a store on that schema, for
// the test's own writes.
type fileDaemon struct {
	schema, addr, text, cfg string
	pool                    *pgxpool.Pool
	st                      *pgfeed.Store
}

func newFileDaemon(t *testing.T, settings string, feeds ...feed.FeedName) fileDaemon {
	t.Helper()
	d := fileDaemon{schema: pgtest.Schema(t), addr: pgtest.ClosedPort(t)}
	dir := t.TempDir()
	d.text = fmt.Sprintf("database:\n  url: %s\n  schema: %s\nhttp:\n  listen: %s\n%sfeeds:\n", pgtest.URL(), d.schema, d.addr, settings)
	for _, f := range feeds {
		d.text += fmt.Sprintf("  %s:\n    poll_interval: 100ms\n    sinks:\n      file:\n        type: file\n        path: %s\n", f, filepath.Join(dir, string(f)+".jsonl"))
	}
	d.cfg = writeConfig(t, d.text)
	if code, _, stderr := kairos(t, "migrate", "-c", d.cfg); code != exitOK {
		t.Fatalf("migrate: %s", stderr)
	}
	d.pool = pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	st, err := pgfeed.New(t.Context(), d.pool, pgfeed.Options{Schema: d.schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	d.st = st
	return d
}

// The daemon shows each feed's oldest tombstone's age, for every write path
// that makes one: Write in the locked mode, Write in the concurrent mode
// (sealed by the daemon's own sealer) and a captured table's DELETE. A
// registered sink that never moves holds the tombstones back: their ages
// grow from scrape to scrape while the daemon's own sinks have long passed
// them. Once that sink is removed and the tombstones collected, the figure
// drops to 0, which is what a feed without tombstones shows. The daemon's
// own collection is off, so that the test's collection is what removes
// them (TestRunCollectsTombstones has the daemon do it).
func TestRunTombstoneAge(t *testing.T) {
	t.Parallel()
	feeds := []feed.FeedName{"locked", "concurrent", "captured"}
	d := newFileDaemon(t, "collect:\n  interval: 0s\n", feeds...)
	schema, addr, cfg, pool, st := d.schema, d.addr, d.cfg, d.pool, d.st
	ctx := t.Context()
	if err := st.SetWriteMode(ctx, "concurrent", feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	table := `"` + schema + `".items`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Capture(ctx, pgfeed.CaptureSpec{Feed: "captured", Schema: schema, Table: "items"}); err != nil {
		t.Fatal(err)
	}
	// The sink that never moves: registered, with its cursor at 0.
	for _, f := range feeds {
		if _, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".feed_cursors (feed, sink, generation, seq) VALUES ($1, 'offline', 1, 0)`, string(f)); err != nil {
			t.Fatal(err)
		}
	}
	write := func(f feed.FeedName, c feed.Change) {
		t.Helper()
		if _, err := st.WriteCommitted(ctx, f, []feed.Change{c}); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range feeds[:2] {
		write(f, feed.Put("a", []byte(`{}`)))
		write(f, feed.Put("b", []byte(`{}`)))
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` VALUES ('a'), ('b')`); err != nil {
		t.Fatal(err)
	}

	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, 1)
	logs := &syncWriter{}
	go func() { done <- run(dctx, []string{"run", "-c", cfg, "--tombstone-poll", "100ms"}, io.Discard, logs) }()
	// ages waits until every feed's figure satisfies ok and returns them.
	ages := func(what string, ok func(f feed.FeedName, age float64) bool) map[feed.FeedName]float64 {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			fams := scrape(addr)
			got := map[feed.FeedName]float64{}
			all := fams != nil
			for _, f := range feeds {
				v, there := value(fams, tombstoneAge, string(f), "")
				got[f] = v
				all = all && there && ok(f, v)
			}
			if all {
				return got
			}
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("%s: after 30s %s = %v; daemon log:\n%s", what, tombstoneAge, got, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ages("documents only", func(_ feed.FeedName, v float64) bool { return v == 0 })

	for _, f := range feeds[:2] {
		write(f, feed.Delete("a"))
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	first := ages("tombstones held back", func(_ feed.FeedName, v float64) bool { return v > 0 })
	// The daemon's own sinks pass the tombstones; the offline one holds them.
	for _, f := range feeds {
		if n, err := st.CollectTombstones(ctx, f); err != nil || n != 0 {
			t.Fatalf("CollectTombstones(%s) under the offline sink = %d, %v; want 0", f, n, err)
		}
	}
	time.Sleep(400 * time.Millisecond) // several reads
	later := ages("growing", func(f feed.FeedName, v float64) bool { return v >= first[f]+0.3 })
	for _, f := range feeds {
		if max := time.Since(deleted).Seconds() + 1; later[f] > max {
			t.Errorf("%s: the oldest tombstone is %.3fs old, more than the %.3fs since it was deleted", f, later[f], max)
		}
	}

	for _, f := range feeds {
		if _, err := st.RemoveSink(ctx, feed.SinkID{Feed: f, Sink: "offline"}); err != nil {
			t.Fatal(err)
		}
	}
	// The daemon's sinks passed the tombstones long ago (their cursors
	// are at the head); collection removes them.
	deadline := time.Now().Add(30 * time.Second)
	for _, f := range feeds {
		for {
			n, err := st.CollectTombstones(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: its tombstone was never collected", f)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ages("collected", func(_ feed.FeedName, v float64) bool { return v == 0 })
	stopInProcess(t, cancel, done, logs)
}
