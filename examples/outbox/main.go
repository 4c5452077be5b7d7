// Command outbox is the transactional outbox with Kairos: request handlers
// that each write an order and its feed row in one batch, one round trip, so
// that the row and the feed change commit together or not at all. The feed
// is in the concurrent write mode, which many writers of one feed need; a
// sync runner seals it and mirrors it into a JSON-lines file. One handler
// reads its own writes back (it answers only once the file has them), and at
// the end the example checks the file against the table, row for row.
//
// Sixteen handlers write a small key space on purpose, so that they often
// write the same order at the same time: the file ends equal to the table
// only because every handler follows the rule below (see writeOrder and
// deleteOrder).
//
// It runs against PostgreSQL (KAIROS_DATABASE_URL, default
// postgres://postgres@127.0.0.1:5432/postgres), in a schema of its own,
// kairos_outbox, which it drops and creates again, and drops at the end.
//
//	go run ./examples/outbox
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
var schema = "kairos_outbox"

const (
	feedName = feed.FeedName("orders")
	handlers = 16
	requests = 3200 // in all, requests/handlers per handler
	orderIDs = 400  // the key space: small, so that handlers collide
	// readBackEvery is how often handler 0 waits until the file holds its
	// write before it takes its next request: every readBackEvery-th one.
	readBackEvery = 10
)

var sinkID = feed.SinkID{Feed: feedName, Sink: "file"}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kairos-outbox-")
	if err == nil {
		err = run(ctx, os.Getenv("KAIROS_DATABASE_URL"), dir)
		_ = os.RemoveAll(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(1)
	}
}

// order is a row of the application's table; its feed document is the row
// as JSON.
type order struct {
	ID     int    `json:"id"`
	Total  int64  `json:"total"` // in cents
	Status string `json:"status"`
}

func (o order) key() feed.Key { return feed.Key(fmt.Sprint(o.ID)) }

func (o order) doc() json.RawMessage {
	d, _ := json.Marshal(o) // three plain fields: cannot fail
	return d
}

func run(ctx context.Context, url, dir string) error {
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	// A connection per handler, and some for the runner: its worker, its
	// sealer and its listener.
	cfg.MaxConns = handlers + 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	// The application's table, and a function its update statement calls
	// to fail when the order is gone (see updateOrder).
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE; CREATE SCHEMA `+schema+`;
		CREATE TABLE `+schema+`.orders (id int PRIMARY KEY, total bigint NOT NULL, status text NOT NULL);
		CREATE FUNCTION `+schema+`.order_found(n bigint, id int) RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			IF n = 0 THEN
				RAISE EXCEPTION 'order % not found', id USING ERRCODE = 'no_data_found';
			END IF;
		END $$`); err != nil {
		return err
	}
	defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) }()

	// 1. The feed store in the same schema, the feed in the concurrent
	// write mode, and a runner that seals it and mirrors it into a file.
	opts := pgfeed.Options{Schema: schema, Logger: slog.New(slog.DiscardHandler)}
	if _, err := pgfeed.Migrate(ctx, pool, opts); err != nil {
		return err
	}
	feeds, err := pgfeed.New(ctx, pool, opts)
	if err != nil {
		return err
	}
	defer feeds.Close()
	if err := feeds.SetWriteMode(ctx, feedName, feed.WriteConcurrent); err != nil {
		return err
	}
	path := filepath.Join(dir, "orders.jsonl")
	sink, err := file.New(file.Options{Path: path})
	if err != nil {
		return err
	}
	defer sink.Close()
	runner, err := syncer.NewRunner(feeds, []syncer.Target{{ID: sinkID, Sink: sink}},
		syncer.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	rctx, stopRunner := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- runner.Run(rctx) }()
	defer func() { stopRunner(); <-ran }()
	// A deployed runner is up before requests come: wait until it has
	// taken the sink and found nothing to do, so handler 0's first wait
	// does not count its start.
	if err := idle(ctx, runner); err != nil {
		return err
	}
	fmt.Fprintf(out, "1. feed %s in the %s write mode, mirrored into %s\n", feedName, feed.WriteConcurrent, filepath.Base(path))

	// 2. The request handlers.
	app := &app{pool: pool, feeds: feeds}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, handlers)
	for h := range handlers {
		wg.Go(func() { errs[h] = app.handle(ctx, h) })
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	commits := app.puts.Load() + app.updates.Load() + app.deletes.Load()
	fmt.Fprintf(out, "2. %d handlers sent %d requests, each as one batch: %d puts, %d updates, %d deletes committed;\n",
		handlers, requests, app.puts.Load(), app.updates.Load(), app.deletes.Load())
	fmt.Fprintf(out, "   %d updates found their order deleted and failed, their feed writes undone with them\n", app.gone.Load())
	fmt.Fprintf(out, "   %d commits in %v: %.0f commits/s\n", commits, took.Round(time.Millisecond), float64(commits)/took.Seconds())
	slices.Sort(app.readBack)
	if n := len(app.readBack); n > 0 {
		fmt.Fprintf(out, "   handler 0 read %d of its writes back from the file: p50 %v, max %v from commit to file\n",
			n, app.readBack[n/2].Round(100*time.Microsecond), app.readBack[n-1].Round(100*time.Microsecond))
	}

	// 3. Once everything is sealed and applied, the file is the table.
	if err := caughtUp(ctx, feeds, runner); err != nil {
		return err
	}
	return compare(ctx, pool, path)
}

// app is the application: its handlers and what they counted.
type app struct {
	pool  *pgxpool.Pool
	feeds *pgfeed.Store

	puts, updates, deletes, gone atomic.Int64
	readBack                     []time.Duration // handler 0's only
}

// handle is one request handler's loop: its share of the requests, each an
// order written, updated or deleted. Handler 0 answers every readBackEvery-th
// request only once the file holds its write (read your writes).
func (a *app) handle(ctx context.Context, h int) error {
	rnd := rand.New(rand.NewPCG(uint64(h), 42))
	for i := range requests / handlers {
		o := order{ID: 1 + rnd.IntN(orderIDs), Total: int64(rnd.IntN(100000)), Status: "new"}
		var res feed.WriteResult
		done := func(r feed.WriteResult) { res = r }
		var err error
		switch p := rnd.IntN(10); {
		case p < 5:
			err = a.putOrder(ctx, o, done)
			if err == nil {
				a.puts.Add(1)
			}
		case p < 8:
			o.Status = [...]string{"paid", "shipped", "delivered"}[rnd.IntN(3)]
			err = a.updateOrder(ctx, o, done)
			var pg *pgconn.PgError
			switch {
			case errors.As(err, &pg) && pg.Code == "P0002": // no_data_found, from order_found
				a.gone.Add(1)
				continue // nothing committed, the feed write neither
			case err == nil:
				a.updates.Add(1)
			}
		default:
			err = a.deleteOrder(ctx, o.ID, done)
			if err == nil {
				a.deletes.Add(1)
			}
		}
		if err != nil {
			return fmt.Errorf("handler %d, request %d (order %d): %w", h, i, o.ID, err)
		}
		if h == 0 && i%readBackEvery == 0 {
			// done has run: SendBatch's Close read the write's result.
			start := time.Now()
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			r, err := syncer.WaitApplied(wctx, a.feeds, sinkID, res, syncer.WaitOptions{})
			cancel()
			if err != nil {
				return fmt.Errorf("handler 0 waiting for order %d in the file: %w", o.ID, err)
			}
			if r.Outcome != syncer.OutcomeApplied {
				return fmt.Errorf("handler 0 waiting for order %d in the file: %s", o.ID, r.Outcome)
			}
			a.readBack = append(a.readBack, time.Since(start))
		}
	}
	return nil
}

// The rule for writing the feed yourself: the application's own statement
// must lock the order's row before the feed write in the same transaction.
// Two transactions that write one order then reach the feed in the order in
// which they changed the table, because the second waits for the first's
// row lock, and so for its commit, before it writes the feed. Without the
// lock the feed's order of two writes need not be the table's, and the file
// can end with the other one's version.
//
// Each handler's batch is sent on the pool outside an explicit transaction:
// PostgreSQL runs the whole batch as one implicit transaction, so the
// table's statement and the feed write commit together, or a failure of
// either undoes both.

// putOrder writes o, a new order or a replacement, in one round trip. The
// upsert locks the row whether it inserts it or finds it, and sets every
// column from o, so the row holds exactly the document queued with it.
func (a *app) putOrder(ctx context.Context, o order, done func(feed.WriteResult)) error {
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO `+schema+`.orders (id, total, status) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET total = excluded.total, status = excluded.status`, o.ID, o.Total, o.Status)
	if err := a.feeds.QueueWrite(b, feedName, []feed.Change{feed.Put(o.key(), o.doc())}, done); err != nil {
		return err
	}
	return a.pool.SendBatch(ctx, b).Close()
}

// updateOrder sets an existing order's total and status. An UPDATE that
// finds the row locks it, but one that does not would leave the feed write
// after it with a document for an order the table lacks: order_found makes
// the statement fail instead, and the whole batch with it, the feed write
// included. (A client-side check of the result would come too late: the
// batch's implicit transaction commits when the server reaches its end.)
func (a *app) updateOrder(ctx context.Context, o order, done func(feed.WriteResult)) error {
	b := &pgx.Batch{}
	b.Queue(`WITH u AS (UPDATE `+schema+`.orders SET total = $2, status = $3 WHERE id = $1 RETURNING id)
		SELECT `+schema+`.order_found(count(*), $1) FROM u`, o.ID, o.Total, o.Status)
	if err := a.feeds.QueueWrite(b, feedName, []feed.Change{feed.Put(o.key(), o.doc())}, done); err != nil {
		return err
	}
	return a.pool.SendBatch(ctx, b).Close()
}

// deleteOrder deletes order id. A plain DELETE that finds no row locks
// nothing: against a handler inserting the same order at that moment (not
// committed yet, so invisible to the DELETE), the table would keep the
// insert while the feed, its tombstone written after the insert's row,
// ends with the deletion. So the batch takes the row first: the upsert
// inserts a placeholder or, finding the row, locks it without changing it
// (DO UPDATE ... WHERE false locks the row it updates nothing of; DO
// NOTHING would not lock it), and the DELETE then deletes the row this
// transaction holds.
func (a *app) deleteOrder(ctx context.Context, id int, done func(feed.WriteResult)) error {
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO `+schema+`.orders (id, total, status) VALUES ($1, 0, 'deleting')
		ON CONFLICT (id) DO UPDATE SET status = excluded.status WHERE false`, id)
	b.Queue(`DELETE FROM `+schema+`.orders WHERE id = $1`, id)
	if err := a.feeds.QueueWrite(b, feedName, []feed.Change{feed.Delete(order{ID: id}.key())}, done); err != nil {
		return err
	}
	return a.pool.SendBatch(ctx, b).Close()
}

// idle waits until the runner's worker is idle: it holds the sink and has
// sent all there was.
func idle(ctx context.Context, runner *syncer.Runner) error {
	deadline := time.Now().Add(30 * time.Second)
	for runner.States()[0].Phase != syncer.PhaseIdle {
		if time.Now().After(deadline) {
			return fmt.Errorf("the runner is not idle after 30s: %s", runner.States()[0].Phase)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// caughtUp waits until the sealer has sealed every write (in the concurrent
// mode a commit is not in the feed's seq order until then) and the file
// holds the feed up to its head. Every handler has returned, so nothing new
// comes meanwhile.
func caughtUp(ctx context.Context, feeds *pgfeed.Store, runner *syncer.Runner) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
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
			return fmt.Errorf("%d orders still unsealed: %w", d.Unsealed, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	_, err := runner.WaitCaughtUp(ctx)
	return err
}

// compare reads the file back and checks it against the table: every order
// of the table in the file with an equal document, and no other key there.
func compare(ctx context.Context, pool *pgxpool.Pool, path string) error {
	got, err := file.Read(path)
	if err != nil {
		return err
	}
	rows, err := pool.Query(ctx, `SELECT id, total, status FROM `+schema+`.orders`)
	if err != nil {
		return err
	}
	want, err := pgx.CollectRows(rows, pgx.RowToStructByPos[order])
	if err != nil {
		return err
	}
	var diffs []string
	inTable := map[feed.Key]bool{}
	for _, o := range want {
		inTable[o.key()] = true
		d, ok := got[o.key()]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%d: table %s, file none", o.ID, o.doc()))
			continue
		}
		var f order
		if err := json.Unmarshal(d, &f); err != nil || f != o {
			diffs = append(diffs, fmt.Sprintf("%d: table %s, file %s", o.ID, o.doc(), d))
		}
	}
	for k, d := range got {
		if !inTable[k] {
			diffs = append(diffs, fmt.Sprintf("%s: table none, file %s", k, d))
		}
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		shown := diffs[:min(len(diffs), 5)]
		return fmt.Errorf("the file differs from the table in %d keys: %s", len(diffs), strings.Join(shown, "; "))
	}
	fmt.Fprintf(out, "3. the file holds the table's %d orders exactly, and none of the %d ids the table lacks\n", len(want), orderIDs-len(want))
	return nil
}
