package pgtest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// Scenario is the run every sink's end-to-end test shares: a feed in
// PostgreSQL mirrored into the sink by a syncer.Runner while a writer puts
// and deletes keys at random, the feed rebuilt half way (a new generation,
// the live documents written again, as a projection's rebuild does), and
// the sink failing for a while after the rebuild. The sink's own test then
// judges the sink against Mirrored.Live in whatever way reads it back.
type Scenario struct {
	// Feed and Sink name the mirrored pair; "orders" and "sink" when empty.
	Feed feed.FeedName
	Sink feed.SinkName
	// Changes is how many changes the writer makes in all, in transactions
	// of 100 distinct keys; 10,000 when zero.
	Changes int
	// Key names key i of the key space (Keys of them, 1,500 when zero);
	// "order/%04d" when nil. Sinks give keys their own awkward characters.
	Key  func(i int) feed.Key
	Keys int
	// Doc is the document of the n-th change; a small JSON object with a
	// non-ASCII string when nil.
	Doc func(rng *rand.Rand, n int) json.RawMessage
	// Seed seeds the writer's choices, so a failure can be replayed.
	Seed uint64
	// Fault, when set, starts the sink's outage after the rebuild, with
	// writes going on, and returns what ends it. The scenario ends it once
	// the worker has met it (a fault in its state later than the start), so
	// an outage the sink never noticed fails the test instead of proving
	// nothing.
	Fault func() (end func())
	// Options are the runner's; the scenario fills in a short poll, fast
	// backoff, batches of 500 and a logger that keeps only errors, where
	// zero.
	Options syncer.Options
}

// Mirrored is what the scenario leaves for the sink's test to judge.
type Mirrored struct {
	Store  *pgfeed.Store
	Runner *syncer.Runner
	// Live is the feed's live documents at the end, read back from the
	// store (and checked there against the writer's own model).
	Live map[feed.Key]json.RawMessage
	// Records are the feed's rows of that generation, tombstones among
	// them, in seq order: a stale call of a test is made of their older
	// versions.
	Records []feed.Record
	// Touched is every key the writer ever wrote or deleted, for sinks that
	// can only be read key by key.
	Touched []feed.Key
	// Written is how many changes were written.
	Written int
	// State is the worker's state once caught up.
	State syncer.State
	// Stop stops the runner and waits for it; it is also done at cleanup.
	// A test stops it before a stale call of its own to a sink that allows
	// one process only.
	Stop func()
}

// Mirror runs sc against sink and returns once the worker has caught up
// with the feed's last write. On the way it fails t unless: the first
// resync and the rebuild's both published, the fault (if any) was met and
// retried, nothing was parked, and the feed read back equals the writer's
// model of it.
func Mirror(t *testing.T, ctx context.Context, sink feed.Sink, sc Scenario) Mirrored {
	t.Helper()
	if sc.Feed == "" {
		sc.Feed = "orders"
	}
	if sc.Sink == "" {
		sc.Sink = "sink"
	}
	if sc.Changes == 0 {
		sc.Changes = 10_000
	}
	if sc.Keys == 0 {
		sc.Keys = 1500
	}
	if sc.Key == nil {
		sc.Key = func(i int) feed.Key { return feed.Key(fmt.Sprintf("order/%04d", i)) }
	}
	if sc.Doc == nil {
		sc.Doc = func(rng *rand.Rand, n int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"n":%d,"note":"v%d ü"}`, rng.Int64(), n))
		}
	}
	o := &sc.Options
	if o.BatchSize == 0 {
		o.BatchSize = 500
	}
	if o.PollInterval == 0 {
		o.PollInterval = 50 * time.Millisecond
	}
	if o.BackoffMin == 0 {
		o.BackoffMin, o.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	}

	store, pool := FeedStore(t, ctx, pgfeed.Options{})
	id := feed.SinkID{Feed: sc.Feed, Sink: sc.Sink}
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: id, Sink: sink}}, sc.Options)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = runner.Run(runCtx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	state := func() syncer.State { return runner.States()[0] }

	rng := rand.New(rand.NewPCG(sc.Seed, 0))
	live := map[feed.Key]json.RawMessage{}
	touched := map[feed.Key]bool{}
	written := 0
	write := func(changes []feed.Change) {
		t.Helper()
		if _, err := store.WriteCommitted(ctx, sc.Feed, changes); err != nil {
			t.Fatalf("WriteCommitted: %v", err)
		}
		written += len(changes)
	}
	per := min(100, sc.Keys)
	round := func() {
		changes := make([]feed.Change, 0, per)
		seen := map[feed.Key]bool{}
		for len(changes) < per {
			k := sc.Key(rng.IntN(sc.Keys))
			if seen[k] {
				continue
			}
			seen[k], touched[k] = true, true
			if _, ok := live[k]; ok && rng.IntN(4) == 0 {
				delete(live, k)
				changes = append(changes, feed.Delete(k))
				continue
			}
			d := sc.Doc(rng, written+len(changes))
			live[k] = d
			changes = append(changes, feed.Put(k, d))
		}
		write(changes)
	}
	caughtUp := func(what string) {
		t.Helper()
		res, err := runner.WaitCaughtUp(ctx)
		if err != nil {
			t.Fatalf("WaitCaughtUp %s: %v (state %+v)", what, err, state())
		}
		if len(res[0].Parked) != 0 {
			t.Fatalf("%s: %d parked, the first %+v; nothing here may be parked", what, len(res[0].Parked), res[0].Parked[0])
		}
	}

	rounds := sc.Changes / per
	for range rounds * 4 / 10 {
		round()
	}
	// The first resync publishes before the rebuild, so the rebuild's is a
	// second one: a rebuild landing while the first still fills restarts it
	// in the new generation, and the two would count once.
	caughtUp("before the rebuild")
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := store.ResetTx(ctx, tx, sc.Feed); return err }); err != nil {
		t.Fatalf("ResetTx: %v", err)
	}
	var all []feed.Change
	for k, d := range live {
		all = append(all, feed.Put(k, d))
	}
	for len(all) > 0 {
		n := min(len(all), per)
		write(all[:n])
		all = all[n:]
	}
	for range rounds / 10 {
		round()
	}
	if sc.Fault != nil {
		began := time.Now()
		end := sc.Fault()
		for range rounds / 5 {
			round()
		}
		// Writes go on while the worker has not met the outage: a sink
		// whose faults strike only a command in flight (a killed
		// connection, which an idle client replaces unseen) may let a
		// worker through the rounds above untouched, and an idle worker
		// sends nothing to fail.
		wrote := time.Now()
		for st := state(); st.LastError == nil || st.LastErrorAt.Before(began); st = state() {
			if ctx.Err() != nil {
				t.Fatalf("the worker never met the sink's outage (state %+v)", st)
			}
			if time.Since(wrote) >= 100*time.Millisecond {
				round()
				wrote = time.Now()
			}
			time.Sleep(10 * time.Millisecond)
		}
		end()
	}
	for written < sc.Changes {
		round()
	}
	caughtUp("at the end")

	// The worker counts a resync, and its recovery, once the move after the
	// publish has landed; the wait above sees that move in the database,
	// possibly before the worker's own state says so.
	st := state()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); st = state() {
		if st.Resyncs >= 2 && (sc.Fault == nil || !st.RecoveredAt.IsZero()) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st.Resyncs < 2 {
		t.Errorf("%d resyncs published; want the first one and the rebuild's", st.Resyncs)
	}
	if sc.Fault != nil {
		if st.RecoveredAt.IsZero() {
			t.Errorf("the worker never recovered from the outage: %v", st.LastError)
		}
		t.Logf("the outage, as the worker met it last: %v", st.LastError)
	}
	got := map[feed.Key]json.RawMessage{}
	var records []feed.Record
	for after := feed.Seq(0); ; {
		b, err := store.ReadBatch(ctx, sc.Feed, after, feed.BatchLimit{Records: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if b.Generation != 2 {
			t.Fatalf("the feed is at generation %d, want the rebuild's 2", b.Generation)
		}
		for _, r := range b.Records {
			if r.Doc != nil {
				got[r.Key] = r.Doc
			}
			after = r.Seq
		}
		records = append(records, b.Records...)
		if !b.More {
			break
		}
	}
	if len(got) != len(live) {
		t.Fatalf("the feed holds %d live documents, the writer left %d", len(got), len(live))
	}
	for k, d := range live {
		if !feedtest.JSONEqual(got[k], d) {
			t.Fatalf("%s: the feed holds %.80s, the writer wrote %.80s last", k, got[k], d)
		}
	}
	keys := make([]feed.Key, 0, len(touched))
	for k := range touched {
		keys = append(keys, k)
	}
	return Mirrored{Store: store, Runner: runner, Live: got, Records: records, Touched: keys, Written: written, State: st, Stop: stop}
}

// CheckDocs fails t, naming at most a few keys, unless got holds exactly
// want's documents: the comparison every sink's test ends with.
func CheckDocs(t testing.TB, what string, got map[feed.Key]json.RawMessage, want map[feed.Key]json.RawMessage) {
	t.Helper()
	bad := 0
	for k, d := range want {
		if !feedtest.JSONEqual(got[k], d) {
			if bad++; bad <= 5 {
				t.Errorf("%s: %s holds %.80s, the feed %.80s", what, k, got[k], d)
			}
		}
	}
	for k, d := range got {
		if _, ok := want[k]; !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s: %s holds %.80s, which the feed does not have", what, k, d)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d keys differ from the feed's %d live documents", what, bad, len(got), len(want))
	}
}
