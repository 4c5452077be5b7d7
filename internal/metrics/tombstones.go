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
	"Age of the feed's oldest tombstone, as of the last background read plus the time since; 0 when the feed holds none. kairos run collects tombstones every collect.interval, so one that keeps growing past that says collection is held back: a sink has not passed it, it is parked, or collection is off or failing (kairos collect says which sink holds it back).",
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
			if err := t.Read(ctx, f, max(interval, time.Second), read); err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Warn("reading the oldest tombstone failed; its age goes on from the last read", "feed", string(f), "err", err)
			}
		}
		t.keep(wanted)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Read reads f's oldest tombstone once, within timeout, outside Run's
// rhythm: a collection that removed tombstones has the figure read again at
// once rather than left at the age of a tombstone that is gone. A failed
// read leaves the last figure.
func (t *Tombstones) Read(ctx context.Context, f feed.FeedName, timeout time.Duration, read TombstoneReader) error {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	at, age, err := read(rctx, f)
	if err != nil {
		return err
	}
	t.set(f, tombstoneRead{none: at.IsZero(), age: age, at: t.now()})
	return nil
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

// Collections counts the tombstones kairos run's background collection
// deleted, and the collections that failed, by feed. Unlike the other
// figures these are counted as they happen: a deletion leaves nothing in
// the store to read back at a scrape.
type Collections struct {
	collected *prometheus.CounterVec
	errors    *prometheus.CounterVec

	mu    sync.Mutex
	feeds map[feed.FeedName]bool // those with series
}

// NewCollections makes the collection counters, with no series until a
// feed is named (Keep).
func NewCollections() *Collections {
	return &Collections{
		collected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kairos_feed_tombstones_collected_total",
			Help: "Tombstones kairos run's background collection deleted (every registered sink had passed them and none was parked); kairos collect run by hand is not counted.",
		}, []string{"feed"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kairos_feed_tombstone_collection_errors_total",
			Help: "Background collections of the feed's tombstones that failed; each is logged and tried again at the next collect.interval.",
		}, []string{"feed"}),
		feeds: map[feed.FeedName]bool{},
	}
}

// Keep makes the series of each of feeds exist, at 0 until counted, so
// that a rate over them starts at the daemon's start rather than at its
// first deletion, and drops those of every other feed: a feed a reload
// removed leaves /metrics, as its sinks do.
func (c *Collections) Keep(feeds []feed.FeedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wanted := make(map[feed.FeedName]bool, len(feeds))
	for _, f := range feeds {
		wanted[f] = true
		c.feeds[f] = true
		c.collected.WithLabelValues(string(f))
		c.errors.WithLabelValues(string(f))
	}
	for f := range c.feeds {
		if !wanted[f] {
			delete(c.feeds, f)
			c.collected.DeleteLabelValues(string(f))
			c.errors.DeleteLabelValues(string(f))
		}
	}
}

// Collected counts n tombstones deleted from f.
func (c *Collections) Collected(f feed.FeedName, n int) {
	c.collected.WithLabelValues(string(f)).Add(float64(n))
}

// Failed counts a failed collection of f.
func (c *Collections) Failed(f feed.FeedName) { c.errors.WithLabelValues(string(f)).Inc() }

func (c *Collections) Describe(ch chan<- *prometheus.Desc) {
	c.collected.Describe(ch)
	c.errors.Describe(ch)
}

func (c *Collections) Collect(ch chan<- prometheus.Metric) {
	c.collected.Collect(ch)
	c.errors.Collect(ch)
}
