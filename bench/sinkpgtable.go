package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/pgtable"
)

// measurePgtable measures sinks/pgtable's apply rate at batch SinkApplyBatch
// (300-byte documents, fresh keys) against the same rows sent by a
// hand-written unnest upsert under the same seq guard into a table of the
// same shape, interleaved run by run on fresh tables.
func (e *env) measurePgtable(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	admin, err := e.pool(ctx, 4, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	s, err := e.newSchema(ctx, admin)
	if err != nil {
		return nil, err
	}
	defer s.drop()
	recs := make([]feed.Record, sz.SinkApplyRecs)
	keys := make([]string, len(recs))
	seqs := make([]int64, len(recs))
	docs := make([]string, len(recs))
	for i := range recs {
		recs[i] = feed.Record{Key: feed.Key(fmt.Sprintf("k%08d", i)), Seq: feed.Seq(i + 1), Doc: doc300(i)}
		keys[i], seqs[i], docs[i] = string(recs[i].Key), int64(recs[i].Seq), string(recs[i].Doc)
	}
	var rates, base []float64
	for run := range sz.Runs {
		sink, err := pgtable.New(ctx, admin, pgtable.Options{Schema: s.name, Table: fmt.Sprintf("sink_%d", run), Create: true})
		if err != nil {
			return nil, err
		}
		rate, err := applyRate(ctx, "pgtable", sink, recs, sz.SinkApplyBatch)
		if err != nil {
			return nil, err
		}
		rates = append(rates, rate)

		raw := pgx.Identifier{s.name, fmt.Sprintf("raw_%d", run)}.Sanitize()
		if _, err := admin.Exec(ctx, "CREATE TABLE "+raw+" (key text PRIMARY KEY, seq bigint NOT NULL, doc jsonb)"); err != nil {
			return nil, err
		}
		upsert := "INSERT INTO " + raw + ` AS t (key, seq, doc) SELECT * FROM unnest($1::text[], $2::bigint[], $3::jsonb[])
			ON CONFLICT (key) DO UPDATE SET seq = excluded.seq, doc = excluded.doc WHERE t.seq < excluded.seq`
		start := time.Now()
		for c := 0; c < len(recs); c += sz.SinkApplyBatch {
			end := min(len(recs), c+sz.SinkApplyBatch)
			if _, err := admin.Exec(ctx, upsert, keys[c:end], seqs[c:end], docs[c:end]); err != nil {
				return nil, err
			}
		}
		base = append(base, float64(len(recs))/time.Since(start).Seconds())
	}
	return []Row{newRow("S pgtable", fmt.Sprintf("sink apply rate at batch %d: sinks/pgtable; baseline: a hand-written unnest upsert of the same rows", sz.SinkApplyBatch),
		"records/s", rates, base, "figure/baseline", div, "≥ 0.8×", func(_, ratio float64) bool { return ratio >= 0.8 })}, nil
}
