package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kairos-es/kairos/sinks/kafka"
)

// measureKafka measures sinks/kafka's apply rate at batch SinkApplyBatch
// (300-byte documents, fresh keys) against a kfake cluster in this
// process, since no Kafka broker runs on these machines; the baseline is a
// plain ProduceSync of the same records (keys, documents and the same three
// headers) per batch (records built in the loop, as a hand-written producer
// builds them), with the client settings the sink uses (idempotent,
// acks from all in-sync replicas, the key-hash partitioner, the same batch
// size), into a compacted topic of the same shape on the same cluster.
// What the ratio measures is the sink's own work per batch (records and
// headers built from feed records, the size check, the pointer check
// beside the produce), since the broker's is shared.
func (e *env) measureKafka(ctx context.Context) ([]Row, error) {
	sz := e.sizes
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("a kfake cluster: %w", err)
	}
	defer c.Close()
	seeds := c.ListenAddrs()
	recs := sinkRecords(sz.SinkApplyRecs)
	var rates, base []float64
	for run := range sz.Runs {
		topic := fmt.Sprintf("kb-sink-%d", run)
		sink, err := kafka.New(ctx, kafka.Options{Brokers: seeds, Feed: "bench", Topic: topic, Create: true, Partitions: 3})
		if err != nil {
			return nil, err
		}
		rate, err := applyRate(ctx, "kafka", sink, recs, sz.SinkApplyBatch)
		maxBatch := sink.MaxDocumentBytes() + 1024
		sink.Close()
		if err != nil {
			return nil, err
		}
		rates = append(rates, rate)

		raw := fmt.Sprintf("kb-raw-%d", run)
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.MetadataMinAge(100*time.Millisecond),
			kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.ProducerBatchMaxBytes(int32(maxBatch)))
		if err != nil {
			return nil, err
		}
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, raw); err != nil {
			cl.Close()
			return nil, err
		}
		// The topic's metadata is loaded before the clock starts, as the
		// sink's New loads its own.
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: raw, Key: []byte("warm"), Value: []byte("1")}).FirstErr(); err != nil {
			cl.Close()
			return nil, err
		}
		feedHeader := []byte("bench")
		start := time.Now()
		for i := 0; i < len(recs); i += sz.SinkApplyBatch {
			var b []*kgo.Record
			for _, r := range recs[i:min(len(recs), i+sz.SinkApplyBatch)] {
				b = append(b, &kgo.Record{Topic: raw, Key: []byte(r.Key), Value: r.Doc, Headers: []kgo.RecordHeader{
					{Key: kafka.HeaderFeed, Value: feedHeader},
					{Key: kafka.HeaderSeq, Value: strconv.AppendInt(nil, int64(r.Seq), 10)},
				}})
			}
			if err := cl.ProduceSync(ctx, b...).FirstErr(); err != nil {
				cl.Close()
				return nil, err
			}
		}
		base = append(base, float64(len(recs))/time.Since(start).Seconds())
		cl.Close()
	}
	return []Row{newRow("S kafka", fmt.Sprintf("sink apply rate at batch %d: sinks/kafka into a kfake cluster in this process (no Kafka broker runs here); baseline: plain ProduceSync of the same records, same client settings", sz.SinkApplyBatch),
		"records/s", rates, base, "figure/baseline", div, "≥ 0.8×", func(_, ratio float64) bool { return ratio >= 0.8 })}, nil
}
