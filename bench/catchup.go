package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
)

// measureP4 interleaves, per run, a Kairos worker catching up a CatchUp-row
// backlog into a no-op sink (incremental, from a cursor at 0) with Watermill
// consuming a backlog of as many messages, at its default batch (100) and at
// batch 1000, each on a fresh schema. Figures are rows (messages) per second
// from the consumer's start to its last delivery.
func (e *env) measureP4(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, 4, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	kairos := func(int) (float64, error) {
		s, err := e.newSchema(ctx, admin)
		if err != nil {
			return 0, err
		}
		defer s.drop()
		if err := s.fillFeed(ctx, "p4", sz.CatchUp, false); err != nil {
			return 0, err
		}
		id := feed.SinkID{Feed: "p4", Sink: "s"}
		if err := s.placeCursor(ctx, id, 0); err != nil {
			return 0, err
		}
		st, err := s.store(ctx, admin)
		if err != nil {
			return 0, err
		}
		defer st.Close()
		return catchUp(ctx, st, id, sz.CatchUp, false)
	}
	watermill := func(batch int) func(int) (float64, error) {
		return func(int) (float64, error) {
			s, err := e.newSchema(ctx, admin)
			if err != nil {
				return 0, err
			}
			defer s.drop()
			w, err := e.newWatermill(ctx, s, 0, batch)
			if err != nil {
				return 0, err
			}
			defer w.close()
			if err := w.publishBacklog(sz.CatchUp); err != nil {
				return 0, err
			}
			if _, err := admin.Exec(ctx, "ANALYZE "+s.qualify("watermill_"+wmTopic)); err != nil {
				return 0, err
			}
			var n atomic.Int64
			var last atomic.Pointer[time.Time] // when the last message arrived
			subCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			start := time.Now()
			done, err := w.consume(subCtx, func(_ int, at time.Time) {
				if n.Add(1) == int64(sz.CatchUp) {
					last.Store(&at)
				}
			})
			if err != nil {
				return 0, err
			}
			err = waitFor(ctx, func() bool { return last.Load() != nil })
			var elapsed time.Duration
			if t := last.Load(); t != nil {
				elapsed = t.Sub(start)
			}
			cancel()
			_ = w.sub.Close()
			<-done
			if err != nil {
				return 0, err
			}
			return float64(sz.CatchUp) / elapsed.Seconds(), nil
		}
	}
	out, err := interleaveN(sz.Runs, kairos, watermill(0), watermill(1000))
	if err != nil {
		return nil, err
	}
	return []Row{
		newRow("P4 vs 100", fmt.Sprintf("catch-up of a %d-change backlog into a no-op sink; baseline: Watermill-sql consuming as many messages, default batch (100)", sz.CatchUp),
			"rows/s", out[0], out[1], "figure/baseline", div, "≥ 30×", func(_, r float64) bool { return r >= 30 }),
		newRow("P4 vs 1000", "the same; baseline: Watermill-sql at batch 1000",
			"rows/s", out[0], out[2], "figure/baseline", div, "≥ 5×", func(_, r float64) bool { return r >= 5 }),
	}, nil
}

// measureCollect times CollectTombstones on a feed of Tombstones tombstones
// that both registered sinks have passed, against a raw DELETE of the same
// tombstones, each on a fresh schema.
func (e *env) measureCollect(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, 4, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	prepare := func() (*schema, error) {
		s, err := e.newSchema(ctx, admin)
		if err != nil {
			return nil, err
		}
		if err := s.fillFeed(ctx, "t", sz.Tombstones, true); err != nil {
			s.drop()
			return nil, err
		}
		for _, sink := range []feed.SinkName{"a", "b"} {
			if err := s.placeCursor(ctx, feed.SinkID{Feed: "t", Sink: sink}, sz.Tombstones); err != nil {
				s.drop()
				return nil, err
			}
		}
		return s, nil
	}
	subject := func(int) (float64, error) {
		s, err := prepare()
		if err != nil {
			return 0, err
		}
		defer s.drop()
		st, err := s.store(ctx, admin)
		if err != nil {
			return 0, err
		}
		defer st.Close()
		start := time.Now()
		n, err := st.CollectTombstones(ctx, "t")
		elapsed := time.Since(start)
		if err != nil {
			return 0, err
		}
		if n != sz.Tombstones {
			return 0, fmt.Errorf("collected %d tombstones, want %d", n, sz.Tombstones)
		}
		return float64(elapsed.Nanoseconds()) / 1e6, nil
	}
	baseline := func(int) (float64, error) {
		s, err := prepare()
		if err != nil {
			return 0, err
		}
		defer s.drop()
		start := time.Now()
		tag, err := admin.Exec(ctx, `DELETE FROM `+s.table("rows")+` WHERE feed = 't' AND doc IS NULL`)
		elapsed := time.Since(start)
		if err != nil {
			return 0, err
		}
		if tag.RowsAffected() != int64(sz.Tombstones) {
			return 0, fmt.Errorf("raw delete removed %d rows, want %d", tag.RowsAffected(), sz.Tombstones)
		}
		return float64(elapsed.Nanoseconds()) / 1e6, nil
	}
	sub, base, err := interleave(sz.Runs, subject, baseline)
	if err != nil {
		return nil, err
	}
	return []Row{newRow("C", fmt.Sprintf("tombstone collection of %d tombstones, 2 registered sinks past them; baseline: a raw DELETE of the same rows", sz.Tombstones),
		"ms", sub, base, "figure/baseline", div, "", nil)}, nil
}

// sinkRecords are the records every sink row applies: n fresh keys, each
// with a 300-byte document, at seqs 1..n.
func sinkRecords(n int) []feed.Record {
	recs := make([]feed.Record, n)
	for i := range recs {
		recs[i] = feed.Record{Key: feed.Key(fmt.Sprintf("k%08d", i)), Seq: feed.Seq(i + 1), Doc: doc300(i)}
	}
	return recs
}

// applyRate applies recs to sink in batches of batch and returns the rate in
// records/s; a rejection fails the row, since every record is valid.
func applyRate(ctx context.Context, what string, sink feed.Sink, recs []feed.Record, batch int) (float64, error) {
	start := time.Now()
	for c := 0; c < len(recs); c += batch {
		rej, err := sink.Apply(ctx, recs[c:min(len(recs), c+batch)])
		if err != nil {
			return 0, err
		}
		if len(rej) != 0 {
			return 0, fmt.Errorf("%s rejected %d records: %s", what, len(rej), rej[0].Reason)
		}
	}
	return float64(len(recs)) / time.Since(start).Seconds(), nil
}

// measureSinks measures the in-memory reference sink's apply rate at batch
// SinkApplyBatch; each real sink has a measurement of its own beside its raw
// baseline (sinkpgtable.go, sinkmysql.go, sinkwebhook.go).
func (e *env) measureSinks(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	recs := sinkRecords(sz.SinkApplyRecs)
	var rates []float64
	for range sz.Runs {
		sink := memfeed.NewSink(memfeed.SinkOptions{})
		rate, err := applyRate(ctx, "memfeed sink", sink, recs, sz.SinkApplyBatch)
		if err != nil {
			return nil, err
		}
		rates = append(rates, rate)
		if got := len(sink.Documents()); got != len(recs) {
			return nil, fmt.Errorf("memfeed sink holds %d documents, want %d", got, len(recs))
		}
	}
	return []Row{newRow("S memfeed", fmt.Sprintf("sink apply rate at batch %d: memfeed (in-memory reference sink)", sz.SinkApplyBatch),
		"records/s", rates, nil, "", nil, "", nil)}, nil
}
