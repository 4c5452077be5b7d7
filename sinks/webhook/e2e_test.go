package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/syncer"
)

// TestEndToEnd runs the shared end-to-end scenario (pgtest.Mirror: 10,000
// changes with deletes, a rebuild half way) through the webhook sink into a
// receiver, which after the rebuild answers 503 for a while and then drops
// connections for a while. The receiver's copy ends equal to the feed's live
// documents, of the rebuild's generation, and no key was ever sent an older
// seq than one it had been sent before.
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const f = feed.FeedName("e2e")
	rc := newReceiver(t)
	_, url := rc.serve(t)
	o := opts(url)
	o.Feed, o.Sink = f, "hook"
	sink := newSink(t, o)
	// The receiver records, before its seq guard, every seq an apply
	// delivery sent each key.
	sent := map[feed.Key]feed.Seq{}
	var wentBack []string
	rc.observe = func(d deliverySeen) {
		if d.typ != "apply" {
			return
		}
		for _, r := range d.records {
			if prev, ok := sent[r.Key]; ok && r.Seq < prev {
				wentBack = append(wentBack, fmt.Sprintf("%s: %d after %d", r.Key, r.Seq, prev))
			}
			sent[r.Key] = max(sent[r.Key], r.Seq)
		}
	}
	var faults atomic.Int64
	waitFaults := func(n int64) {
		for faults.Load() < n {
			if ctx.Err() != nil {
				t.Fatal("the worker never met the outage")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	m := pgtest.Mirror(t, ctx, sink, pgtest.Scenario{
		Feed: f,
		Sink: "hook",
		Seed: 1,
		Fault: func() func() {
			rc.setFault(func(w http.ResponseWriter) bool {
				faults.Add(1)
				http.Error(w, "down", http.StatusServiceUnavailable)
				return true
			})
			return func() {
				waitFaults(5)
				began := faults.Load()
				rc.setFault(func(w http.ResponseWriter) bool {
					faults.Add(1)
					if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
						_ = conn.Close()
					}
					return true
				})
				waitFaults(began + 5)
				rc.setFault(nil)
			}
		},
		Options: syncer.Options{BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
	})
	got, err := rc.contents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.CheckDocs(t, "the receiver", got, m.Live)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(wentBack) > 0 {
		t.Errorf("keys went back: %v", wentBack[:min(len(wentBack), 10)])
	}
	if rc.gen < 2 {
		t.Errorf("the receiver's copy is of generation %d; the rebuild's resync never published", rc.gen)
	}
	t.Logf("%d live documents, %d distinct deliveries, receiver at generation %d, %d deliveries met the outage", len(m.Live), len(rc.ids), rc.gen, faults.Load())
}
