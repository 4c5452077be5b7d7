package nats

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// counting counts the errors the worker saw from the sink and the resyncs
// it opened.
type counting struct {
	*Sink
	errs, opened atomic.Int64
}

func (c *counting) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	rej, err := c.Sink.Apply(ctx, records)
	if err != nil {
		c.errs.Add(1)
	}
	return rej, err
}

func (c *counting) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	r, err := c.Sink.OpenResync(ctx, g)
	if err != nil {
		c.errs.Add(1)
		return nil, err
	}
	c.opened.Add(1)
	return &countingResync{ResyncTarget: r, c: c}, nil
}

type countingResync struct {
	feed.ResyncTarget
	c *counting
}

func (r *countingResync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	rej, err := r.ResyncTarget.Apply(ctx, records)
	if err != nil {
		r.c.errs.Add(1)
	}
	return rej, err
}

// TestEndToEnd runs pgfeed → syncer.Runner → this sink: 10,000 changes with
// deletes, a rebuild (generation bump) half way, and the sink's connection
// cut in the middle, its redials refused for a while. At the end the live
// copy, read through the Reader, holds exactly the feed's live documents,
// nothing is parked, and a stale call changes nothing.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 changes through the driver: not in -short")
	}
	t.Parallel()
	ctx := t.Context()
	bucket := bucketName(t)
	link := newLink(t)
	nc := connect(t, link)
	s := openSink(t, nc, Options{Bucket: bucket})
	sink := &counting{Sink: s}
	reader := newReader(t, connect(t, nil), bucket)

	store, pool := pgtest.FeedStore(t, ctx, pgfeed.Options{})
	h := pgtest.Harness(store, pool)
	id := feed.SinkID{Feed: "orders", Sink: "nats"}
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: id, Sink: sink}}, syncer.Options{
		BatchSize: 250, PollInterval: 200 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = runner.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran })

	const txs, perTx, keys = 500, 20, 700
	n := 0
	var restore func()
	for i := range txs {
		changes := make([]feed.Change, 0, perTx)
		seen := map[int]bool{}
		for range perTx {
			k := (n * 7919) % keys
			n++
			if seen[k] {
				continue
			}
			seen[k] = true
			key := feed.Key(fmt.Sprintf("order.%d ü*>", k))
			if n%5 == 0 {
				changes = append(changes, feed.Delete(key))
			} else {
				changes = append(changes, feed.Put(key, []byte(fmt.Sprintf(`{"n":%d,"tx":%d,"pad":"%0100d"}`, n, i, n))))
			}
		}
		if _, err := h.Write(ctx, id.Feed, changes); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		switch i {
		case txs / 2:
			if _, err := h.Rebuild(ctx, id.Feed); err != nil {
				t.Fatalf("rebuild: %v", err)
			}
		case txs/2 + 50:
			restore = link.Down(t, nc)
		case txs/2 + 100:
			// The outage must have been seen before it ends.
			deadline := time.Now().Add(20 * time.Second)
			for sink.errs.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			restore()
		}
		if i > txs/2+50 && i < txs/2+100 {
			time.Sleep(5 * time.Millisecond) // the outage lasts a while
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := runner.WaitCaughtUp(waitCtx); err != nil {
		t.Fatalf("WaitCaughtUp: %v (state %+v)", err, runner.States()[0])
	}
	if sink.errs.Load() == 0 {
		t.Fatal("the sink never failed during the outage: the test proves nothing")
	}
	if sink.opened.Load() < 2 {
		t.Fatalf("%d resyncs opened; want the first one and the rebuild's", sink.opened.Load())
	}

	b, err := store.ReadBatch(ctx, id.Feed, 0, feed.BatchLimit{Records: feed.MaxBatchLimit})
	if err != nil {
		t.Fatal(err)
	}
	if b.Generation != 2 {
		t.Fatalf("the feed is at generation %d, want 2", b.Generation)
	}
	want := map[feed.Key][]byte{}
	for _, r := range b.Records {
		if r.Doc != nil {
			want[r.Key] = r.Doc
		}
	}
	// A worker that lost its lease may still land one late call: older
	// versions of keys, tombstones among them. The guard must ignore it.
	var stale []feed.Record
	for i, r := range b.Records[:100] {
		var d []byte
		if i%3 != 0 {
			d = []byte(`{"stale":true}`)
		}
		stale = append(stale, feed.Record{Key: r.Key, Seq: r.Seq - 1, Doc: d})
	}
	staleSink := openSink(t, connect(t, nil), Options{Bucket: bucket}) // another process: no hints
	if rej, err := staleSink.Apply(ctx, stale); err != nil || len(rej) != 0 {
		t.Fatalf("a stale call: %v, %v", rej, err)
	}
	got, err := reader.Documents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("the live copy serves %d documents, the feed has %d live", len(got), len(want))
	}
	for k, d := range want {
		if !feedtest.JSONEqual(got[k], d) {
			t.Errorf("%q: the live copy serves %.80s, the feed has %.80s", k, got[k], d)
		}
	}
	desc, err := store.Describe(ctx, id.Feed)
	if err != nil {
		t.Fatal(err)
	}
	for _, ss := range desc.Sinks {
		if len(ss.Parked) != 0 {
			t.Errorf("sink %s parked %d records, the first %+v: an outage parks nothing", ss.Sink, len(ss.Parked), ss.Parked[0])
		}
	}
	if live := bucketsOf(t, reader.js, bucket); len(live) != 2 {
		t.Errorf("buckets left: %v; want the pointer and the live copy", live)
	}
	st := runner.States()[0]
	t.Logf("%d live documents, %d sink errors, %d resyncs, %d sent; last error: %v", len(want), sink.errs.Load(), sink.opened.Load(), st.RecordsSent, st.LastError)
}
