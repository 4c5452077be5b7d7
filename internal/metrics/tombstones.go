package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kairos-es/kairos/feed"
)

// mTombstoneAge is the age of each feed's oldest tombstone. It is an age,
// not the deletion's timestamp: the age is measured on the database's
// clock at each read and grows on this process's monotonic clock until the
// next, so a clock of this host that disagrees with the database's (or with
// Prometheus's) plays no part.
var mTombstoneAge = prometheus.NewDesc("kairos_feed_oldest_tombstone_age_seconds",
	"Age of the feed's oldest tombstone, as of the last background read plus the time since; 0 when the feed holds none. One that keeps growing says collection is held back: a sink has not passed it, it is parked, or no collection ran (kairos collect says which sink holds it back).",
	[]string{"feed"}, nil)

// TombstoneReader reads when f's oldest tombstone was made and its age on
// the store's clock; a zero at means f holds none. pgfeed.Store's
// OldestTombstone is one.
type TombstoneReader func(ctx context.Context, f feed.FeedName) (at time.Time, age time.Duration, err error)

// Tombstones holds each feed's oldest tombstone as a background loop (Run)
// last read it, and shows it as kairos_feed_oldest_tombstone_age_seconds.
// A scrape reads only what the loop left, so it runs no query: one read
// per feed per interval, however often Prometheus scrapes.
type Tombstones struct {
	mu    sync.Mutex
	feeds map[feed.FeedName]tombstoneRead
	now   func() time.Time
}

// tombstoneRead is one feed's last successful read: the oldest tombstone's
// age then (none: the feed held no tombstone), and when, on this process's
// monotonic clock.
type tombstoneRead struct {
	none bool
	age  time.Duration
	at   time.Time
}

// NewTombstones makes the collector, empty until Run's first read.
func NewTombstones() *Tombstones {
	return &Tombstones{feeds: map[feed.FeedName]tombstoneRead{}, now: time.Now}
}

// Run reads the oldest tombstone of every feed feeds names, at once and
// then every interval, until ctx ends. A feed feeds no longer names leaves
// the metric at the next read. A failed read is logged and leaves the
// feed's last figure, which goes on growing: a tombstone that was there is
// taken to be there still until a read says otherwise. A feed has no
// figure before its first successful read.
func (t *Tombstones) Run(ctx context.Context, interval time.Duration, feeds func() []feed.FeedName, read TombstoneReader, log *slog.Logger) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		names := feeds()
		wanted := make(map[feed.FeedName]bool, len(names))
		for _, f := range names {
			wanted[f] = true
			rctx, cancel := context.WithTimeout(ctx, max(interval, time.Second))
			at, age, err := read(rctx, f)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Warn("reading the oldest tombstone failed; its age goes on from the last read", "feed", string(f), "err", err)
				continue
			}
			t.set(f, tombstoneRead{none: at.IsZero(), age: age, at: t.now()})
		}
		t.keep(wanted)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (t *Tombstones) set(f feed.FeedName, r tombstoneRead) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.feeds[f] = r
}

// keep forgets every feed not in wanted.
func (t *Tombstones) keep(wanted map[feed.FeedName]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for f := range t.feeds {
		if !wanted[f] {
			delete(t.feeds, f)
		}
	}
}

func (t *Tombstones) Describe(ch chan<- *prometheus.Desc) { ch <- mTombstoneAge }

func (t *Tombstones) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	for f, r := range t.feeds {
		v := 0.0
		if !r.none {
			v = (r.age + now.Sub(r.at)).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(mTombstoneAge, prometheus.GaugeValue, v, string(f))
	}
}
