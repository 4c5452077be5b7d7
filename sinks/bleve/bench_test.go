package bleve_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blevesearch/bleve/v2"

	"github.com/kairos-es/kairos/feed"
	kbleve "github.com/kairos-es/kairos/sinks/bleve"
)

// BenchmarkApply measures the sink's apply rate at batch 500 with 300-byte
// documents, beside its raw baseline in the same run: the same records as a
// plain bleve batch into an index of the same mapping.
//
//	go test -run '^$' -bench Apply -benchtime 40x ./sinks/bleve
func BenchmarkApply(b *testing.B) {
	const batch = 500
	pad := strings.Repeat("x", 300-len(`{"n":0000000,"note":"","pad":""}`)-24)
	batches := func(n int) [][]feed.Record {
		out := make([][]feed.Record, n)
		for i := range out {
			rs := make([]feed.Record, batch)
			for j := range rs {
				k := i*batch + j
				rs[j] = feed.Record{Key: feed.Key(fmt.Sprintf("key-%08d", k)), Seq: feed.Seq(k + 1),
					Doc: []byte(fmt.Sprintf(`{"n":%7d,"note":"order %d of many words","pad":"%s"}`, k, k%977, pad))}
			}
			out[i] = rs
		}
		return out
	}
	b.Run("sink", func(b *testing.B) {
		s := newSink(b, kbleve.Options{Dir: b.TempDir()})
		bs := batches(b.N)
		b.ResetTimer()
		for i := range b.N {
			if rej, err := s.Apply(b.Context(), bs[i]); err != nil || len(rej) != 0 {
				b.Fatal(len(rej), err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "records/s")
	})
	b.Run("raw", func(b *testing.B) {
		idx, err := bleve.New(filepath.Join(b.TempDir(), "raw"), kbleve.DefaultMapping())
		if err != nil {
			b.Fatal(err)
		}
		defer idx.Close()
		bs := batches(b.N)
		b.ResetTimer()
		for i := range b.N {
			bt := idx.NewBatch()
			for _, r := range bs[i] {
				var doc map[string]any
				if err := json.Unmarshal(r.Doc, &doc); err != nil {
					b.Fatal(err)
				}
				if err := bt.Index(string(r.Key), doc); err != nil {
					b.Fatal(err)
				}
			}
			if err := idx.Batch(bt); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "records/s")
	})
}
