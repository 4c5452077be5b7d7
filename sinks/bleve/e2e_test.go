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

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
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

// TestEndToEnd runs the shared end-to-end scenario (pgtest.Mirror: 10,000
// changes with deletes, a rebuild half way) into the bleve sink, while
// searchers query without a pause. The index ends with exactly the feed's
// live documents, read back through the Searcher; no search failed or landed
// on an index before its publish; and a stale call afterwards changes
// nothing.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

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

	m := pgtest.Mirror(t, ctx, sink, pgtest.Scenario{
		Sink: "search",
		Seed: 12,
		Doc: func(rng *rand.Rand, n int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"n":%d,"note":"v%d ü","tags":["a","b"]}`, rng.Int64(), n))
		},
		Options: syncer.Options{Logger: slog.New(slog.DiscardHandler)},
	})
	live := m.Live

	wantLive := func(what string) {
		t.Helper()
		got, err := contents(ctx, sr)
		if err != nil {
			t.Fatal(err)
		}
		pgtest.CheckDocs(t, what+": the index", got, live)
		for k, d := range live {
			if doc, ok, err := sr.Document(ctx, k); err != nil || !ok || !feedtest.JSONEqual(doc, d) {
				t.Errorf("%s: Document(%s) = %s, %v, %v; want %s", what, k, doc, ok, err, d)
			}
		}
	}
	wantLive("after catching up")

	// A stale call, as a worker that lost its lease would make: older
	// versions of every key, live or deleted, tombstones among them.
	m.Stop()
	var stale []feed.Record
	for i, r := range m.Records {
		var d json.RawMessage
		if i%3 != 0 {
			d = json.RawMessage(`{"stale":true}`)
		}
		stale = append(stale, feed.Record{Key: r.Key, Seq: r.Seq - 1, Doc: d})
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
	t.Logf("%d changes, %d resyncs published, %d searches meanwhile", m.Written, sink.resyncs, searches)
}
