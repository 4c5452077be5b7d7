package bleve_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/blevesearch/bleve/v2"
	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	kbleve "github.com/kairos-es/kairos/sinks/bleve"
	"github.com/kairos-es/kairos/syncer"
)

// watched wraps the sink so the test knows which index directories may be
// served: the first one, and each resync's from the moment its Publish
// starts. A search that lands on any other directory saw a half-built index.
type watched struct {
	*kbleve.Sink
	mu        sync.Mutex
	published map[string]bool
	resyncs   int
}

func (w *watched) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	rt, err := w.Sink.OpenResync(ctx, g)
	if err != nil {
		return nil, err
	}
	return &watchedResync{ResyncTarget: rt, w: w}, nil
}

func (w *watched) servable(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.published[name]
}

type watchedResync struct {
	feed.ResyncTarget
	w *watched
}

func (wr *watchedResync) Publish(ctx context.Context) error {
	wr.w.mu.Lock()
	wr.w.published[kbleve.TargetName(wr.ResyncTarget)] = true
	wr.w.resyncs++
	wr.w.mu.Unlock()
	return wr.ResyncTarget.Publish(ctx)
}

// TestEndToEnd: pgfeed → syncer.Runner → the bleve sink: 10k changes with
// deletes and a rebuild mid-stream, while searchers query without a pause.
// The index ends with exactly the feed's live documents, read back through
// the Searcher; no search failed or landed on an index before its publish;
// and a stale call afterwards changes nothing.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	store, fpool := pgtest.FeedStore(t, ctx, pgfeed.Options{})

	dir := t.TempDir()
	sink := &watched{Sink: newSink(t, kbleve.Options{Dir: dir}), published: map[string]bool{}}
	sr := newSearcher(t, dir)
	first, release, err := kbleve.Hold(sr)
	if err != nil {
		t.Fatal(err)
	}
	release()
	sink.published[first] = true

	// Searchers, from before the first resync to the end.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var searches int
	var failures []string
	fail := func(s string) {
		mu.Lock()
		failures = append(failures, s)
		mu.Unlock()
	}
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				req := bleve.NewSearchRequestOptions(bleve.NewMatchQuery("ü"), 10, 0, false)
				req.Fields = []string{kbleve.SourceField}
				if _, err := sr.Search(ctx, req); err != nil {
					fail("Search: " + err.Error())
				}
				name, release, err := kbleve.Hold(sr)
				if err != nil {
					fail("Hold: " + err.Error())
					continue
				}
				if !sink.servable(name) {
					fail("a search landed on " + name + " before its publish")
				}
				release()
				mu.Lock()
				searches++
				mu.Unlock()
			}
		})
	}
	var searchOnce sync.Once
	stopSearching := func() { searchOnce.Do(func() { close(stop); wg.Wait() }) }
	defer stopSearching()

	const f = feed.FeedName("orders")
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: feed.SinkID{Feed: f, Sink: "search"}, Sink: sink}}, syncer.Options{
		BatchSize: 500, PollInterval: 50 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRunner := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	var stopOnce sync.Once
	stopRunning := func() { stopOnce.Do(func() { stopRunner(); <-done }) }
	defer stopRunning()

	rng := rand.New(rand.NewPCG(12, 0))
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
			d := json.RawMessage(fmt.Sprintf(`{"n":%d,"note":"v%d ü","tags":["a","b"]}`, rng.Int64(), written))
			live[k] = d
			changes = append(changes, feed.Put(k, d))
		}
		write(changes)
	}
	for range 40 {
		round()
	}
	// The first resync done, so the rebuild below makes a second one.
	if _, err := runner.WaitCaughtUp(ctx); err != nil {
		t.Fatalf("WaitCaughtUp: %v", err)
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
	if st := runner.States()[0]; st.Resyncs < 2 {
		t.Errorf("state %+v: want two resyncs (the first, the rebuild's)", st)
	}

	wantLive := func(what string) {
		t.Helper()
		got, err := contents(ctx, sr)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(live) {
			t.Errorf("%s: the index holds %d documents, the feed %d", what, len(got), len(live))
		}
		for k, d := range live {
			if !feedtest.JSONEqual(got[k], d) {
				t.Errorf("%s: %s: the index holds %s, the feed %s", what, k, got[k], d)
			}
			if doc, ok, err := sr.Document(ctx, k); err != nil || !ok || !feedtest.JSONEqual(doc, d) {
				t.Errorf("%s: Document(%s) = %s, %v, %v; want %s", what, k, doc, ok, err, d)
			}
		}
	}
	wantLive("after catching up")

	// A stale call, as a worker that lost its lease would make: older
	// versions of every key, live or deleted, tombstones among them.
	stopRunning()
	var stale []feed.Record
	for i := range 1500 {
		k := feed.Key(fmt.Sprintf("order/%04d", i))
		var d json.RawMessage
		if i%3 != 0 {
			d = json.RawMessage(`{"stale":true}`)
		}
		stale = append(stale, feed.Record{Key: k, Seq: feed.Seq(i + 1), Doc: d})
	}
	if rej, err := sink.Apply(ctx, stale); err != nil || len(rej) != 0 {
		t.Fatalf("the stale call: Apply = %d rejections, %v", len(rej), err)
	}
	wantLive("after a stale call")

	stopSearching()
	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Errorf("%d of %d searches failed or saw an unpublished index; the first: %s", len(failures), searches, failures[0])
	}
	if searches == 0 {
		t.Error("no search ran")
	}
	t.Logf("%d changes, %d resyncs published, %d searches meanwhile", written, sink.resyncs, searches)
}
