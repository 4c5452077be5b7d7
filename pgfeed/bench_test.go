package pgfeed_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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

// BenchmarkReadBatchBytes weighs the two places a batch's byte bound can be
// kept, on the same feeds: "client" is ReadBatch, which stops keeping rows
// once the bound is passed (the rest of the LIMIT still crosses the wire);
// "sql" bounds the batch in the statement with a running sum of each row's
// text length, so nothing past the bound is sent but every document is
// converted to text once more. "small" is the catch-up path (documents of
// about 60 bytes, where a 16 MiB bound never cuts); "large" is 64 KiB
// documents under a 1 MiB bound, where every batch is cut; "unbounded" is
// ReadBatch with no byte bound, the cost of the reads before it had one.
func BenchmarkReadBatchBytes(b *testing.B) {
	d := setupB(b)
	s := newStore(b, d, pgfeed.Options{})
	small := make([]feed.Change, 10_000)
	for i := range small {
		small[i] = feed.Put(feed.Key(fmt.Sprintf("key-%06d", i)), []byte(fmt.Sprintf(`{"id": %d, "name": "document %d", "tags": ["a", "b"]}`, i, i)))
	}
	if _, err := s.WriteCommitted(b.Context(), "small", small); err != nil {
		b.Fatal(err)
	}
	pad := strings.Repeat("0123456789abcdef", 4<<10)
	large := make([]feed.Change, 200)
	for i := range large {
		large[i] = feed.Put(feed.Key(fmt.Sprintf("key-%06d", i)), []byte(fmt.Sprintf(`{"id": %d, "pad": "%d%s"}`, i, i, pad)))
	}
	if _, err := s.WriteCommitted(b.Context(), "large", large); err != nil {
		b.Fatal(err)
	}
	byteSQL := `SELECT key, seq, doc FROM (
  SELECT key, seq, doc, row_number() OVER w AS n,
         sum(octet_length(key) + coalesce(octet_length(doc::text), 0)) OVER w AS total
  FROM ` + pgx.Identifier{d.schema, "feed_rows"}.Sanitize() + `
  WHERE feed = $1::text AND seq > $2::bigint
  WINDOW w AS (ORDER BY seq ROWS UNBOUNDED PRECEDING)
  ORDER BY seq LIMIT $3::bigint) s
WHERE total <= $4::bigint OR n = 1 ORDER BY seq`
	sqlRead := func(f feed.FeedName, after feed.Seq, limit feed.BatchLimit) (int, feed.Seq, error) {
		rows, err := d.pool.Query(b.Context(), byteSQL, string(f), int64(after), int64(limit.Records), int64(limit.Bytes))
		if err != nil {
			return 0, 0, err
		}
		defer rows.Close()
		var (
			key, doc pgtype.DriverBytes
			seq      int64
			n        int
			kept     []byte
		)
		for rows.Next() {
			if err := rows.Scan(&key, &seq, &doc); err != nil {
				return 0, 0, err
			}
			kept = append(append(kept[:0], key...), doc...)
			n++
		}
		return n, feed.Seq(seq), rows.Err()
	}
	for _, c := range []struct {
		feed  feed.FeedName
		bytes int
	}{{"small", 16 << 20}, {"large", 1 << 20}} {
		limit := feed.BatchLimit{Records: 1000, Bytes: c.bytes}
		for _, how := range []string{"client", "sql", "unbounded"} {
			b.Run(string(c.feed)+"/"+how, func(b *testing.B) {
				rows := 0
				for b.Loop() {
					var after feed.Seq
					for {
						var n int
						if how != "sql" {
							l := limit
							if how == "unbounded" {
								l.Bytes = 0
							}
							batch, err := s.ReadBatch(b.Context(), c.feed, after, l)
							if err != nil {
								b.Fatal(err)
							}
							if n = len(batch.Records); n > 0 {
								after = batch.Records[n-1].Seq
							}
						} else {
							var err error
							if n, after, err = sqlRead(c.feed, after, limit); err != nil {
								b.Fatal(err)
							}
						}
						if n == 0 {
							break
						}
						rows += n
					}
				}
				b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
			})
		}
	}
}
