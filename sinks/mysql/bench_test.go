package mysql

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kairos-es/kairos/feed"
)

// BenchmarkApply measures the sink's apply rate at batch 500 with 300-byte
// documents, beside its raw baseline in the same run: the same rows by a
// hand-written multi-row INSERT … ON DUPLICATE KEY UPDATE without a guard,
// on the same server.
//
//	CI=1 go test -run '^$' -bench Apply -benchtime 40x ./sinks/mysql
func BenchmarkApply(b *testing.B) {
	const batch, keys = 500, 20_000
	pad := strings.Repeat("x", 300-len(`{"n":0000000,"pad":""}`))
	batches := func(start int) [][]feed.Record {
		out := make([][]feed.Record, 0, 64)
		for i := range 64 {
			rs := make([]feed.Record, batch)
			for j := range rs {
				n := start + i*batch + j
				rs[j] = feed.Record{Key: feed.Key(fmt.Sprintf("key-%06d", n%keys)), Seq: feed.Seq(n + 1), Doc: []byte(fmt.Sprintf(`{"n":%7d,"pad":"%s"}`, n, pad))}
			}
			out = append(out, rs)
		}
		return out
	}
	b.Run("sink", func(b *testing.B) {
		s, _ := openSink(b, tableName(b, adminDB(b)), true)
		bs := batches(0)
		b.ResetTimer()
		for i := range b.N {
			rs := bs[i%len(bs)]
			for j := range rs {
				rs[j].Seq += feed.Seq(len(bs) * batch) // always newer, so every row is written
			}
			if rej, err := s.Apply(b.Context(), rs); err != nil || len(rej) != 0 {
				b.Fatal(len(rej), err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "records/s")
	})
	b.Run("raw", func(b *testing.B) {
		admin := adminDB(b)
		table := tableName(b, admin)
		s, _ := openSink(b, table, true) // the same table shape
		bs := batches(0)
		b.ResetTimer()
		for i := range b.N {
			rs := bs[i%len(bs)]
			var q strings.Builder
			q.WriteString("INSERT INTO `" + table + "` (`key`, `seq`, `doc`) VALUES ")
			args := make([]any, 0, 3*len(rs))
			for j, r := range rs {
				if j > 0 {
					q.WriteString(",")
				}
				q.WriteString("(?,?,?)")
				args = append(args, []byte(r.Key), int64(r.Seq)+int64(i*batch), []byte(r.Doc))
			}
			q.WriteString(" ON DUPLICATE KEY UPDATE `doc` = VALUES(`doc`), `seq` = VALUES(`seq`)")
			if _, err := s.db.ExecContext(b.Context(), q.String(), args...); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "records/s")
	})
}
