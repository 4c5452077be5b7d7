package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/blevesearch/bleve/v2"

	kbleve "github.com/kairos-es/kairos/sinks/bleve"
)

// measureBleve measures sinks/bleve's apply rate at batch SinkApplyBatch
// (300-byte documents, fresh keys) into an index on local disk against a
// plain bleve batch of the same records (each document decoded and indexed
// by key, one Batch per SinkApplyBatch records) into an index of the same
// mapping, interleaved run by run in fresh directories.
func (e *env) measureBleve(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	recs := sinkRecords(sz.SinkApplyRecs)
	tmp, err := os.MkdirTemp("", "kairos-bench-bleve-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var rates, base []float64
	for run := range sz.Runs {
		sink, err := kbleve.New(ctx, kbleve.Options{Dir: filepath.Join(tmp, fmt.Sprintf("sink-%d", run))})
		if err != nil {
			return nil, err
		}
		rate, err := applyRate(ctx, "bleve", sink, recs, sz.SinkApplyBatch)
		if cerr := sink.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		rates = append(rates, rate)

		idx, err := bleve.New(filepath.Join(tmp, fmt.Sprintf("raw-%d", run)), kbleve.DefaultMapping())
		if err != nil {
			return nil, err
		}
		start := time.Now()
		for c := 0; c < len(recs) && err == nil; c += sz.SinkApplyBatch {
			b := idx.NewBatch()
			for _, r := range recs[c:min(len(recs), c+sz.SinkApplyBatch)] {
				var doc map[string]any
				if err = json.Unmarshal(r.Doc, &doc); err != nil {
					break
				}
				if err = b.Index(string(r.Key), doc); err != nil {
					break
				}
			}
			if err == nil {
				err = idx.Batch(b)
			}
		}
		elapsed := time.Since(start)
		if cerr := idx.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("the plain bleve baseline: %w", err)
		}
		base = append(base, float64(len(recs))/elapsed.Seconds())
	}
	return []Row{newRow("S bleve", fmt.Sprintf("sink apply rate at batch %d: sinks/bleve into an index on local disk; baseline: a plain bleve batch of the same records, same mapping", sz.SinkApplyBatch),
		"records/s", rates, base, "figure/baseline", div, "≥ 0.8×", func(_, ratio float64) bool { return ratio >= 0.8 })}, nil
}
