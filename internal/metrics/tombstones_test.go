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
