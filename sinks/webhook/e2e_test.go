package webhook_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// TestEndToEnd runs pgfeed → syncer.Runner → webhook → receiver: 10k changes
// with deletes, a rebuild mid-stream and then the receiver answering 503, then
// dropping connections, for a while. The receiver's copy ends equal to the
// feed's live documents, and no key was ever sent an older seq than one it
// had been sent before.
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	store, pool := pgtest.FeedStore(t, ctx, pgfeed.Options{})
	h := pgtest.Harness(store, pool)

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
	quiet := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: feed.SinkID{Feed: f, Sink: "hook"}, Sink: sink}},
		syncer.Options{BatchSize: 500, BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond, PollInterval: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = runner.Run(rctx) }()
	defer func() { stop(); <-done }()

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
	rnd := rand.New(rand.NewPCG(1, 2))
	const writes, per = 100, 100
	for i := range writes {
		switch i {
		case 60:
			rc.setFault(func(w http.ResponseWriter) bool {
				faults.Add(1)
				http.Error(w, "down", http.StatusServiceUnavailable)
				return true
			})
		case 70:
			waitFaults(5)
			rc.setFault(func(w http.ResponseWriter) bool {
				faults.Add(1)
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					_ = conn.Close()
				}
				return true
			})
		case 80:
			waitFaults(10)
			rc.setFault(nil)
		case 40:
			if _, err := h.Rebuild(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		changes := make([]feed.Change, 0, per)
		for j := range per {
			k := feed.Key(fmt.Sprintf("key-%d", rnd.IntN(2000)))
			if rnd.IntN(5) == 0 {
				changes = append(changes, feed.Delete(k))
			} else {
				changes = append(changes, feed.Put(k, []byte(fmt.Sprintf(`{"w":%d,"j":%d}`, i, j))))
			}
		}
		if _, err := h.Write(ctx, f, changes); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			time.Sleep(20 * time.Millisecond) // let the worker interleave with the writer
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if _, err := runner.WaitCaughtUp(wctx); err != nil {
		t.Fatalf("WaitCaughtUp: %v (state %+v)", err, runner.States())
	}
	want := map[feed.Key][]byte{}
	for after := feed.Seq(0); ; {
		b, err := store.ReadBatch(ctx, f, after, feed.BatchLimit{Records: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range b.Records {
			if r.Doc != nil {
				want[r.Key] = r.Doc
			}
			after = r.Seq
		}
		if !b.More {
			break
		}
	}
	parked, err := store.ReadParked(ctx, feed.SinkID{Feed: f, Sink: "hook"})
	if err != nil || len(parked) != 0 {
		t.Errorf("%d parked (first %v), %v; the receiver rejects nothing, so nothing may be parked", len(parked), parked[:min(len(parked), 2)], err)
	}
	got, _ := rc.contents(ctx)
	if len(got) != len(want) {
		t.Errorf("the receiver holds %d documents, the feed %d", len(got), len(want))
	}
	for k, d := range want {
		if !feedtest.JSONEqual(got[k], d) {
			t.Errorf("%s: the receiver holds %s, the feed %s", k, got[k], d)
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(wentBack) > 0 {
		t.Errorf("keys went back: %v", wentBack[:min(len(wentBack), 10)])
	}
	if rc.gen < 2 {
		t.Errorf("the receiver's copy is of generation %d; the rebuild's resync never published", rc.gen)
	}
	t.Logf("%d live documents, %d distinct deliveries, receiver at generation %d, %d deliveries met the outage", len(want), len(rc.ids), rc.gen, faults.Load())
}
