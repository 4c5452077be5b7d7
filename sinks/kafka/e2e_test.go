package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// counting is the sink as the end-to-end test runs it: it counts the
// errors the worker saw and the resyncs it opened.
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

// TestEndToEnd runs pgfeed → syncer.Runner → this sink: 10,000 changes
// with deletes, a rebuild half way, and in the middle a broker that
// answers produce requests with an error (kfake's fault injection; against
// a real broker, the sink's connections cut instead). At the end a Reader,
// consuming the live copy from its start, sees exactly the feed's live
// documents, nothing parked; the live copy holds no key whose records go
// back in seq; and a stale call, as a worker that lost its lease would
// make, changes nothing readers see.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 changes through the driver: not in -short")
	}
	t.Parallel()
	ctx := t.Context()
	b := newBroker(t)
	base := b.topic(t)
	l := &link{}
	s := open(t, b.testOptions(base, l))
	sink := &counting{Sink: s}

	store, pool := pgtest.FeedStore(t, ctx, pgfeed.Options{})
	h := pgtest.Harness(store, pool)
	id := feed.SinkID{Feed: "orders", Sink: "kafka"}
	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: id, Sink: sink}}, syncer.Options{
		BatchSize: 250, PollInterval: 200 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError + 4})),
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
			key := feed.Key(fmt.Sprintf("order/%d ü", k))
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
			if b.fake != nil {
				// Every produce request fails for a while: a non-retriable
				// answer, then one the client retries until the call's
				// deadline.
				fh := b.fake.Fault(
					kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.UnknownServerError, Count: 3},
					kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: -1},
				)
				restore = fh.Remove
			} else {
				restore = l.down()
			}
		case txs/2 + 100:
			deadline := time.Now().Add(30 * time.Second)
			for sink.errs.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			restore()
		}
		if i > txs/2+50 && i < txs/2+100 {
			time.Sleep(5 * time.Millisecond) // the fault lasts a while
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	res, err := runner.WaitCaughtUp(waitCtx)
	if err != nil {
		t.Fatalf("WaitCaughtUp: %v (state %+v)", err, runner.States()[0])
	}
	if len(res[0].Parked) != 0 {
		t.Errorf("parked: %+v; a broker fault must park nothing", res[0].Parked)
	}
	if sink.errs.Load() == 0 {
		t.Fatal("the sink never failed during the fault: the test proves nothing")
	}
	if sink.opened.Load() < 2 {
		t.Fatalf("%d resyncs opened; want the first one and the rebuild's", sink.opened.Load())
	}

	batch, err := store.ReadBatch(ctx, id.Feed, 0, feed.BatchLimit{Records: feed.MaxBatchLimit})
	if err != nil {
		t.Fatal(err)
	}
	if batch.Generation != 2 {
		t.Fatalf("the feed is at generation %d, want 2", batch.Generation)
	}
	want := map[feed.Key][]byte{}
	for _, r := range batch.Records {
		if r.Doc != nil {
			want[r.Key] = r.Doc
		}
	}
	reader := b.reader(t, base)
	check := func(what string) {
		t.Helper()
		snap, err := reader.Read(ctx)
		if err != nil {
			t.Fatalf("%s: Read: %v", what, err)
		}
		if snap.Generation != 2 || snap.Topic != s.Topic() {
			t.Errorf("%s: the reader reads %s (generation %d), the sink writes %s at generation 2", what, snap.Topic, snap.Generation, s.Topic())
		}
		if len(snap.Docs) != len(want) {
			t.Errorf("%s: the reader sees %d documents, the feed has %d live", what, len(snap.Docs), len(want))
		}
		for k, d := range want {
			if !feedtest.JSONEqual(snap.Docs[k], d) {
				t.Errorf("%s: %q reads %.80s, the feed has %.80s", what, k, snap.Docs[k], d)
			}
		}
	}
	check("after catching up")

	// Per key, the live copy's records rise in seq by offset.
	last := map[string]int64{}
	back := 0
	recs := rawRecords(t, b, s.Topic())
	for _, r := range recs {
		seq, _ := recordSeq(r)
		if int64(seq) <= last[string(r.Key)] {
			back++
		}
		last[string(r.Key)] = int64(seq)
	}
	if back != 0 {
		t.Errorf("%d records of %d went back to an older seq of their key", back, len(recs))
	}

	// The one stale call of a worker that lost its lease: older versions
	// of live keys, and tombstones of older seqs.
	var stale []feed.Record
	for i, r := range batch.Records[:100] {
		st := feed.Record{Key: r.Key, Seq: r.Seq - 1}
		if i%3 != 0 {
			st.Doc = []byte(`{"stale":true}`)
		}
		stale = append(stale, st)
	}
	if rej, err := s.Apply(ctx, stale); err != nil || len(rej) != 0 {
		t.Fatalf("a stale call: %v, %v", rej, err)
	}
	check("after a stale call")
	st := runner.States()[0]
	t.Logf("%d records in the live copy, %d live documents, %d sink errors, %d resyncs, %d sent; last error: %v",
		len(recs), len(want), sink.errs.Load(), sink.opened.Load(), st.RecordsSent, st.LastError)
}
