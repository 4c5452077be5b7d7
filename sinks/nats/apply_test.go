package nats

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
)

type fixture struct {
	bucket string
	nc     *natsConn
	sink   *Sink
	reader *Reader
	js     jetstream.JetStream
	link   *faultLink
}

func setup(t *testing.T, opts Options) *fixture {
	t.Helper()
	opts.Bucket = bucketName(t)
	link := newLink(t)
	nc := connect(t, link)
	other := connect(t, nil)
	js, _ := jetstream.New(other)
	return &fixture{bucket: opts.Bucket, nc: nc, sink: openSink(t, nc, opts), reader: newReader(t, other, opts.Bucket), js: js, link: link}
}

// lastSeq is the live copy's stream's last sequence: it moves with every
// message the server stores.
func (f *fixture) lastSeq(t *testing.T) uint64 {
	t.Helper()
	name, err := f.reader.Bucket(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.js.Stream(t.Context(), "KV_"+name)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().State.LastSeq
}

func (f *fixture) want(t *testing.T, what string, docs map[string]string) {
	t.Helper()
	got, err := f.reader.Documents(t.Context())
	if err != nil {
		t.Fatalf("%s: Documents: %v", what, err)
	}
	if len(got) != len(docs) {
		t.Errorf("%s: %d documents, want %d", what, len(got), len(docs))
	}
	for k, d := range docs {
		if !feedtest.JSONEqual(got[feed.Key(k)], []byte(d)) {
			t.Errorf("%s: %q is %s, want %s", what, k, got[feed.Key(k)], d)
		}
	}
}

// TestStaleCallStoresNothing: a stale call (older seqs) and a retry (the
// same seqs) from another process, which has no hints, store no message at
// all: the server refuses each conditional publish, and the re-read finds
// the stored seq as new or newer.
func TestStaleCallStoresNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, Options{})
	applyOK(t, f.sink, rec("a", 10, `"a10"`), rec("b", 11, `"b11"`), rec("c", 12, ""))
	before := f.lastSeq(t)
	again := openSink(t, connect(t, nil), Options{Bucket: f.bucket})
	applyOK(t, again, rec("a", 4, `"a4"`), rec("b", 11, `"b11"`), rec("c", 5, `"c5"`))
	applyOK(t, again, rec("a", 10, `"a10"`), rec("c", 12, ""))
	if after := f.lastSeq(t); after != before {
		t.Errorf("the stream's last sequence moved from %d to %d: a stale or repeated call stored something", before, after)
	}
	f.want(t, "after a stale call", map[string]string{"a": `"a10"`, "b": `"b11"`})
}

// TestForeignWriter: a message another writer put on a key (a plain KV put,
// without the seq header) loses the sink's conditional publish; the sink
// re-reads it, finds no seq, and writes its record over it.
func TestForeignWriter(t *testing.T) {
	t.Parallel()
	f := setup(t, Options{})
	applyOK(t, f.sink, rec("a", 1, `"a1"`))
	name, _ := f.reader.Bucket(t.Context())
	kv, err := f.js.KeyValue(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), EncodeKey("a"), []byte(`"foreign"`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), EncodeKey("b"), []byte(`"foreign"`)); err != nil {
		t.Fatal(err)
	}
	applyOK(t, f.sink, rec("a", 2, `"a2"`), rec("b", 3, `"b3"`))
	f.want(t, "after writing over a foreign writer's values", map[string]string{"a": `"a2"`, "b": `"b3"`})
}

// TestMessages: what a consumer of the stream or a plain KV reader sees:
// the feed, generation and seq headers, a message id per (feed, key, seq),
// a KV delete marker for a tombstone that keeps its seq.
func TestMessages(t *testing.T) {
	t.Parallel()
	f := setup(t, Options{Feed: "orders.v2"})
	r, err := f.sink.OpenResync(t.Context(), 7)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("order.1 ü", 40, `{"n":1}`), rec("gone", 41, ""))
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	name, _ := f.reader.Bucket(t.Context())
	if !strings.Contains(name, "-g7-") {
		t.Errorf("the live copy is %s; want generation 7's", name)
	}
	st, err := f.js.Stream(t.Context(), "KV_"+name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(t.Context(), "$KV."+name+"."+EncodeKey("order.1 ü"))
	if err != nil {
		t.Fatal(err)
	}
	for h, want := range map[string]string{HeaderFeed: "orders.v2", HeaderGeneration: "7", HeaderSeq: "40", jetstream.MsgIDHeader: msgID("orders.v2", "order.1 ü", 40)} {
		if got := m.Header.Get(h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	kv, err := f.js.KeyValue(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(t.Context(), EncodeKey("order.1 ü")); err != nil || string(e.Value()) != `{"n":1}` {
		t.Errorf("a plain KV get of the encoded key = %v, %v", e, err)
	}
	if _, err := kv.Get(t.Context(), EncodeKey("gone")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("a plain KV get of a tombstone's key: %v, want ErrKeyNotFound", err)
	}
	m, err = st.GetLastMsgForSubject(t.Context(), "$KV."+name+"."+EncodeKey("gone"))
	if err != nil || m.Header.Get(kvOperation) != kvDelete || m.Header.Get(HeaderSeq) != "41" {
		t.Errorf("the tombstone's message: %+v, %v; want a delete marker with seq 41", m, err)
	}
	if e, ok, err := f.reader.Get(t.Context(), "order.1 ü"); err != nil || !ok || e.Seq != 40 {
		t.Errorf("Reader.Get = %+v, %v, %v", e, ok, err)
	}
	if _, ok, err := f.reader.Get(t.Context(), "gone"); err != nil || ok {
		t.Errorf("Reader.Get of a tombstone = %v, %v; want not found", ok, err)
	}
	keys, err := f.reader.Keys(t.Context())
	if err != nil || !slices.Equal(keys, []feed.Key{"order.1 ü"}) {
		t.Errorf("Reader.Keys = %q, %v", keys, err)
	}
}

// TestPublishRemovesOldCopies: after a publish only the pointer and the
// new copy are left, and a resync opened after a crash removes the crashed
// one's bucket.
func TestPublishRemovesOldCopies(t *testing.T) {
	t.Parallel()
	f := setup(t, Options{})
	if got := bucketsOf(t, f.js, f.bucket); len(got) != 2 {
		t.Fatalf("after New: buckets %v; want the pointer and the first copy", got)
	}
	r, err := f.sink.OpenResync(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("a", 1, `1`))
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	live, _ := f.reader.Bucket(t.Context())
	if got := bucketsOf(t, f.js, f.bucket); !slices.Equal(sorted(got), sorted([]string{f.bucket, live})) {
		t.Errorf("after Publish: buckets %v; want %s and %s", got, f.bucket, live)
	}
	if _, err := f.sink.OpenResync(t.Context(), 2); err != nil { // crashes
		t.Fatal(err)
	}
	if _, err := f.sink.OpenResync(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	if got := bucketsOf(t, f.js, f.bucket); len(got) != 3 {
		t.Errorf("after a crashed resync and a new one: buckets %v; want the pointer, the live copy and one resync", got)
	}
}

// TestFloorOnPointer: Publish puts the copy's floor on the pointer's
// message, its value still the bucket's name alone (what KV clients read),
// and a sink started afterwards drops a stale call of the generation
// before, for a key the copy lacks too.
func TestFloorOnPointer(t *testing.T) {
	t.Parallel()
	f := setup(t, Options{})
	applyOK(t, f.sink, rec("a", 1, `"a1"`), rec("b", 2, `"b1"`))
	r, err := f.sink.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("b", 12, `"b2"`), rec("a", 10, ""))
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	kv, err := f.js.KeyValue(t.Context(), f.bucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(t.Context(), PointerKey)
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.js.Stream(t.Context(), "KV_"+f.bucket)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(t.Context(), "$KV."+f.bucket+"."+PointerKey)
	if err != nil {
		t.Fatal(err)
	}
	if live, _ := f.reader.Bucket(t.Context()); string(e.Value()) != live || !f.sink.copyRe.MatchString(live) || m.Header.Get(HeaderFloor) != "10" {
		t.Fatalf("the pointer = %q with %s %q; want the copy's name %q alone, and floor 10", e.Value(), HeaderFloor, m.Header.Get(HeaderFloor), live)
	}
	late := openSink(t, connect(t, nil), Options{Bucket: f.bucket})
	applyOK(t, late, rec("c", 3, `"c1"`), rec("a", 4, `"a1"`), rec("b", 5, ""))
	applyOK(t, late, rec("d", 13, `"d2"`)) // the copy's own still land
	f.want(t, "after a stale call of generation 1", map[string]string{"b": `"b2"`, "d": `"d2"`})
}

// TestStalePublishLoses: a worker whose rival published meanwhile cannot
// point the readers back at its own copy.
func TestStalePublishLoses(t *testing.T) {
	t.Parallel()
	f := setup(t, Options{})
	stale, err := f.sink.OpenResync(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	rival := openSink(t, connect(t, nil), Options{Bucket: f.bucket})
	r, err := rival.OpenResync(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("rival", 1, `1`))
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := stale.Publish(t.Context()); err == nil {
		t.Error("the stale resync published over its rival's")
	}
	f.want(t, "after the stale publish", map[string]string{"rival": `1`})
}

// TestConnectionLossMidBatch: the connection is cut while a large batch's
// publishes are in flight. Apply returns an error, not rejections; once the
// link is back the same batch applies in full.
func TestConnectionLossMidBatch(t *testing.T) {
	t.Parallel()
	f := setup(t, Options{Window: 64})
	var batch []feed.Record
	want := map[string]string{}
	for i := range 5000 {
		k := fmt.Sprintf("k%05d", i)
		want[k] = fmt.Sprintf(`{"i":%d,"pad":"%0200d"}`, i, i)
		batch = append(batch, rec(k, feed.Seq(i+1), want[k]))
	}
	var restore func()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Cut once the first publishes were stored.
		for f.lastSeqQuiet(t) < 100 {
			time.Sleep(time.Millisecond)
		}
		restore = f.link.Down(t, f.nc)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	rej, err := f.sink.Apply(ctx, batch)
	cancel()
	<-done
	if err == nil || len(rej) != 0 {
		t.Errorf("Apply while the connection was cut = %d rejections, %v; want an error and no rejection", len(rej), err)
	}
	t.Logf("Apply under the cut: %v", err)
	restore()
	applyOK(t, f.sink, batch...)
	f.want(t, "after the batch was applied again", want)
}

func (f *fixture) lastSeqQuiet(t *testing.T) uint64 {
	name, err := f.reader.Bucket(t.Context())
	if err != nil {
		return 0
	}
	st, err := f.js.Stream(t.Context(), "KV_"+name)
	if err != nil {
		return 0
	}
	return st.CachedInfo().State.LastSeq
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

func TestOptionsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts  Options
		field string
	}{
		{Options{Bucket: "a-b"}, "nats.bucket"},
		{Options{Bucket: "a.b"}, "nats.bucket"},
		{Options{Bucket: strings.Repeat("b", MaxBucketLen+1)}, "nats.bucket"},
		{Options{Feed: "no spaces"}, "nats.feed"},
		{Options{Window: -1}, "nats.window"},
		{Options{Window: MaxWindow + 1}, "nats.window"},
		{Options{AckTimeout: -time.Second}, "nats.ack_timeout"},
		{Options{Replicas: 6}, "nats.replicas"},
	} {
		_, err := New(t.Context(), connectOnce(t), tc.opts)
		wantInvalid(t, fmt.Sprintf("%+v", tc.opts), err, tc.field)
	}
	_, err := New(t.Context(), nil, Options{})
	wantInvalid(t, "a nil connection", err, "nats.conn")
	_, err = Connect(t.Context(), "", Options{})
	wantInvalid(t, "an empty URL", err, "nats.url")
}

// TestConnectRedactsPassword: a server that cannot be reached is an error
// that names the address without its password.
func TestConnectRedactsPassword(t *testing.T) {
	t.Parallel()
	_, err := Connect(t.Context(), "nats://user:s3cret@"+pgtestClosedPort(t), Options{})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Connect to a closed port = %v; want an error without the password", err)
	}
}
