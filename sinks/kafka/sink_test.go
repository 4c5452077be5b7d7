package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
)

func TestSink(t *testing.T) {
	feedtest.RunSink(t, newHarness)
}

func rec(k string, seq feed.Seq, d string) feed.Record {
	r := feed.Record{Key: feed.Key(k), Seq: seq}
	if d != "" {
		r.Doc = []byte(d)
	}
	return r
}

func wantDocs(t *testing.T, r *Reader, want map[string]string) {
	t.Helper()
	snap, err := r.Read(t.Context())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if len(snap.Docs) != len(want) {
		t.Errorf("the reader sees %d documents, want %d: %v", len(snap.Docs), len(want), snap.Docs)
	}
	for k, d := range want {
		if !feedtest.JSONEqual(snap.Docs[feed.Key(k)], []byte(d)) {
			t.Errorf("%q reads %s, want %s", k, snap.Docs[feed.Key(k)], d)
		}
	}
}

// TestBrokerRecordErrors: an answer that concerns the records of a batch
// (too large, invalid, corrupt) parks the one record the broker refuses
// alone, and applies the rest of its batch, whichever partitions they are
// in.
func TestBrokerRecordErrors(t *testing.T) {
	for _, e := range []*kerr.Error{kerr.MessageTooLarge, kerr.InvalidRecord, kerr.CorruptMessage} {
		t.Run(e.Message, func(t *testing.T) {
			t.Parallel()
			b := newBroker(t)
			b.needFake(t)
			base := b.topic(t)
			s := open(t, b.testOptions(base, &link{}))
			refuseKey(t, b.fake, "bad-key", e)
			var batch []feed.Record
			want := map[string]string{}
			for i := range 20 {
				k := fmt.Sprintf("k%02d", i)
				batch = append(batch, rec(k, feed.Seq(i+1), fmt.Sprintf(`{"i":%d}`, i)))
				want[k] = fmt.Sprintf(`{"i":%d}`, i)
			}
			batch = append(batch, rec("bad-key", 21, `{"bad":true}`))
			rej, err := s.Apply(t.Context(), batch)
			if err != nil {
				t.Fatalf("Apply: %v; a record the broker refuses is a rejection", err)
			}
			if len(rej) != 1 || rej[0].Key != "bad-key" || rej[0].Seq != 21 || !strings.Contains(rej[0].Reason, e.Message) {
				t.Fatalf("rejections %+v; want bad-key at 21, its reason naming %s", rej, e.Message)
			}
			wantDocs(t, b.reader(t, base), want)
		})
	}
}

// TestBrokerFaultIsError: an answer that concerns the broker, not the
// records, is an error of the whole call (no rejection), and the same
// batch applied again lands whole.
func TestBrokerFaultIsError(t *testing.T) {
	for _, e := range []*kerr.Error{kerr.UnknownServerError, kerr.KafkaStorageError, kerr.TopicAuthorizationFailed} {
		t.Run(e.Message, func(t *testing.T) {
			t.Parallel()
			b := newBroker(t)
			b.needFake(t)
			base := b.topic(t)
			s := open(t, b.testOptions(base, &link{}))
			batch := []feed.Record{rec("a", 1, `1`), rec("b", 2, `2`), rec("c", 3, `3`)}
			h := b.fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: e, Count: -1})
			ctx, cancel := context.WithTimeout(t.Context(), faultTimeout)
			rej, err := s.Apply(ctx, batch)
			cancel()
			h.Remove()
			if err == nil || len(rej) != 0 {
				t.Fatalf("Apply under %s = %v, %v; want an error and no rejection", e.Message, rej, err)
			}
			if rej, err := s.Apply(t.Context(), batch); err != nil || len(rej) != 0 {
				t.Fatalf("the batch again: %v, %v", rej, err)
			}
			wantDocs(t, b.reader(t, base), map[string]string{"a": `1`, "b": `2`, "c": `3`})
		})
	}
}

// faultTimeout bounds a call made while the broker answers with faults:
// retriable ones are retried by the client until the call's context ends.
const faultTimeout = 5 * time.Second

// TestRecords: what a consumer sees in the topic. Each key's records are
// in one partition, in seq order by offset; every record carries the
// feed, its seq and, once a resync published the copy, its generation; a
// tombstone has a null value.
func TestRecords(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	base := b.topic(t)
	s := open(t, b.testOptions(base, &link{}))
	ctx := t.Context()
	seq := feed.Seq(0)
	const keys, rounds = 30, 8
	for round := range rounds {
		var batch []feed.Record
		for i := range keys {
			seq++
			d := fmt.Sprintf(`{"r":%d}`, round)
			if (i+round)%5 == 0 {
				d = ""
			}
			batch = append(batch, rec(fmt.Sprintf("key-%d", i), seq, d))
		}
		if rej, err := s.Apply(ctx, batch); err != nil || len(rej) != 0 {
			t.Fatalf("Apply: %v, %v", rej, err)
		}
	}
	check := func(topic string, gen string, n int) {
		t.Helper()
		recs := rawRecords(t, b, topic)
		if len(recs) != n {
			t.Fatalf("%s holds %d records, want %d", topic, len(recs), n)
		}
		part := map[string]int32{}
		last := map[string]int64{}
		for _, r := range recs {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			if h[HeaderFeed] != "orders" {
				t.Errorf("%s/%d@%d: feed header %q", topic, r.Partition, r.Offset, h[HeaderFeed])
			}
			if g, ok := h[HeaderGeneration]; g != gen || (gen == "" && ok) {
				t.Errorf("%s/%d@%d: generation header %q, want %q", topic, r.Partition, r.Offset, g, gen)
			}
			sq, err := strconv.ParseInt(h[HeaderSeq], 10, 64)
			if err != nil {
				t.Fatalf("%s/%d@%d: seq header %q", topic, r.Partition, r.Offset, h[HeaderSeq])
			}
			k := string(r.Key)
			if p, ok := part[k]; ok && p != r.Partition {
				t.Errorf("%q is in partitions %d and %d", k, p, r.Partition)
			}
			part[k] = r.Partition
			if sq <= last[k] {
				t.Errorf("%q: seq %d after %d", k, sq, last[k])
			}
			last[k] = sq
			if r.Value != nil && len(r.Value) == 0 {
				t.Errorf("%q: an empty, not null, value", k)
			}
		}
		parts := map[int32]bool{}
		for _, p := range part {
			parts[p] = true
		}
		if len(parts) < 2 {
			t.Errorf("%d keys all in %d partition(s): the partitioner does not spread them", len(part), len(parts))
		}
	}
	check(base, "", keys*rounds)
	tombstones := 0
	for _, r := range rawRecords(t, b, base) {
		if r.Value == nil {
			tombstones++
		}
	}
	if tombstones != keys*rounds/5 {
		t.Errorf("%d null values, want %d tombstones", tombstones, keys*rounds/5)
	}

	r, err := s.OpenResync(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	var batch []feed.Record
	for i := range keys {
		seq++
		batch = append(batch, rec(fmt.Sprintf("key-%d", i), seq, `"resync"`))
	}
	if rej, err := r.Apply(ctx, batch); err != nil || len(rej) != 0 {
		t.Fatalf("resync Apply: %v, %v", rej, err)
	}
	if err := r.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Topic() == base || !strings.HasPrefix(s.Topic(), base+"-g7-") {
		t.Fatalf("the live copy after publishing generation 7 is %s", s.Topic())
	}
	seq++
	if rej, err := s.Apply(ctx, []feed.Record{rec("key-0", seq, `"after"`)}); err != nil || len(rej) != 0 {
		t.Fatalf("Apply after Publish: %v, %v", rej, err)
	}
	check(s.Topic(), "7", keys+1)
	snap, err := b.reader(t, base).Read(ctx)
	if err != nil || snap.Generation != 7 || snap.Topic != s.Topic() || string(snap.Docs["key-0"]) != `"after"` {
		t.Errorf("Read = %s g%d %s, %v", snap.Topic, snap.Generation, snap.Docs["key-0"], err)
	}
}

// TestStaleGenerationInvisible: a stale call of generation 1 after
// generation 2's copy was published is dropped by the sink, which learns
// the copy's floor from the pointer; and a stale record that lands in the
// copy all the same (produced by a build without the floor, or a request
// already on the wire) is left out by Reader, which reads the floor from the
// pointer record too.
func TestStaleGenerationInvisible(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	base := b.topic(t)
	opts := b.testOptions(base, &link{})
	s := open(t, opts)
	ctx := t.Context()
	if rej, err := s.Apply(ctx, []feed.Record{rec("a", 1, `"a1"`), rec("b", 2, `"b1"`), rec("c", 3, `"c1"`)}); err != nil || len(rej) != 0 {
		t.Fatalf("Apply: %v, %v", rej, err)
	}
	stale := open(t, opts) // the old worker, in another process
	r, err := s.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if rej, err := r.Apply(ctx, []feed.Record{rec("b", 11, `"b2"`), rec("a", 10, "")}); err != nil || len(rej) != 0 {
		t.Fatalf("resync Apply: %v, %v", rej, err)
	}
	if err := r.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	live := s.Topic()
	if rej, err := stale.Apply(ctx, []feed.Record{rec("c", 4, `"c stale"`), rec("a", 5, `"a stale"`), rec("d", 6, `"d stale"`)}); err != nil || len(rej) != 0 {
		t.Fatalf("a stale Apply after the publish: %v, %v; want it dropped, no rejection, no error", rej, err)
	}
	if recs := rawRecords(t, b, live); len(recs) != 2 {
		t.Errorf("after a stale Apply the copy holds %d records, want generation 2's 2: the sink sent records below the floor", len(recs))
	}
	// A stale record in the copy itself, as a plain producer writes it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	late := &kgo.Record{Topic: live, Key: []byte("e"), Value: []byte(`"e stale"`), Headers: []kgo.RecordHeader{
		{Key: HeaderFeed, Value: []byte("orders")}, {Key: HeaderSeq, Value: []byte("7")}}}
	if err := cl.ProduceSync(ctx, late).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if recs := rawRecords(t, b, live); len(recs) != 3 {
		t.Fatalf("the copy holds %d records after a plain produce, want 3", len(recs))
	}
	snap, err := b.reader(t, base).Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Floor != 10 || snap.Topic != live {
		t.Errorf("Read: floor %d of %s; want 10, of %s", snap.Floor, snap.Topic, live)
	}
	if len(snap.Docs) != 1 || string(snap.Docs["b"]) != `"b2"` {
		t.Errorf("through Reader after stale records of generation 1: %s; want b of generation 2 alone", snap.Docs)
	}
	// Generation 2's own records still land.
	if rej, err := stale.Apply(ctx, []feed.Record{rec("c", 12, `"c2"`)}); err != nil || len(rej) != 0 {
		t.Fatalf("Apply: %v, %v", rej, err)
	}
	wantDocs(t, b.reader(t, base), map[string]string{"b": `"b2"`, "c": `"c2"`})
}

// TestEmptyCopyFloorInvisible: a copy that was sent no record is given its
// floor by SetFloor; Publish writes it in the pointer, so a stale record
// that lands in the empty copy all the same is left out by Reader too.
func TestEmptyCopyFloorInvisible(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	base := b.topic(t)
	opts := b.testOptions(base, &link{})
	s := open(t, opts)
	ctx := t.Context()
	if rej, err := s.Apply(ctx, []feed.Record{rec("a", 1, `"a1"`)}); err != nil || len(rej) != 0 {
		t.Fatalf("Apply: %v, %v", rej, err)
	}
	r, err := s.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.(feed.FloorSetter).SetFloor(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := r.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	live := s.Topic()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	late := &kgo.Record{Topic: live, Key: []byte("e"), Value: []byte(`"e stale"`), Headers: []kgo.RecordHeader{
		{Key: HeaderFeed, Value: []byte("orders")}, {Key: HeaderSeq, Value: []byte("7")}}}
	if err := cl.ProduceSync(ctx, late).FirstErr(); err != nil {
		t.Fatal(err)
	}
	snap, err := b.reader(t, base).Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Floor != 10 || snap.Topic != live {
		t.Errorf("Read: floor %d of %s; want 10, of %s", snap.Floor, snap.Topic, live)
	}
	if len(snap.Docs) != 0 {
		t.Errorf("through Reader after a stale record in the empty copy: %s; want nothing", snap.Docs)
	}
}

// rawRecords consumes topic from the start to its end, as a plain consumer
// would.
func rawRecords(t *testing.T, b *broker, topic string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	if err := consume(t.Context(), []kgo.Opt{kgo.SeedBrokers(b.seeds...)}, topic, want, kgo.NewOffset().AtStart(), func(r *kgo.Record) error {
		out = append(out, r)
		return nil
	}, nil); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNewRefuses: every option a caller can get wrong is refused naming
// it, and a topic that is missing or not compacted is refused naming the
// topic, before anything is written.
func TestNewRefuses(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := t.Context()
	good := Options{Brokers: b.seeds, Feed: "orders", Topic: b.topic(t), Create: true}
	for _, c := range []struct {
		field string
		edit  func(*Options)
	}{
		{"kafka.brokers", func(o *Options) { o.Brokers = nil }},
		{"kafka.brokers[1]", func(o *Options) { o.Brokers = append(o.Brokers, "") }},
		{"kafka.feed", func(o *Options) { o.Feed = "" }},
		{"kafka.topic", func(o *Options) { o.Topic = "has space" }},
		{"kafka.topic", func(o *Options) { o.Topic = ".." }},
		{"kafka.topic", func(o *Options) { o.Topic = strings.Repeat("t", MaxTopicLen+1) }},
		{"kafka.partitions", func(o *Options) { o.Partitions = -1 }},
		{"kafka.replication_factor", func(o *Options) { o.ReplicationFactor = -2 }},
		{"kafka.max_message_bytes", func(o *Options) { o.MaxMessageBytes = 100 }},
		{"kafka.client_options", func(o *Options) { o.ClientOptions = []kgo.Opt{kgo.DisableIdempotentWrite()} }},
	} {
		o := good
		c.edit(&o)
		s, err := New(ctx, o)
		var inv *feed.InvalidError
		if !errors.As(err, &inv) || inv.Field != c.field {
			t.Errorf("%s: New = %v; want an invalid-input error naming it", c.field, err)
		}
		if s != nil {
			s.Close()
		}
	}

	missing := b.topic(t)
	_, err := New(ctx, Options{Brokers: b.seeds, Feed: "orders", Topic: missing})
	if !errors.Is(err, ErrNoTopic) || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing topic: New = %v; want ErrNoTopic naming %s", err, missing)
	}

	// A topic that deletes by retention, made by hand.
	plain := b.topic(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for _, tp := range []string{plain, plain + PointerSuffix} {
		policy := "compact"
		if tp == plain {
			policy = "compact,delete"
		}
		if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr(policy)}, tp); err != nil {
			t.Fatal(err)
		}
	}
	_, err = New(ctx, Options{Brokers: b.seeds, Feed: "orders", Topic: plain, Create: true})
	if !errors.Is(err, ErrNotCompacted) || !strings.Contains(err.Error(), plain) {
		t.Errorf("a topic with cleanup.policy=compact,delete: New = %v; want ErrNotCompacted naming %s", err, plain)
	}

	// Nothing answers.
	dead, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = New(dead, Options{Brokers: []string{pgtest.ClosedPort(t)}, Feed: "orders", Topic: missing})
	if err == nil {
		t.Error("New with no broker answering succeeded")
	}
}
