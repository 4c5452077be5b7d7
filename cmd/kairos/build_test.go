package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/internal/pgtest"
	kbleve "github.com/kairos-es/kairos/sinks/bleve"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/sinks/kafka"
	knats "github.com/kairos-es/kairos/sinks/nats"
	kredis "github.com/kairos-es/kairos/sinks/redis"
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

// The server-less sinks and NATS build from their sections, take a record
// and read it back through their own readers.
func TestBuildFileBleveNats(t *testing.T) {
	ctx := t.Context()
	rec := []feed.Record{{Key: "k", Seq: 1, Doc: json.RawMessage(`{"a":1}`)}}
	dir := t.TempDir()

	b, err := build(t, "        type: file\n        path: "+filepath.Join(dir, "f.jsonl")+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.sink.Apply(ctx, rec); err != nil {
		t.Fatal(err)
	}
	b.close()
	if docs, err := file.Read(filepath.Join(dir, "f.jsonl")); err != nil || string(docs["k"]) != `{"a":1}` {
		t.Fatalf("file: %v, %v", docs, err)
	}

	mappingFile := filepath.Join(dir, "mapping.json")
	os.WriteFile(mappingFile, []byte(`{"default_analyzer":"standard"}`), 0o644)
	b, err = build(t, "        type: bleve\n        dir: "+filepath.Join(dir, "index")+"\n        mapping_file: "+mappingFile+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.sink.Apply(ctx, rec); err != nil {
		t.Fatal(err)
	}
	b.close()
	srch, err := kbleve.NewSearcher(filepath.Join(dir, "index"))
	if err != nil {
		t.Fatal(err)
	}
	doc, ok, err := srch.Document(ctx, "k")
	srch.Close()
	if err != nil || !ok || !feedtest.JSONEqual(doc, json.RawMessage(`{"a":1}`)) {
		t.Fatalf("bleve: %s, %v, %v", doc, ok, err)
	}
	os.WriteFile(mappingFile, []byte(`{"default_analyzer":`), 0o644)
	if _, err := build(t, "        type: bleve\n        dir: "+filepath.Join(dir, "i2")+"\n        mapping_file: "+mappingFile+"\n"); err == nil || !strings.Contains(err.Error(), "feeds.orders.sinks.s.mapping_file") {
		t.Errorf("a broken mapping file = %v", err)
	}

	url := os.Getenv("KAIROS_TEST_NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	var rb [6]byte
	_, _ = rand.Read(rb[:])
	bucket := "kc_" + hex.EncodeToString(rb[:])
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		pgtest.Unavailable(t, "NATS", err)
	}
	defer nc.Close()
	t.Cleanup(func() {
		js, _ := jetstream.New(nc)
		l := js.KeyValueStoreNames(context.Background())
		for name := range l.Name() {
			if name == bucket || strings.HasPrefix(name, bucket+"-") {
				_ = js.DeleteKeyValue(context.Background(), name)
			}
		}
	})
	b, err = build(t, "        type: nats\n        url: "+url+"\n        bucket: "+bucket+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.sink.Apply(ctx, rec); err != nil {
		t.Fatal(err)
	}
	b.close()
	r, err := knats.NewReader(ctx, nc, bucket)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := r.Documents(ctx)
	if err != nil || !feedtest.JSONEqual(docs["k"], json.RawMessage(`{"a":1}`)) {
		t.Fatalf("nats: %v, %v", docs, err)
	}
}

// A redis section builds a sink whose record the package's Reader reads
// back through the pointer.
func TestBuildRedis(t *testing.T) {
	addr := os.Getenv("KAIROS_TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	client := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer client.Close()
	if err := client.Ping(t.Context()).Err(); err != nil {
		pgtest.Unavailable(t, "Redis", err)
	}
	var rb [6]byte
	_, _ = rand.Read(rb[:])
	prefix := "kc" + hex.EncodeToString(rb[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Unlink(ctx, iter.Val())
		}
	})
	b, err := build(t, "        type: redis\n        url: redis://"+addr+"/0\n        prefix: \""+prefix+"\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.sink.Apply(t.Context(), []feed.Record{{Key: "k", Seq: 1, Doc: json.RawMessage(`{"a":1}`)}}); err != nil {
		t.Fatal(err)
	}
	b.close()
	r, err := kredis.NewReader(client, kredis.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	doc, ok, err := r.Get(t.Context(), "k")
	if err != nil || !ok || !feedtest.JSONEqual(doc, json.RawMessage(`{"a":1}`)) {
		t.Fatalf("redis: %s, %v, %v", doc, ok, err)
	}
	if _, err := build(t, "        type: redis\n        url: redis://:hunter2pw@"+pgtest.ClosedPort(t)+"/0\n"); err == nil || strings.Contains(err.Error(), "hunter2pw") || !strings.Contains(err.Error(), "feeds.orders.sinks.s") {
		t.Errorf("an unreachable redis = %v", err)
	}
}
