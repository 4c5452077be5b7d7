package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// catchUp runs one worker of id into a no-op sink until its cursor reaches
// seq want, and returns the rows per second from Run's start to the landing
// of the move that reached want: lease take, cursor read and every batch
// included. The sink's cursor must already be
// placed (incremental) or absent (resync).
func catchUp(ctx context.Context, st *pgfeed.Store, id feed.SinkID, want int, resync bool) (float64, error) {
	return catchUpRS(ctx, st, st, id, want, resync)
}

// catchUpRS is catchUp over a reader and a store that may differ.
func catchUpRS(ctx context.Context, rd feed.Reader, ss feed.SyncStore, id feed.SinkID, want int, resync bool) (float64, error) {
	sink := &noopSink{}
	w, err := syncer.NewWorker(struct {
		feed.Reader
		feed.SyncStore
	}{rd, ss}, id, sink, syncer.Options{Logger: quiet, PollInterval: time.Minute})
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(runCtx) }()
	err = waitFor(ctx, func() bool {
		s := w.State()
		if resync {
			return s.Resyncs >= 1
		}
		return s.Cursor.Seq >= feed.Seq(want)
	})
	// The clock stops when the move that reached want landed, which the
	// worker stamps as its last advance, not when the poll above saw it.
	elapsed := w.State().LastAdvance.Sub(start)
	cancel()
	<-done
	if err != nil {
		return 0, err
	}
	if got := sink.n.Load(); got < int64(want) {
		return 0, fmt.Errorf("worker of %s reached its cursor after sending %d of %d rows", id.Sink, got, want)
	}
	return float64(want) / elapsed.Seconds(), nil
}

// keysetScan reads feed f as fast as plain SQL can: a keyset scan of 1000 rows
// at a time, documents as []byte. It returns rows per second.
func keysetScan(ctx context.Context, p *pgxpool.Pool, s *schema, f feed.FeedName, want int) (float64, error) {
	q := `SELECT key, seq, doc FROM ` + s.table("rows") + ` WHERE feed = $1::text AND seq > $2::bigint ORDER BY seq LIMIT 1000`
	start := time.Now()
	var after int64
	n := 0
	for {
		rows, err := p.Query(ctx, q, string(f), after)
		if err != nil {
			return 0, err
		}
		got := 0
		for rows.Next() {
			var (
				key string
				doc []byte
			)
			if err := rows.Scan(&key, &after, &doc); err != nil {
				rows.Close()
				return 0, err
			}
			got++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		n += got
		if got < 1000 {
			break
		}
	}
	if n != want {
		return 0, fmt.Errorf("keyset scan read %d rows, want %d", n, want)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// measureLarge builds, per run, one fresh schema holding a Backlog-row feed
// and a SmallBacklog-row feed, and measures on it, read-only for the feed
// rows: describe with DescribeSinks registered sinks, P2 (a worker's
// incremental sync against a raw keyset scan, interleaved) and P5 (resyncs of
// both feeds in child processes). Building a million rows costs more than any
// one of these reads, so the reads of one run share it; each run builds anew.
func (e *env) measureLarge(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, 4, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	var p2, scan, describe, resyncBig, resyncSmall, rss []float64
	for r := range sz.Runs {
		err := func() error {
			s, err := e.newSchema(ctx, admin)
			if err != nil {
				return err
			}
			defer s.drop()
			t0 := time.Now()
			if err := s.fillFeed(ctx, "big", sz.Backlog, false); err != nil {
				return err
			}
			if err := s.fillFeed(ctx, "small", sz.SmallBacklog, false); err != nil {
				return err
			}
			e.logf("run %d: built %d + %d rows in %v", r+1, sz.Backlog, sz.SmallBacklog, time.Since(t0).Round(time.Millisecond))
			st, err := s.store(ctx, admin)
			if err != nil {
				return err
			}
			defer st.Close()
			// Warm-up: one scan brings the rows into the caches for both sides.
			if _, err := keysetScan(ctx, admin, s, "big", sz.Backlog); err != nil {
				return err
			}

			// describe: DescribeSinks sinks with cursors spread over the feed,
			// so each has a different number of pending rows to count.
			for i := range sz.DescribeSinks {
				id := feed.SinkID{Feed: "big", Sink: feed.SinkName(fmt.Sprintf("d%02d", i))}
				if err := s.placeCursor(ctx, id, i*sz.Backlog/sz.DescribeSinks); err != nil {
					return err
				}
			}
			var calls []float64
			for range sz.DescribeCalls {
				start := time.Now()
				d, err := st.Describe(ctx, "big")
				if err != nil {
					return err
				}
				calls = append(calls, float64(time.Since(start).Nanoseconds())/1e6)
				if len(d.Sinks) != sz.DescribeSinks {
					return fmt.Errorf("describe reports %d sinks, want %d", len(d.Sinks), sz.DescribeSinks)
				}
			}
			describe = append(describe, summarize(calls).Median)
			if _, err := admin.Exec(ctx, `DELETE FROM `+s.table("cursors")); err != nil {
				return err
			}

			// P2, interleaved within the run.
			p2ID := feed.SinkID{Feed: "big", Sink: "p2"}
			if err := s.placeCursor(ctx, p2ID, 0); err != nil {
				return err
			}
			sub := func() error {
				v, err := catchUp(ctx, st, p2ID, sz.Backlog, false)
				p2 = append(p2, v)
				return err
			}
			base := func() error {
				v, err := keysetScan(ctx, admin, s, "big", sz.Backlog)
				scan = append(scan, v)
				return err
			}
			if r%2 == 1 {
				sub, base = base, sub
			}
			if err := sub(); err != nil {
				return err
			}
			if err := base(); err != nil {
				return err
			}

			// P5 in child processes, the order alternating by run.
			big := func() error {
				res, err := e.childResync(ctx, s.name, "big", "p5", sz.Backlog)
				if err == nil {
					resyncBig = append(resyncBig, res.Seconds)
					rss = append(rss, float64(res.PeakRSSKiB)/1024)
				}
				return err
			}
			small := func() error {
				res, err := e.childResync(ctx, s.name, "small", "p5", sz.SmallBacklog)
				if err == nil {
					resyncSmall = append(resyncSmall, res.Seconds)
				}
				return err
			}
			if r%2 == 1 {
				big, small = small, big
			}
			if err := big(); err != nil {
				return err
			}
			return small()
		}()
		if err != nil {
			return nil, err
		}
	}
	// Linearity (P5b) is the time per row at the large size over the time
	// per row at the small one, from the medians; 1 is perfectly linear.
	rows := []Row{
		newRow("P2", fmt.Sprintf("sync throughput of one worker into a no-op sink, %d-row backlog; baseline: raw keyset scan (LIMIT 1000, documents as []byte)", sz.Backlog),
			"rows/s", p2, scan, "figure/baseline", div, "≥ 0.8×", func(_, r float64) bool { return r >= 0.8 }),
		newRow("P5a", fmt.Sprintf("resync of a %d-row feed into a no-op sink: peak RSS of the worker's process", sz.Backlog),
			"MiB", rss, nil, "", nil, "≤ 64 MiB", func(f, _ float64) bool { return f <= 64 }),
		newRow("P5b", fmt.Sprintf("resync time of %d rows; baseline: resync of %d rows", sz.Backlog, sz.SmallBacklog),
			"s", resyncBig, resyncSmall, "per-row time, large/small", func(f, b float64) float64 {
				return (f / float64(sz.Backlog)) / (b / float64(sz.SmallBacklog))
			}, "≤ 1.25× (linear)", func(_, r float64) bool { return r <= 1.25 }),
		newRow("D", fmt.Sprintf("describe of a %d-row feed with %d registered sinks, per call", sz.Backlog, sz.DescribeSinks),
			"ms", describe, nil, "", nil, "", nil),
	}
	return rows, nil
}
