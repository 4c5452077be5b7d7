package syncer_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/syncer"
)

// nopSink is a sink for construction tests, which never run it.
type nopSink struct{}

func (nopSink) Apply(context.Context, []feed.Record) ([]feed.Rejection, error) { return nil, nil }
func (nopSink) OpenResync(context.Context, feed.Generation) (feed.ResyncTarget, error) {
	return nil, errors.New("not for running")
}

func wantField(t *testing.T, what string, err error, field string) {
	t.Helper()
	var ie *feed.InvalidError
	if !errors.As(err, &ie) || !errors.Is(err, feed.ErrInvalid) {
		t.Fatalf("%s: error %v, want an *feed.InvalidError for %q", what, err, field)
	}
	if ie.Field != field {
		t.Fatalf("%s: error names %q (%v), want %q", what, ie.Field, err, field)
	}
}

func TestOptionsRefused(t *testing.T) {
	store, err := memfeed.New(memfeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id := feed.SinkID{Feed: "f", Sink: "s"}
	for _, tc := range []struct {
		name  string
		opts  syncer.Options
		field string
	}{
		{"negative batch", syncer.Options{BatchSize: -1}, "syncer.batch_size"},
		{"batch over the reader's limit", syncer.Options{BatchSize: feed.MaxBatchLimit + 1}, "syncer.batch_size"},
		{"negative batch bytes", syncer.Options{BatchBytes: -1}, "syncer.batch_bytes"},
		{"negative poll", syncer.Options{PollInterval: -time.Second}, "syncer.poll_interval"},
		{"negative backoff min", syncer.Options{BackoffMin: -1}, "syncer.backoff_min"},
		{"negative backoff max", syncer.Options{BackoffMax: -1}, "syncer.backoff_max"},
		{"backoff max under min", syncer.Options{BackoffMin: time.Second, BackoffMax: time.Millisecond}, "syncer.backoff_max"},
		{"negative lease retry", syncer.Options{LeaseRetry: -1}, "syncer.lease_retry"},
		{"negative sink timeout", syncer.Options{SinkTimeout: -1}, "syncer.sink_timeout"},
		{"negative progress interval", syncer.Options{ProgressInterval: -time.Second}, "syncer.progress_interval"},
		{"negative store timeout", syncer.Options{StoreTimeout: -time.Second}, "syncer.store_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := syncer.NewWorker(store, id, nopSink{}, tc.opts)
			wantField(t, "NewWorker", err, tc.field)
			_, err = syncer.NewRunner(store, []syncer.Target{{ID: id, Sink: nopSink{}}}, tc.opts)
			wantField(t, "NewRunner", err, tc.field)
		})
	}
}

func TestOptionsAccepted(t *testing.T) {
	store, err := memfeed.New(memfeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id := feed.SinkID{Feed: "f", Sink: "s"}
	for _, tc := range []struct {
		name string
		opts syncer.Options
	}{
		{"zero", syncer.Options{}},
		{"a long sink timeout (bounded by each lease's margin at run time)", syncer.Options{SinkTimeout: time.Minute}},
		{"backoff min above the default max", syncer.Options{BackoffMin: time.Minute}},
		{"largest batch", syncer.Options{BatchSize: feed.MaxBatchLimit}},
		{"one-byte batches (each then holds one record)", syncer.Options{BatchBytes: 1}},
		{"a move after every batch", syncer.Options{MoveInterval: -1}},
		{"moves put off for a minute", syncer.Options{MoveInterval: time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := syncer.NewWorker(store, id, nopSink{}, tc.opts); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
}

func TestConstructionRefused(t *testing.T) {
	store, err := memfeed.New(memfeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id := feed.SinkID{Feed: "f", Sink: "s"}
	_, err = syncer.NewWorker(nil, id, nopSink{}, syncer.Options{})
	wantField(t, "nil store", err, "store")
	_, err = syncer.NewWorker(store, id, nil, syncer.Options{})
	wantField(t, "nil sink", err, "sink")
	_, err = syncer.NewWorker(store, feed.SinkID{Feed: "f", Sink: "bad name"}, nopSink{}, syncer.Options{})
	wantField(t, "bad sink name", err, "sink name")

	_, err = syncer.NewRunner(store, nil, syncer.Options{})
	wantField(t, "no targets", err, "targets")
	_, err = syncer.NewRunner(store, []syncer.Target{{ID: id, Sink: nopSink{}}, {ID: id, Sink: nopSink{}}}, syncer.Options{})
	wantField(t, "duplicate target", err, "targets[1].id")
	_, err = syncer.NewRunner(store, []syncer.Target{{ID: id, Sink: nopSink{}}, {ID: feed.SinkID{Feed: "", Sink: "s"}, Sink: nopSink{}}}, syncer.Options{})
	wantField(t, "bad target name", err, "targets[1].id.feed")
	_, err = syncer.NewRunner(store, []syncer.Target{{ID: id}}, syncer.Options{})
	wantField(t, "nil target sink", err, "targets[0].sink")
	_, err = syncer.NewRunner(nil, []syncer.Target{{ID: id, Sink: nopSink{}}}, syncer.Options{})
	wantField(t, "nil runner store", err, "store")
}

// deadlineSink records how far off the deadline of its first call was.
type deadlineSink struct {
	nopSink
	got chan time.Duration
}

func (s deadlineSink) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(1000 * time.Hour)
	}
	select {
	case s.got <- time.Until(d):
	default:
	}
	return nil, errors.New("enough")
}

// The deadline of a sink call comes from the lease the worker holds: half its
// margin by default, the configured SinkTimeout when that is shorter than the
// margin, and half the margin again when SinkTimeout is not (the store's
// timings win over a driver configured apart from them).
func TestSinkDeadlineFollowsLeaseMargin(t *testing.T) {
	for _, tc := range []struct {
		name     string
		margin   time.Duration
		set      time.Duration
		min, max time.Duration
	}{
		{"default: half the margin", 4 * time.Second, 0, 1500 * time.Millisecond, 2 * time.Second},
		{"set under the margin", 4 * time.Second, time.Second, 500 * time.Millisecond, time.Second},
		{"set over the margin is cut", 4 * time.Second, time.Minute, 1500 * time.Millisecond, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := memfeed.New(memfeed.Options{Lease: feed.LeaseOptions{TTL: 12 * time.Second, Heartbeat: 2 * time.Second, Margin: tc.margin}})
			if err != nil {
				t.Fatal(err)
			}
			sink := deadlineSink{got: make(chan time.Duration, 1)}
			w, err := syncer.NewWorker(store, feed.SinkID{Feed: "f", Sink: "s"}, sink, syncer.Options{
				SinkTimeout: tc.set,
				Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = w.Run(ctx) }()
			defer func() { cancel(); <-done }()
			select {
			case left := <-sink.got:
				if left < tc.min || left > tc.max {
					t.Fatalf("the sink call's deadline was %v away, want %v to %v", left, tc.min, tc.max)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the worker made no sink call")
			}
		})
	}
}
