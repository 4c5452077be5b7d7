package kafka

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/syncer"
)

// TestEndToEnd runs the shared end-to-end scenario (pgtest.Mirror: 10,000
// changes with deletes, a rebuild half way) into this sink, with a broker
// that answers produce requests with an error for a while after the
// rebuild (kfake's fault injection; against a real broker, the sink's
// connections cut instead). At the end a Reader, consuming the live copy
// from its start, sees exactly the feed's live documents; the live copy
// holds no key whose records go back in seq; and a stale call, as a worker
// that lost its lease would make, changes nothing readers see.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 changes through the driver: not in -short")
	}
	t.Parallel()
	ctx := t.Context()
	b := newBroker(t)
	base := b.topic(t)
	l := &link{}
	s := open(t, b.testOptions(base, l))
	m := pgtest.Mirror(t, ctx, s, pgtest.Scenario{
		Sink: "kafka",
		Keys: 700,
		Key:  func(i int) feed.Key { return feed.Key(fmt.Sprintf("order/%d ü", i)) },
		Doc: func(_ *rand.Rand, n int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"n":%d,"pad":"%0100d"}`, n, n))
		},
		Fault: func() func() {
			if b.fake == nil {
				return l.down()
			}
			// Every produce request fails for a while: a non-retriable
			// answer, then one the client retries until the call's
			// deadline.
			return b.fake.Fault(
				kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.UnknownServerError, Count: 3},
				kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: -1},
			).Remove
		},
		// The client logs every failed produce; the test judges them.
		Options: syncer.Options{Logger: slog.New(slog.DiscardHandler)},
	})
	reader := b.reader(t, base)
	check := func(what string) {
		t.Helper()
		snap, err := reader.Read(ctx)
		if err != nil {
			t.Fatalf("%s: Read: %v", what, err)
		}
		if snap.Generation != 2 || snap.Topic != s.Topic() {
			t.Errorf("%s: the reader reads %s (generation %d), the sink writes %s at generation 2", what, snap.Topic, snap.Generation, s.Topic())
		}
		pgtest.CheckDocs(t, what, snap.Docs, m.Live)
	}
	check("after catching up")

	// Per key, the live copy's records never go back in seq by offset. A
	// record sent again at the same seq is the documented duplicate of a
	// produce the client retried after the broker had taken it (the
	// fault above provokes them), not a step back.
	last := map[string]int64{}
	back, again := 0, 0
	recs := rawRecords(t, b, s.Topic())
	for _, r := range recs {
		seq, _ := recordSeq(r)
		switch prev := last[string(r.Key)]; {
		case int64(seq) < prev:
			back++
		case int64(seq) == prev:
			again++
		}
		last[string(r.Key)] = max(last[string(r.Key)], int64(seq))
	}
	if back != 0 {
		t.Errorf("%d records of %d went back to an older seq of their key", back, len(recs))
	}
	t.Logf("%d records, %d sent again at the same seq", len(recs), again)

	// The one stale call of a worker that lost its lease: older versions
	// of live keys, and tombstones of older seqs.
	var stale []feed.Record
	for i, r := range m.Records[:100] {
		st := feed.Record{Key: r.Key, Seq: r.Seq - 1}
		if i%3 != 0 {
			st.Doc = []byte(`{"stale":true}`)
		}
		stale = append(stale, st)
	}
	if rej, err := s.Apply(ctx, stale); err != nil || len(rej) != 0 {
		t.Fatalf("a stale call: %v, %v", rej, err)
	}
	check("after a stale call")
	t.Logf("%d records in the live copy, %d live documents, %d sent, %d resyncs", len(recs), len(m.Live), m.State.RecordsSent, m.State.Resyncs)
}
