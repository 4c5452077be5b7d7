package syncer_test

import (
	"context"
	"errors"
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
		{"negative poll", syncer.Options{PollInterval: -time.Second}, "syncer.poll_interval"},
		{"negative backoff min", syncer.Options{BackoffMin: -1}, "syncer.backoff_min"},
		{"negative backoff max", syncer.Options{BackoffMax: -1}, "syncer.backoff_max"},
		{"backoff max under min", syncer.Options{BackoffMin: time.Second, BackoffMax: time.Millisecond}, "syncer.backoff_max"},
		{"negative lease retry", syncer.Options{LeaseRetry: -1}, "syncer.lease_retry"},
		{"negative sink timeout", syncer.Options{SinkTimeout: -1}, "syncer.sink_timeout"},
		{"sink timeout at the margin", syncer.Options{SinkTimeout: 10 * time.Second}, "syncer.sink_timeout"},
		{"sink timeout over a set margin", syncer.Options{Lease: feed.LeaseOptions{TTL: 9 * time.Second, Margin: 3 * time.Second}, SinkTimeout: 4 * time.Second}, "syncer.sink_timeout"},
		{"bad lease timings", syncer.Options{Lease: feed.LeaseOptions{TTL: time.Second, Heartbeat: 2 * time.Second}}, "syncer.lease.heartbeat"},
		{"unknown lease kind", syncer.Options{LeaseKind: 7}, "syncer.lease_kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := syncer.NewWorker(store, store, id, nopSink{}, tc.opts)
			wantField(t, "NewWorker", err, tc.field)
			_, err = syncer.NewRunner(store, store, []syncer.Target{{ID: id, Sink: nopSink{}}}, tc.opts)
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
		{"advisory with a long sink timeout", syncer.Options{LeaseKind: syncer.AdvisoryLock, SinkTimeout: time.Minute}},
		{"sink timeout just under the margin", syncer.Options{SinkTimeout: 10*time.Second - 1}},
		{"backoff min above the default max", syncer.Options{BackoffMin: time.Minute}},
		{"largest batch", syncer.Options{BatchSize: feed.MaxBatchLimit}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := syncer.NewWorker(store, store, id, nopSink{}, tc.opts); err != nil {
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
	_, err = syncer.NewWorker(nil, store, id, nopSink{}, syncer.Options{})
	wantField(t, "nil reader", err, "reader")
	_, err = syncer.NewWorker(store, nil, id, nopSink{}, syncer.Options{})
	wantField(t, "nil store", err, "store")
	_, err = syncer.NewWorker(store, store, id, nil, syncer.Options{})
	wantField(t, "nil sink", err, "sink")
	_, err = syncer.NewWorker(store, store, feed.SinkID{Feed: "f", Sink: "bad name"}, nopSink{}, syncer.Options{})
	wantField(t, "bad sink name", err, "sink name")

	_, err = syncer.NewRunner(store, store, nil, syncer.Options{})
	wantField(t, "no targets", err, "targets")
	_, err = syncer.NewRunner(store, store, []syncer.Target{{ID: id, Sink: nopSink{}}, {ID: id, Sink: nopSink{}}}, syncer.Options{})
	wantField(t, "duplicate target", err, "targets[1].id")
	_, err = syncer.NewRunner(store, store, []syncer.Target{{ID: id, Sink: nopSink{}}, {ID: feed.SinkID{Feed: "", Sink: "s"}, Sink: nopSink{}}}, syncer.Options{})
	wantField(t, "bad target name", err, "targets[1].id.feed")
	_, err = syncer.NewRunner(store, store, []syncer.Target{{ID: id}}, syncer.Options{})
	wantField(t, "nil target sink", err, "targets[0].sink")
	_, err = syncer.NewRunner(nil, store, []syncer.Target{{ID: id, Sink: nopSink{}}}, syncer.Options{})
	wantField(t, "nil runner reader", err, "reader")
}
