package pgtable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/sinks/pgtable"
	"github.com/kairos-es/kairos/syncer"
)

// recorded wraps the sink so that every table that serves or will serve
// readers carries the test's recording trigger (LIKE does not copy triggers),
// and remembers which tables were published.
type recorded struct {
	*pgtable.Sink
	tg *target
	t  *testing.T

	mu        sync.Mutex
	published []uint32 // oids of the tables that served readers, in order
}

func (r *recorded) attach(table string) {
	r.tg.exec(r.t, `CREATE TRIGGER record AFTER INSERT OR UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION "`+r.tg.schema+`".record()`)
}

func (r *recorded) markLive() {
	var oid uint32
	if err := r.tg.read.QueryRow(context.Background(), `SELECT $1::regclass::oid`, r.Table()).Scan(&oid); err != nil {
		r.t.Errorf("reading the live table's oid: %v", err)
	}
	r.mu.Lock()
	r.published = append(r.published, oid)
	r.mu.Unlock()
}

func (r *recorded) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	rt, err := r.Sink.OpenResync(ctx, g)
	if err != nil {
		return nil, err
	}
	r.attach(rt.(*pgtable.Resync).Table())
	return &recordedResync{ResyncTarget: rt, r: r}, nil
}

type recordedResync struct {
	feed.ResyncTarget
	r *recorded
}

func (rr *recordedResync) Publish(ctx context.Context) error {
	if err := rr.ResyncTarget.Publish(ctx); err != nil {
		return err
	}
	rr.r.markLive()
	return nil
}

// TestEndToEnd: pgfeed → syncer.Runner → pgtable, in two databases' worth of
// pools: 10k changes with deletes, a rebuild mid-stream and an outage of the
// target in the middle. The table ends with exactly the feed's live
// documents, and the trigger's log shows no key of a served table ever going
// back to an older seq.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// The feed, in a schema and on a pool of its own.
	store, fpool := pgtest.FeedStore(t, ctx, pgfeed.Options{})

	// The target, with its recording trigger.
	tg := newTarget(t)
	tg.exec(t, `CREATE TABLE "`+tg.schema+`".log (id bigserial PRIMARY KEY, rel oid NOT NULL, key text NOT NULL, seq bigint NOT NULL)`)
	tg.exec(t, `CREATE FUNCTION "`+tg.schema+`".record() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO "`+tg.schema+`".log (rel, key, seq) VALUES (TG_RELID, NEW.key, NEW.seq); RETURN NULL; END $$`)
	sink := &recorded{Sink: tg.sink(t, pgtable.Options{Table: "orders", Create: true, Columns: []pgtable.Column{{Name: "n", Type: pgtable.TypeBigint}}}), tg: tg, t: t}
	sink.attach(sink.Table())
	sink.markLive()

	const f = feed.FeedName("orders")
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: feed.SinkID{Feed: f, Sink: "table"}, Sink: sink}}, syncer.Options{
		BatchSize: 500, PollInterval: 50 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	defer func() { stop(); <-done }()

	rng := rand.New(rand.NewPCG(11, 0))
	live := map[feed.Key]json.RawMessage{}
	written := 0
	write := func(changes []feed.Change) {
		t.Helper()
		if _, err := store.WriteCommitted(ctx, f, changes); err != nil {
			t.Fatalf("WriteCommitted: %v", err)
		}
		written += len(changes)
	}
	round := func() {
		changes := make([]feed.Change, 0, 100)
		seen := map[feed.Key]bool{}
		for len(changes) < 100 {
			k := feed.Key(fmt.Sprintf("order/%04d", rng.IntN(1500)))
			if seen[k] {
				continue
			}
			seen[k] = true
			if _, ok := live[k]; ok && rng.IntN(4) == 0 {
				delete(live, k)
				changes = append(changes, feed.Delete(k))
				continue
			}
			d := json.RawMessage(fmt.Sprintf(`{"n":%d,"note":"v%d ü"}`, rng.Int64(), written))
			live[k] = d
			changes = append(changes, feed.Put(k, d))
		}
		write(changes)
	}
	for range 40 {
		round()
	}
	// The first resync publishes before the rebuild, so the rebuild's is a
	// second one: on a loaded machine the rebuild could otherwise land while
	// the first still fills, which then restarts in the new generation and
	// counts once.
	if _, err := runner.WaitCaughtUp(ctx); err != nil {
		t.Fatalf("WaitCaughtUp before the rebuild: %v", err)
	}
	// A rebuild: the feed moves to a new generation, emptied, and the
	// application writes its live documents again.
	if err := pgx.BeginFunc(ctx, fpool, func(tx pgx.Tx) error { _, err := store.ResetTx(ctx, tx, f); return err }); err != nil {
		t.Fatalf("ResetTx: %v", err)
	}
	var all []feed.Change
	for k, d := range live {
		all = append(all, feed.Put(k, d))
	}
	for len(all) > 0 {
		n := min(len(all), 100)
		write(all[:n])
		all = all[n:]
	}
	for range 10 {
		round()
	}
	// An outage of the target while the resync and the writes go on.
	restore := tg.fault(t)
	for range 20 {
		round()
	}
	// The worker meets the outage before it ends.
	for st := runner.States()[0]; st.LastError == nil; st = runner.States()[0] {
		if ctx.Err() != nil {
			t.Fatal("the worker never met the outage")
		}
		time.Sleep(10 * time.Millisecond)
	}
	restore()
	for written < 10_000 {
		round()
	}
	res, err := runner.WaitCaughtUp(ctx)
	if err != nil {
		t.Fatalf("WaitCaughtUp: %v", err)
	}
	if len(res[0].Parked) != 0 {
		t.Errorf("parked: %+v", res[0].Parked)
	}

	if st := runner.States()[0]; st.Resyncs < 2 || st.RecoveredAt.IsZero() {
		t.Errorf("state %+v: want two resyncs (the first, the rebuild's) and a recovery from the outage", st)
	} else {
		t.Logf("the outage: %v", st.LastError)
	}
	got, err := tg.contents(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(live) {
		t.Errorf("the table holds %d documents, the feed %d", len(got), len(live))
	}
	for k, d := range live {
		if !feedtest.JSONEqual(got[k], d) {
			t.Errorf("%s: the table holds %s, the feed %s", k, got[k], d)
		}
	}
	var mapped int
	if err := tg.read.QueryRow(ctx, `SELECT count(*) FROM `+sink.Table()+` WHERE doc IS NOT NULL AND n = (doc->>'n')::bigint`).Scan(&mapped); err != nil || mapped != len(live) {
		t.Errorf("rows whose mapped column matches the document: %d of %d (%v)", mapped, len(live), err)
	}

	// The log: every write to a table that served readers, in order.
	sink.mu.Lock()
	published := append([]uint32(nil), sink.published...)
	sink.mu.Unlock()
	if len(published) < 3 {
		t.Errorf("tables published: %d, want the first, the initial resync's and the rebuild's", len(published))
	}
	rows, err := tg.read.Query(ctx, `SELECT key, seq FROM "`+tg.schema+`".log WHERE rel = ANY($1) ORDER BY id`, published)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	writes, back := 0, 0
	for rows.Next() {
		var k string
		var s int64
		if err := rows.Scan(&k, &s); err != nil {
			t.Fatal(err)
		}
		writes++
		if s <= last[k] {
			back++
			if back < 5 {
				t.Errorf("key %s went from seq %d to %d", k, last[k], s)
			}
		}
		last[k] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if back > 0 {
		t.Errorf("%d writes of %d took a key back to an older seq", back, writes)
	}
	t.Logf("%d changes, %d writes to served tables, %d tables published", written, writes, len(published))
}
