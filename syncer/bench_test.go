package syncer_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// arrivalSink signals every key it is sent, with the time it arrived.
type arrivalSink struct{ arrived chan arrival }

type arrival struct {
	key feed.Key
	at  time.Time
}

func (s *arrivalSink) Apply(_ context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	now := time.Now()
	for _, r := range recs {
		s.arrived <- arrival{r.Key, now}
	}
	return nil, nil
}

func (s *arrivalSink) OpenResync(context.Context, feed.Generation) (feed.ResyncTarget, error) {
	return arrivalTarget{}, nil
}

type arrivalTarget struct{}

func (arrivalTarget) Apply(context.Context, []feed.Record) ([]feed.Rejection, error) { return nil, nil }
func (arrivalTarget) Publish(context.Context) error                                  { return nil }
func (arrivalTarget) Abort(context.Context) error                                    { return nil }

// BenchmarkCommitToSink measures, on PostgreSQL, how long a committed change
// takes to reach an idle worker's sink. The poll interval is an hour, so every
// figure is the wake-up path (LISTEN/NOTIFY), never the poll. It reports the
// p50 and p99 latency of b.N single-change commits.
func BenchmarkCommitToSink(b *testing.B) {
	store, _, _ := newPG(b, pgfeed.Options{})
	f := feed.FeedName("latency")
	id := feed.SinkID{Feed: f, Sink: "s"}
	sink := &arrivalSink{arrived: make(chan arrival, 16)}
	w, err := syncer.NewWorker(store, id, sink, syncer.Options{
		PollInterval: time.Hour,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for w.State().Phase != syncer.PhaseIdle {
		time.Sleep(time.Millisecond)
	}
	lat := make([]time.Duration, 0, b.N)   // from the commit's start
	after := make([]time.Duration, 0, b.N) // from the commit's return
	b.ResetTimer()
	for i := range b.N {
		k := feed.Key(fmt.Sprintf("k%d", i))
		start := time.Now()
		if _, err := store.WriteCommitted(ctx, f, []feed.Change{feed.Put(k, []byte(`{"i":1}`))}); err != nil {
			b.Fatal(err)
		}
		committed := time.Now()
		select {
		case got := <-sink.arrived:
			if got.key != k {
				b.Fatalf("sink got %q, want %q", got.key, k)
			}
			lat = append(lat, got.at.Sub(start))
			after = append(after, max(0, got.at.Sub(committed)))
		case <-time.After(10 * time.Second):
			b.Fatalf("commit %d never reached the sink", i)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(after)
	p := func(d []time.Duration, q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(p(after, 0.50)), "p50-ms")
	b.ReportMetric(ms(p(after, 0.99)), "p99-ms")
	b.Logf("over %d commits: commit return→sink p50 %v, p99 %v, max %v; commit start→sink p50 %v, p99 %v",
		len(lat), p(after, 0.50), p(after, 0.99), after[len(after)-1], p(lat, 0.50), p(lat, 0.99))
}

// countSink counts the records it is sent.
type countSink struct{ n atomic.Int64 }

func (s *countSink) Apply(_ context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	s.n.Add(int64(len(recs)))
	return nil, nil
}

func (s *countSink) OpenResync(context.Context, feed.Generation) (feed.ResyncTarget, error) {
	return arrivalTarget{}, nil
}

// BenchmarkCatchUp measures, on PostgreSQL, an incremental catch-up of 100,000
// rows written while no worker ran, in batches of the default size, into a
// sink that costs nothing: the driver's and the store's rate.
func BenchmarkCatchUp(b *testing.B) {
	const rows = 100_000
	store, _, _ := newPG(b, pgfeed.Options{})
	var took time.Duration
	for i := range b.N {
		b.StopTimer()
		f := feed.FeedName(fmt.Sprintf("catchup-%d", i))
		id := feed.SinkID{Feed: f, Sink: "s"}
		sink := &countSink{}
		w, err := syncer.NewWorker(store, id, sink, syncer.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		run := func(until func() bool) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = w.Run(ctx) }()
			for !until() {
				time.Sleep(200 * time.Microsecond)
			}
			cancel()
			<-done
		}
		run(func() bool { return w.State().Resyncs == 1 }) // the empty resync
		for c := range rows / 1000 {
			changes := make([]feed.Change, 1000)
			for i := range changes {
				changes[i] = feed.Put(feed.Key(fmt.Sprintf("k%06d", c*1000+i)), []byte(`{"pad":"0123456789abcdef0123456789abcdef"}`))
			}
			if _, err := store.WriteCommitted(context.Background(), f, changes); err != nil {
				b.Fatal(err)
			}
		}
		head, err := store.Head(context.Background(), f)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		run(func() bool { return sink.n.Load() >= rows && w.State().Cursor.Seq >= head })
		took += time.Since(start)
	}
	b.ReportMetric(float64(rows*b.N)/took.Seconds(), "rows/s")
}
