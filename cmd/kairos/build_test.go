package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/sinks/kafka"
)

// build parses one sink section and builds it.
func build(t *testing.T, yaml string) (builtSink, error) {
	t.Helper()
	cfg, err := config.Parse([]byte("database:\n  url: x\nfeeds:\n  orders:\n    sinks:\n      s:\n"+yaml), config.ParseOptions{SinkTypes: sinkTypes()})
	if err != nil {
		t.Fatalf("the section does not check: %v", err)
	}
	s := cfg.Feeds[0].Sinks[0]
	return builders[s.Type](t.Context(), s, feed.SinkID{Feed: "orders", Sink: "s"}, nil)
}

// A kafka section builds a sink that produces to the named topic, created
// on demand, which the package's Reader then reads back; its mistakes are
// named by their path.
func TestBuildKafka(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addr := c.ListenAddrs()[0]
	b, err := build(t, "        type: kafka\n        brokers: ["+addr+"]\n        topic: orders-live-copy\n        create: true\n        partitions: 2\n")
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if rejs, err := b.sink.Apply(t.Context(), []feed.Record{{Key: "k", Seq: 1, Doc: json.RawMessage(`{"a":1}`)}}); err != nil || len(rejs) != 0 {
		t.Fatalf("Apply = %v, %v", rejs, err)
	}
	r, err := kafka.NewReader(t.Context(), kafka.ReaderOptions{Brokers: []string{addr}, Topic: "orders-live-copy"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	snap, err := r.Read(t.Context())
	if err != nil || string(snap.Docs["k"]) != `{"a":1}` {
		t.Fatalf("Read = %+v, %v", snap, err)
	}
	for yaml, want := range map[string]string{
		"        type: kafka\n        brokers: [" + addr + "]\n        partitions: -1\n":                             "feeds.orders.sinks.s.partitions: is -1",
		"        type: kafka\n        brokers: [" + addr + "]\n        sasl: {mechanism: kerberos}\n":                "feeds.orders.sinks.s.sasl.mechanism: is not one of the choices",
		"        type: kafka\n        brokers: [" + addr + "]\n        topic: \"no such/topic\"\n":                   "feeds.orders.sinks.s.topic",
		"        type: kafka\n        brokers: [" + addr + "]\n        topic: absent-topic\n        create: false\n": "feeds.orders.sinks.s",
	} {
		if _, err := build(t, yaml); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("building %q = %v; want an error with %q", yaml, err, want)
		}
	}
}
