// Command capture mirrors a plain table into a JSON-lines file without
// touching the code that writes the table: pgfeed.Capture installs triggers
// that write the table's feed in each writing transaction, Backfill copies
// the rows that were there before, and a sync runner keeps the file in
// step. Writers keep writing plain SQL throughout; half-way, the feed is
// rebuilt from the table into a new generation (a table-shaped rebuild) and
// the file is refilled and swapped in at once. At the end it checks that the
// file holds exactly the table's rows.
//
// It runs against PostgreSQL (KAIROS_DATABASE_URL, default
// postgres://postgres@127.0.0.1:5432/postgres), in a schema of its own,
// kairos_capture, which it drops and creates again, and drops at the end.
// With -concurrent the feed is in the concurrent write mode, where the
// trigger records only the keys each statement touched and the runner's
// sealer reads their rows from the table (the pgfeed package doc, # Keyed
// capture): what a table with many writers, or with large UPDATEs, wants.
//
//	go run ./examples/capture [-concurrent]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/syncer"
)

// out is where the example prints; its test captures it.
var out io.Writer = os.Stdout

// schema is the example's own, dropped and created again at every run; its
// test runs in one of its own, so that two runs at once cannot meet.
var schema = "kairos_capture"

// concurrent puts the feed in the concurrent write mode (-concurrent).
var concurrent bool

const (
	feedName = feed.FeedName("products")
	rows     = 5000
)

func main() {
	flag.BoolVar(&concurrent, "concurrent", false, "capture into a feed in the concurrent write mode (keys recorded, rows read by the sealer)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kairos-capture-")
	if err == nil {
		err = run(ctx, os.Getenv("KAIROS_DATABASE_URL"), dir)
		_ = os.RemoveAll(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "capture:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, dir string) error {
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()

	// The application's table, with rows written before Kairos was there.
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE; CREATE SCHEMA `+schema+`;
		CREATE TABLE `+schema+`.products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL, internal_note text);
		INSERT INTO `+schema+`.products SELECT i, 'product ' || i, i % 100 + 0.99, 'not for the mirror'
		FROM generate_series(1, `+fmt.Sprint(rows)+`) AS i`); err != nil {
		return err
	}
	defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) }()

	// 1. The feed store, and the capture: one call, idempotent.
	opts := pgfeed.Options{Schema: schema, Logger: slog.New(slog.DiscardHandler)}
	if _, err := pgfeed.Migrate(ctx, pool, opts); err != nil {
		return err
	}
	feeds, err := pgfeed.New(ctx, pool, opts)
	if err != nil {
		return err
	}
	defer feeds.Close()
	mode := feed.WriteLocked
	if concurrent {
		mode = feed.WriteConcurrent
	}
	if err := feeds.SetWriteMode(ctx, feedName, mode); err != nil {
		return err
	}
	info, err := feeds.Capture(ctx, pgfeed.CaptureSpec{
		Feed: feedName, Schema: schema, Table: "products",
		Exclude: []string{"internal_note"},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "1. captured %s.%s into feed %s (%s write mode), keyed on %v\n", info.Schema, info.Table, info.Feed, mode, info.Key)

	// 2. A sink and a runner that mirror the feed into a file.
	path := filepath.Join(dir, "products.jsonl")
	sink, err := file.New(file.Options{Path: path})
	if err != nil {
		return err
	}
	defer sink.Close()
	runner, err := syncer.NewRunner(feeds, []syncer.Target{{ID: feed.SinkID{Feed: feedName, Sink: "file"}, Sink: sink}},
		syncer.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	rctx, stopRunner := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- runner.Run(rctx) }()
	defer func() { stopRunner(); <-ran }()

	// 3. Writers that know nothing of Kairos: plain SQL, from now to the end.
	// They are stopped between two statements, never by cancelling one: the
	// driver returns from a cancelled statement at once and asks the server
	// to cancel it over a connection of its own, so the statement may still
	// commit (its trigger having waited for the feed lock, say) after its
	// writer returned, and change the table under the check at the end.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var werr error
	var once sync.Once
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for !stop.Load() {
				id := 1 + rnd.IntN(rows+500)
				var err error
				switch rnd.IntN(5) {
				case 0:
					_, err = pool.Exec(ctx, `DELETE FROM `+schema+`.products WHERE id = $1`, id)
				case 1:
					_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.products VALUES ($1::int, 'new ' || $1::int, 9.99, 'x')
						ON CONFLICT (id) DO UPDATE SET name = 'renamed ' || $1::int`, id)
				default:
					_, err = pool.Exec(ctx, `UPDATE `+schema+`.products SET price = price + 1 WHERE id BETWEEN $1::int AND $1::int + 9`, id)
				}
				if err != nil {
					once.Do(func() { werr = err })
					return
				}
			}
		}()
	}
	stopWriters := func() { stop.Store(true); wg.Wait() }
	defer stopWriters()

	// 4. Backfill the rows that were there before the capture, in place,
	// while the writers write.
	progress := func(p pgfeed.BackfillProgress) {
		if p.Done {
			fmt.Fprintf(out, "   backfilled %d rows at %.0f rows/s\n", p.Rows, p.Rate)
		}
	}
	res, err := feeds.Backfill(ctx, pgfeed.BackfillOptions{Feed: feedName, Progress: progress})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "2. backfill in place: feed at generation %d\n", res.Generation)

	// 5. A table-shaped rebuild, half-way: the feed moves to a new
	// generation filled from the table; the runner fills a fresh file and
	// swaps it in.
	time.Sleep(300 * time.Millisecond)
	res, err = feeds.Backfill(ctx, pgfeed.BackfillOptions{Feed: feedName, NewGeneration: true, Progress: progress})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "3. rebuild: feed at generation %d\n", res.Generation)
	time.Sleep(300 * time.Millisecond)
	// Every writer's last statement has been answered, so none is still
	// running on the server: nothing changes the table from here on.
	stopWriters()
	if werr != nil {
		return fmt.Errorf("a writer failed: %w", werr)
	}

	// 6. Once the sealer has sealed every write (in the concurrent mode a
	// commit has no seq before) and the runner has caught up, the file is
	// the table.
	for {
		d, err := feeds.Describe(ctx, feedName)
		if err != nil {
			return err
		}
		if d.Unsealed == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d keys still unsealed: %w", d.Unsealed, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	caught, err := runner.WaitCaughtUp(ctx)
	if err != nil {
		return err
	}
	for _, c := range caught {
		if c.Outcome != syncer.OutcomeApplied {
			return fmt.Errorf("sink %s did not apply the feed up to its head: %s (cursor %v, parked %v)", c.ID, c.Outcome, c.Cursor, c.Parked)
		}
	}
	got, err := file.Read(path)
	if err != nil {
		return err
	}
	want := map[string]any{}
	r, err := pool.Query(ctx, `SELECT id::text, to_jsonb(p) - 'internal_note' FROM `+schema+`.products AS p`)
	if err != nil {
		return err
	}
	for r.Next() {
		var k string
		var doc any
		if err := r.Scan(&k, &doc); err != nil {
			return err
		}
		want[k] = doc
	}
	if err := r.Err(); err != nil {
		return err
	}
	var diff []string
	for k, d := range got {
		var doc any
		if err := json.Unmarshal(d, &doc); err != nil {
			return err
		}
		if !reflect.DeepEqual(doc, want[string(k)]) {
			diff = append(diff, fmt.Sprintf("%s: file %s, table %v", k, d, want[string(k)]))
		}
	}
	for k, d := range want {
		if _, ok := got[feed.Key(k)]; !ok {
			diff = append(diff, fmt.Sprintf("%s: file none, table %v", k, d))
		}
	}
	if len(diff) > 0 {
		sort.Strings(diff)
		return fmt.Errorf("the file differs from the table in %d keys: %s", len(diff), strings.Join(diff[:min(len(diff), 5)], "; "))
	}
	fmt.Fprintf(out, "4. the file holds the table's %d rows exactly\n", len(want))
	return nil
}
