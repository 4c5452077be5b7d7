package pgfeed_test

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// BenchmarkWriteBatch writes batches of 1000 changes, one transaction each,
// and reports rows per second: the writer's one-statement path.
func BenchmarkWriteBatch(b *testing.B) {
	d := setupB(b)
	s := newStore(b, d, pgfeed.Options{})
	changes := make([]feed.Change, 1000)
	for i := range changes {
		changes[i] = feed.Put(feed.Key(fmt.Sprintf("key-%06d", i)), []byte(fmt.Sprintf(`{"id": %d, "name": "document %d", "tags": ["a", "b"]}`, i, i)))
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.WriteCommitted(b.Context(), "bench", changes); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(changes))/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkReadBatch reads a 10,000-row feed in batches of 1000.
func BenchmarkReadBatch(b *testing.B) {
	d := setupB(b)
	s := newStore(b, d, pgfeed.Options{})
	changes := make([]feed.Change, 10_000)
	for i := range changes {
		changes[i] = feed.Put(feed.Key(fmt.Sprintf("key-%06d", i)), []byte(fmt.Sprintf(`{"id": %d, "name": "document %d", "tags": ["a", "b"]}`, i, i)))
	}
	if _, err := s.WriteCommitted(b.Context(), "bench", changes); err != nil {
		b.Fatal(err)
	}
	rows := 0
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	for b.Loop() {
		var after feed.Seq
		for {
			batch, err := s.ReadBatch(b.Context(), "bench", after, feed.BatchLimit{Records: 1000})
			if err != nil {
				b.Fatal(err)
			}
			if len(batch.Records) == 0 {
				break
			}
			rows += len(batch.Records)
			after = batch.Records[len(batch.Records)-1].Seq
		}
	}
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	b.ReportMetric(float64(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano())/float64(rows), "cpu-ns/row")
}

func setupB(b *testing.B) db {
	b.Helper()
	pool := pgtest.Pool(b, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(b)
	if _, err := pgfeed.Migrate(b.Context(), pool, pgfeed.Options{Schema: schema}); err != nil {
		b.Fatal(err)
	}
	return db{pool: pool, schema: schema}
}
