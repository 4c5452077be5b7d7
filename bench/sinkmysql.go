package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // the database/sql driver the baseline writes through

	"github.com/kairos-es/kairos/sinks/mysql"
)

// mysqlDSN is the MariaDB (or MySQL) server the mysql sink's row writes to:
// KAIROS_BENCH_MYSQL_DSN, else KAIROS_TEST_MYSQL_DSN, else the local MariaDB
// as root, database test (what scripts/test makes sure of).
func mysqlDSN() string {
	for _, v := range []string{"KAIROS_BENCH_MYSQL_DSN", "KAIROS_TEST_MYSQL_DSN"} {
		if d := os.Getenv(v); d != "" {
			return d
		}
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

// measureMysql measures sinks/mysql's apply rate at batch SinkApplyBatch
// (300-byte documents, fresh keys) against the same rows sent by a
// hand-written multi-row INSERT … ON DUPLICATE KEY UPDATE under the same seq
// guard into a table of the same shape, interleaved run by run on fresh
// tables.
func (e *env) measureMysql(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	db, err := sql.Open("mysql", mysqlDSN())
	if err != nil {
		return nil, fmt.Errorf("the MariaDB DSN: %w", err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("MariaDB does not answer (scripts/test starts it): %w", err)
	}
	recs := sinkRecords(sz.SinkApplyRecs)
	tag := time.Now().UnixNano()
	var rates, base []float64
	for run := range sz.Runs {
		table := fmt.Sprintf("kb_sink_%d_%d", tag%1e9, run)
		raw := fmt.Sprintf("kb_raw_%d_%d", tag%1e9, run)
		defer db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + raw + "`") // best effort, at the end of the row
		sink, err := mysql.New(ctx, db, mysql.Options{Table: table, Create: true})
		if err != nil {
			return nil, err
		}
		rate, err := applyRate(ctx, "mysql", sink, recs, sz.SinkApplyBatch)
		if err != nil {
			return nil, err
		}
		rates = append(rates, rate)

		if _, err := db.ExecContext(ctx, "CREATE TABLE `"+raw+"` LIKE `"+table+"`"); err != nil {
			return nil, err
		}
		start := time.Now()
		for c := 0; c < len(recs); c += sz.SinkApplyBatch {
			batch := recs[c:min(len(recs), c+sz.SinkApplyBatch)]
			var q strings.Builder
			q.WriteString("INSERT INTO `" + raw + "` (`key`, `seq`, `doc`) VALUES ")
			args := make([]any, 0, 3*len(batch))
			for j, r := range batch {
				if j > 0 {
					q.WriteString(",")
				}
				q.WriteString("(?,?,?)")
				args = append(args, []byte(r.Key), int64(r.Seq), []byte(r.Doc))
			}
			q.WriteString(" ON DUPLICATE KEY UPDATE `doc` = IF(`seq` < VALUES(`seq`), VALUES(`doc`), `doc`), `seq` = IF(`seq` < VALUES(`seq`), VALUES(`seq`), `seq`)")
			if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
				return nil, err
			}
		}
		base = append(base, float64(len(recs))/time.Since(start).Seconds())
	}
	return []Row{newRow("S mysql", fmt.Sprintf("sink apply rate at batch %d: sinks/mysql on MariaDB; baseline: a hand-written multi-row upsert of the same rows under the same guard", sz.SinkApplyBatch),
		"records/s", rates, base, "figure/baseline", div, "≥ 0.8×", func(_, ratio float64) bool { return ratio >= 0.8 })}, nil
}
