package nats

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// TestEndToEnd runs the shared end-to-end scenario (pgtest.Mirror: 10,000
// changes with deletes, a rebuild half way) into this sink, with the sink's
// connection cut after the rebuild and its redials refused for a while. At
// the end the live copy, read through the Reader, holds exactly the feed's
// live documents, only the pointer and that copy are left, and a stale call
// from another process changes nothing.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 changes through the driver: not in -short")
	}
	t.Parallel()
	ctx := t.Context()
	bucket := bucketName(t)
	link := newLink(t)
	nc := connect(t, link)
	sink := openSink(t, nc, Options{Bucket: bucket})
	reader := newReader(t, connect(t, nil), bucket)

	m := pgtest.Mirror(t, ctx, sink, pgtest.Scenario{
		Sink: "nats",
		Keys: 700,
		Key:  func(i int) feed.Key { return feed.Key(fmt.Sprintf("order.%d ü*>", i)) },
		Doc: func(_ *rand.Rand, n int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"n":%d,"pad":"%0100d"}`, n, n))
		},
		Fault: func() func() { return link.Down(t, nc) },
	})
	got, err := reader.Documents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.CheckDocs(t, "the live copy", got, m.Live)

	// A worker that lost its lease may still land one late call: older
	// versions of keys, tombstones among them. The guard must ignore it.
	var stale []feed.Record
	for i, r := range m.Records[:100] {
		var d []byte
		if i%3 != 0 {
			d = []byte(`{"stale":true}`)
		}
		stale = append(stale, feed.Record{Key: r.Key, Seq: r.Seq - 1, Doc: d})
	}
	staleSink := openSink(t, connect(t, nil), Options{Bucket: bucket}) // another process: no hints
	if rej, err := staleSink.Apply(ctx, stale); err != nil || len(rej) != 0 {
		t.Fatalf("a stale call: %v, %v", rej, err)
	}
	if got, err = reader.Documents(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.CheckDocs(t, "the live copy after a stale call", got, m.Live)
	if live := bucketsOf(t, reader.js, bucket); len(live) != 2 {
		t.Errorf("buckets left: %v; want the pointer and the live copy", live)
	}
	t.Logf("%d live documents, %d sent, %d resyncs", len(m.Live), m.State.RecordsSent, m.State.Resyncs)
}
