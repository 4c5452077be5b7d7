package main

import (
	"context"
	"fmt"
	"os"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/sinks/redis"
)

// redisAddr is the Redis server the redis sink's row writes to:
// KAIROS_BENCH_REDIS_ADDR, else KAIROS_TEST_REDIS_ADDR, else the local
// Redis (what scripts/test makes sure of).
func redisAddr() string {
	for _, v := range []string{"KAIROS_BENCH_REDIS_ADDR", "KAIROS_TEST_REDIS_ADDR"} {
		if a := os.Getenv(v); a != "" {
			return a
		}
	}
	return "127.0.0.1:6379"
}

// measureRedis measures sinks/redis's apply rate at batch SinkApplyBatch
// (300-byte documents, fresh keys) against the same records written as
// plain SETs, a batch per pipeline (one round trip each, as the sink's),
// with no seq, no guard and no pointer: what a hand-written cache writer
// costs. Runs are interleaved, each under a prefix of its own that is
// removed (untimed) after it.
func (e *env) measureRedis(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("Redis does not answer (scripts/test starts it): %w", err)
	}
	recs := sinkRecords(sz.SinkApplyRecs)
	tag := time.Now().UnixNano() % 1e9
	subject := func(run int) (float64, error) {
		prefix := fmt.Sprintf("kb:%d:%d:", tag, run)
		defer removePrefix(ctx, client, prefix)
		sink, err := redis.New(ctx, client, redis.Options{Prefix: prefix})
		if err != nil {
			return 0, err
		}
		defer sink.Close()
		return applyRate(ctx, "redis", sink, recs, sz.SinkApplyBatch)
	}
	baseline := func(run int) (float64, error) {
		prefix := fmt.Sprintf("kbraw:%d:%d:", tag, run)
		defer removePrefix(ctx, client, prefix)
		start := time.Now()
		for c := 0; c < len(recs); c += sz.SinkApplyBatch {
			pipe := client.Pipeline()
			for _, r := range recs[c:min(len(recs), c+sz.SinkApplyBatch)] {
				pipe.Set(ctx, prefix+string(r.Key), []byte(r.Doc), 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return 0, err
			}
		}
		return float64(len(recs)) / time.Since(start).Seconds(), nil
	}
	rates, base, err := interleave(sz.Runs, subject, baseline)
	if err != nil {
		return nil, err
	}
	return []Row{newRow("S redis", fmt.Sprintf("sink apply rate at batch %d: sinks/redis (seq-guard script, pipelined) on 127.0.0.1; baseline: pipelined plain SETs of the same records", sz.SinkApplyBatch),
		"records/s", rates, base, "figure/baseline", div, "≥ 0.8×", func(_, ratio float64) bool { return ratio >= 0.8 })}, nil
}

// removePrefix removes the keys a run wrote, by SCAN and UNLINK; best
// effort, after the timing.
func removePrefix(ctx context.Context, c *goredis.Client, prefix string) {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return
		}
		if len(keys) > 0 {
			c.Unlink(ctx, keys...)
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}
