package main

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/metrics"
)

// collector deletes, every collect.interval, each running feed's
// tombstones that every registered sink has passed: the store's
// CollectTombstones, the same safe collection kairos collect runs by hand,
// which keeps a tombstone while any registered sink (running here,
// elsewhere or nowhere) has not passed it, has no cursor, or has its key
// parked. A daemon left running therefore keeps its feeds from growing a
// tombstone per deleted key for ever.
//
// Several daemons over one database each collect. That is safe because a
// collection is one statement against one snapshot of the cursors that
// never waits on a row: two at once split the tombstones between them,
// each deleted and counted once, and one a writer holds is left for the
// next collection, so a collection can never deadlock with the
// application's writes. A cursor a worker moves meanwhile only means a
// later collection takes more. Collections are not serialized by a lock of
// their own, which through a transaction pooler would need a transaction
// held open around the statement; instead the first collection waits a
// random part of the interval and each later one the interval give or take
// a tenth, so daemons started together drift apart rather than collect in
// step.
type collector struct {
	collect func(context.Context, feed.FeedName) (int, error)
	feeds   func() []feed.FeedName
	// collected is called after a collection that deleted something, to
	// have the oldest tombstone's age read again at once.
	collected func(context.Context, feed.FeedName)
	counts    *metrics.Collections
	log       *slog.Logger
	url       string // the database's, redacted from errors

	interval atomic.Int64 // a time.Duration; 0: off
	changed  chan struct{}
}

func newCollector(interval time.Duration) *collector {
	c := &collector{changed: make(chan struct{}, 1)}
	c.interval.Store(int64(interval))
	return c
}

// setInterval applies a reloaded collect.interval: the wait under way is
// dropped and a new one, jittered as at the start, begins.
func (c *collector) setInterval(d time.Duration) {
	if time.Duration(c.interval.Swap(int64(d))) == d {
		return
	}
	c.log.Info("reload: collect.interval changed", "interval", d.String())
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// wait is how long to wait before the next collection: a random part of
// the interval before the first, the interval give or take a tenth after.
func wait(interval time.Duration, first bool) time.Duration {
	if first {
		return rand.N(interval)
	}
	return interval - interval/10 + rand.N(interval/5+1)
}

// run collects until ctx ends.
func (c *collector) run(ctx context.Context) {
	first := true
	for {
		iv := time.Duration(c.interval.Load())
		var timer *time.Timer
		var due <-chan time.Time
		if iv > 0 {
			timer = time.NewTimer(wait(iv, first))
			due = timer.C
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-c.changed:
			if timer != nil {
				timer.Stop()
			}
			first = true
			continue
		case <-due:
		}
		first = false
		c.once(ctx, iv)
	}
}

// once collects every running feed's tombstones. A failed collection is
// logged and counted, and the next interval tries again.
func (c *collector) once(ctx context.Context, iv time.Duration) {
	feeds := c.feeds()
	c.counts.Keep(feeds)
	for _, f := range feeds {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, max(iv, time.Minute))
		n, err := c.collect(cctx, f)
		cancel()
		took := time.Since(start)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.counts.Failed(f)
			c.log.Warn("collecting tombstones failed; tried again at the next interval", "feed", string(f), "took", took, "error", redactErr(err, c.url))
			continue
		}
		if n == 0 {
			c.log.Debug("no tombstones to collect", "feed", string(f), "took", took)
			continue
		}
		c.counts.Collected(f, n)
		c.log.Info("tombstones collected", "feed", string(f), "count", n, "took", took)
		if c.collected != nil {
			c.collected(ctx, f)
		}
	}
}
