package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natssink "github.com/kairos-es/kairos/sinks/nats"
)

// natsURL is the NATS server (with JetStream) the nats sink's row writes
// to: KAIROS_BENCH_NATS_URL, else KAIROS_TEST_NATS_URL, else the local one
// (what scripts/test starts).
func natsURL() string {
	for _, v := range []string{"KAIROS_BENCH_NATS_URL", "KAIROS_TEST_NATS_URL"} {
		if u := os.Getenv(v); u != "" {
			return u
		}
	}
	return "nats://127.0.0.1:4222"
}

// measureNats measures sinks/nats's apply rate at batch SinkApplyBatch
// (300-byte documents, fresh keys) against plain KV puts of the same
// records: async publishes of the bare documents to the same subjects of a
// bucket of the same shape, in batches of the same size, at most the
// sink's default window awaiting acks, every ack in before the next batch.
// Runs interleave, each on fresh buckets removed afterwards.
func (e *env) measureNats(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("NATS does not answer (scripts/test starts it): %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*natssink.DefaultWindow))
	if err != nil {
		return nil, err
	}
	recs := sinkRecords(sz.SinkApplyRecs)
	tag := time.Now().UnixNano() % 1e9
	var rates, base []float64
	for run := range sz.Runs {
		name := fmt.Sprintf("kb_sink_%d_%d", tag, run)
		raw := fmt.Sprintf("kb_raw_%d_%d", tag, run)
		defer removeBuckets(js, name, raw)
		sink, err := natssink.Connect(ctx, natsURL(), natssink.Options{Bucket: name})
		if err != nil {
			return nil, err
		}
		rate, err := applyRate(ctx, "nats", sink, recs, sz.SinkApplyBatch)
		sink.Close()
		if err != nil {
			return nil, err
		}
		rates = append(rates, rate)

		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: raw, History: 1}); err != nil {
			return nil, err
		}
		start := time.Now()
		window := make([]jetstream.PubAckFuture, 0, natssink.DefaultWindow)
		wait := func(f jetstream.PubAckFuture) error {
			select {
			case <-f.Ok():
				return nil
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for c := 0; c < len(recs); c += sz.SinkApplyBatch {
			for _, r := range recs[c:min(len(recs), c+sz.SinkApplyBatch)] {
				if len(window) == cap(window) {
					if err := wait(window[0]); err != nil {
						return nil, err
					}
					window = append(window[:0], window[1:]...)
				}
				f, err := js.PublishMsgAsync(&nats.Msg{Subject: "$KV." + raw + "." + string(r.Key), Data: r.Doc})
				if err != nil {
					return nil, err
				}
				window = append(window, f)
			}
			for _, f := range window {
				if err := wait(f); err != nil {
					return nil, err
				}
			}
			window = window[:0]
		}
		base = append(base, float64(len(recs))/time.Since(start).Seconds())
	}
	return []Row{newRow("S nats", fmt.Sprintf("sink apply rate at batch %d: sinks/nats on JetStream KV; baseline: plain async KV puts of the same records, same window", sz.SinkApplyBatch),
		"records/s", rates, base, "figure/baseline", div, "≥ 0.8×", func(_, ratio float64) bool { return ratio >= 0.8 })}, nil
}

// removeBuckets removes a row's buckets and the sink's copies, best effort.
func removeBuckets(js jetstream.JetStream, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var all []string
	l := js.KeyValueStoreNames(ctx)
	for b := range l.Name() {
		all = append(all, b)
	}
	for _, b := range all {
		for _, n := range names {
			if b == n || len(b) > len(n)+2 && b[:len(n)+2] == n+"-g" {
				_ = js.DeleteKeyValue(ctx, b)
			}
		}
	}
}
