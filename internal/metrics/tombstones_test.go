package metrics

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kairos-es/kairos/feed"
)

// The gauge is absent before a feed's first read, 0 when the feed holds no
// tombstone, the read's age plus the time since otherwise (so it grows
// between reads); a failed read keeps the last figure, and a feed no longer
// named leaves the metric.
func TestTombstones(t *testing.T) {
	tb := NewTombstones()
	var (
		mu    sync.Mutex
		clock = time.Unix(1000, 0)
		feeds = []feed.FeedName{"a", "b"}
		fail  bool
	)
	tb.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	read := func(_ context.Context, f feed.FeedName) (time.Time, time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return time.Time{}, 0, errors.New("down")
		}
		if f == "a" {
			return clock.Add(-5 * time.Second), 5 * time.Second, nil
		}
		return time.Time{}, 0, nil // b holds none
	}
	value := func(f string) (float64, bool) {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(tb)
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, fam := range fams {
			for _, m := range fam.GetMetric() {
				if m.GetLabel()[0].GetValue() == f {
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	if _, ok := value("a"); ok {
		t.Fatal("a series before any read; want none")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	reads := make(chan struct{}, 100)
	counted := func(ctx context.Context, f feed.FeedName) (time.Time, time.Duration, error) {
		defer func() { reads <- struct{}{} }()
		return read(ctx, f)
	}
	names := func() []feed.FeedName { mu.Lock(); defer mu.Unlock(); return append([]feed.FeedName(nil), feeds...) }
	done := make(chan struct{})
	go func() {
		defer close(done)
		tb.Run(ctx, 10*time.Millisecond, names, counted, slog.New(slog.DiscardHandler))
	}()
	wait := func() { // one full pass over both feeds
		for range 2 {
			<-reads
		}
	}
	wait()
	wait()
	if v, ok := value("a"); !ok || v != 5 {
		t.Fatalf("a = %v, %v; want 5", v, ok)
	}
	if v, ok := value("b"); !ok || v != 0 {
		t.Fatalf("b = %v, %v; want 0 (no tombstone)", v, ok)
	}
	mu.Lock()
	fail = true
	mu.Unlock()
	wait()
	wait()
	mu.Lock()
	clock = clock.Add(2 * time.Second)
	mu.Unlock()
	if v, _ := value("a"); v != 7 {
		t.Fatalf("a after failed reads and 2s = %v; want 7 (the last age, grown)", v)
	}
	mu.Lock()
	fail, feeds = false, []feed.FeedName{"b"}
	mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := value("a"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a feed no longer named is still shown")
		}
		<-reads
	}
	cancel()
	<-done
}

// Each named feed has both counters from the start, at 0; they count what
// they are told; a feed no longer named leaves them.
func TestCollections(t *testing.T) {
	c := NewCollections()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	gather := func() map[string]float64 {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, fam := range fams {
			for _, m := range fam.GetMetric() {
				out[fam.GetName()+"{"+m.GetLabel()[0].GetValue()+"}"] = m.GetCounter().GetValue()
			}
		}
		return out
	}
	const coll, errs = "kairos_feed_tombstones_collected_total", "kairos_feed_tombstone_collection_errors_total"
	c.Keep([]feed.FeedName{"a", "b"})
	if got := gather(); len(got) != 4 || got[coll+"{a}"] != 0 || got[errs+"{b}"] != 0 {
		t.Fatalf("after Keep(a, b): %v; want both counters of both feeds at 0", got)
	}
	c.Collected("a", 3)
	c.Collected("a", 2)
	c.Failed("b")
	c.Keep([]feed.FeedName{"a"})
	got := gather()
	if len(got) != 2 || got[coll+"{a}"] != 5 || got[errs+"{a}"] != 0 {
		t.Errorf("after counting and Keep(a): %v; want a's 5 collected and b gone", got)
	}
}
