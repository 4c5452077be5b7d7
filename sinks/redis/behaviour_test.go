package redis_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/sinks/redis"
)

func TestOptionsRefused(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	c := tg.client(t)
	for _, tc := range []struct {
		opts  redis.Options
		field string
	}{
		{redis.Options{Prefix: "no-colon"}, "redis.prefix"},
		{redis.Options{Prefix: "a{b}:"}, "redis.prefix"},
		{redis.Options{Prefix: "a*:"}, "redis.prefix"},
		{redis.Options{Prefix: "a b:"}, "redis.prefix"},
		{redis.Options{Prefix: strings.Repeat("p", redis.MaxPrefixLen) + ":"}, "redis.prefix"},
		{redis.Options{Encoding: "msgpack"}, "redis.encoding"},
		{redis.Options{TTL: time.Millisecond}, "redis.ttl"},
		{redis.Options{TTL: -time.Second}, "redis.ttl"},
		{redis.Options{TTL: time.Second + time.Microsecond}, "redis.ttl"},
		{redis.Options{TombstoneTTL: time.Second}, "redis.tombstone_ttl"},
		{redis.Options{MaxDocumentBytes: 8}, "redis.max_document_bytes"},
		{redis.Options{MaxDocumentBytes: redis.MaxMaxDocumentBytes + 1}, "redis.max_document_bytes"},
		{redis.Options{ClientName: "with space"}, "redis.client_name"},
	} {
		_, err := redis.New(t.Context(), c, tc.opts)
		wantInvalid(t, fmt.Sprintf("New(%+v)", tc.opts), err, tc.field)
	}
	_, err := redis.New(t.Context(), nil, redis.Options{})
	wantInvalid(t, "New(nil)", err, "redis.client")
	noCtx := goredis.NewClient(&goredis.Options{Addr: addr()})
	defer noCtx.Close()
	_, err = redis.New(t.Context(), noCtx, redis.Options{Prefix: tg.prefix})
	wantInvalid(t, "New over a client without ContextTimeoutEnabled", err, "redis.client")
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": addr()}, ContextTimeoutEnabled: true})
	defer ring.Close()
	_, err = redis.New(t.Context(), ring, redis.Options{Prefix: tg.prefix})
	wantInvalid(t, "New over a Ring", err, "redis.client")

	_, err = redis.Open(t.Context(), "redis://user:s3cret-pw@[::1", redis.Options{})
	wantInvalid(t, "Open of a bad URL", err, "redis.url")
	if err != nil && strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("Open's error repeats the password: %v", err)
	}
	_, err = redis.Open(t.Context(), "redis://user:s3cret-pw@127.0.0.1:1/0", redis.Options{Prefix: tg.prefix})
	if err == nil || strings.Contains(err.Error(), "s3cret-pw") || !errors.Is(err, redis.ErrConnection) {
		t.Errorf("Open of a closed port: %v; want a connection error without the password", err)
	}
	if _, err := redis.NewReader(c, redis.Options{Prefix: "x"}); err == nil {
		t.Error("NewReader with a bad prefix: no error")
	}
}

// dump is every key under the prefix with its type, value (DUMP) and
// whether it expires: the whole state, to the byte.
func (tg *target) dump(t *testing.T) map[string]string {
	t.Helper()
	ctx := t.Context()
	out := map[string]string{}
	var cursor uint64
	for {
		keys, next, err := tg.admin.Scan(ctx, cursor, tg.prefix+"*", 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			d, err := tg.admin.Dump(ctx, k).Result()
			if errors.Is(err, goredis.Nil) {
				continue // removed since SCAN saw it
			}
			if err != nil {
				t.Fatal(err)
			}
			ttl := tg.admin.PTTL(ctx, k).Val() > 0
			out[k] = fmt.Sprintf("%x expires=%v", d, ttl)
		}
		if cursor = next; cursor == 0 {
			return out
		}
	}
}

// TestStaleCallChangesNothing: a call with older seqs than what the sink
// holds, documents and tombstones alike, through another sink over the
// same prefix (a worker that lost its lease), changes no byte of any key:
// not the documents, not the seqs, not the tombstones' seqs.
func TestStaleCallChangesNothing(t *testing.T) {
	t.Parallel()
	for _, enc := range []string{redis.EncodingJSON, redis.EncodingHash} {
		t.Run(enc, func(t *testing.T) {
			t.Parallel()
			tg := newTarget(t)
			opts := redis.Options{Encoding: enc}
			fresh, stale := tg.sink(t, opts), tg.sink(t, opts)
			applyOK(t, fresh, rec("a", 10, `{"v":10}`), rec("b", 11, `{"v":11}`), rec("c", 12, `{"v":12}`))
			applyOK(t, fresh, rec("c", 13, ""), rec("d", 14, ""))
			before := tg.dump(t)
			applyOK(t, stale, rec("a", 5, `{"v":5}`), rec("b", 6, ""), rec("c", 7, `{"v":7}`), rec("d", 8, `{"v":8}`))
			applyOK(t, stale, rec("a", 10, `{"v":"same seq, other doc"}`), rec("c", 13, `{"v":13}`))
			if after := tg.dump(t); !maps.Equal(before, after) {
				t.Errorf("a stale call changed the state:\nbefore %v\nafter  %v", before, after)
			}
			got, err := tg.reader(t, enc).MGet(t.Context(), "a", "b", "c", "d")
			if err != nil {
				t.Fatal(err)
			}
			if !feedtest.JSONEqual(got[0], json.RawMessage(`{"v":10}`)) || !feedtest.JSONEqual(got[1], json.RawMessage(`{"v":11}`)) || got[2] != nil || got[3] != nil {
				t.Errorf("after a stale call the reader gets %q", got)
			}
		})
	}
}

// TestFloorAfterPublish: a sink started after a publish (a worker's
// process that starts while the old one's call is still in flight) reads the
// new copy's floor with the pointer, and drops a stale call of the
// generation before, for keys the copy lacks too; the floor is the meta
// hash's, beside live.
func TestFloorAfterPublish(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, redis.Options{})
	applyOK(t, s, rec("a", 1, `{"g":1}`), rec("b", 2, `{"g":1}`))
	r, err := s.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("b", 12, `{"g":2}`), rec("a", 10, ""))
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	if f, err := tg.admin.HGet(t.Context(), tg.meta(), "floor").Result(); err != nil || f != "10" {
		t.Fatalf("the meta hash's floor = %q, %v; want 10, the lowest seq of the copy's first batch", f, err)
	}
	late := tg.sink(t, redis.Options{})
	applyOK(t, late, rec("c", 3, `{"g":1}`), rec("a", 4, `{"g":1}`), rec("b", 5, ""))
	applyOK(t, late, rec("d", 13, `{"g":2}`)) // the copy's own still land
	got, err := tg.reader(t, redis.EncodingJSON).MGet(t.Context(), "a", "b", "c", "d")
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != nil || !feedtest.JSONEqual(got[1], json.RawMessage(`{"g":2}`)) || got[2] != nil || !feedtest.JSONEqual(got[3], json.RawMessage(`{"g":2}`)) {
		t.Errorf("after a stale call of generation 1 the reader gets %q; want a and c absent, b and d of generation 2", got)
	}
}

// TestConnectionKilledMidBatch: the sink's own connections, found by the
// client name Open sets, are killed by CLIENT KILL ID while a large batch
// is on the wire. The call is an error of the connection, never a
// rejection; the same batch sent again lands whole.
func TestConnectionKilledMidBatch(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	ctx := t.Context()
	s, err := redis.Open(ctx, "redis://"+addr()+"/0", redis.Options{Prefix: tg.prefix, ClientName: tg.name})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var batch []feed.Record
	for i := range 20_000 {
		batch = append(batch, feed.Record{Key: feed.Key(fmt.Sprintf("k%05d", i)), Seq: feed.Seq(i + 1), Doc: json.RawMessage(fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 300)))})
	}
	var hit error
	for attempt := 0; attempt < 20 && hit == nil; attempt++ {
		done := make(chan struct{})
		var rej []feed.Rejection
		var err error
		go func() { defer close(done); rej, err = s.Apply(ctx, batch) }()
		// Kill the sink's connections until the call returns: an idle one
		// killed is only replaced, one killed with the batch on it cuts
		// the call.
		time.Sleep(time.Duration(attempt) * time.Millisecond)
	kill:
		for {
			select {
			case <-done:
				break kill
			default:
			}
			if _, kerr := tg.killSink(ctx); kerr != nil {
				t.Fatal(kerr)
			}
		}
		<-done
		if len(rej) != 0 {
			t.Fatalf("a killed connection: %d rejections (%v); an outage parks nothing", len(rej), rej[0])
		}
		if err != nil {
			hit = err
		}
	}
	if hit == nil {
		t.Fatal("no Apply of 20 was cut by CLIENT KILL")
	}
	if !errors.Is(hit, redis.ErrConnection) {
		t.Errorf("the cut call: %v; want a connection error", hit)
	}
	t.Logf("the cut call: %v", hit)
	applyOK(t, s, batch...)
	keys := make([]feed.Key, len(batch))
	for i, r := range batch {
		keys[i] = r.Key
	}
	got, err := tg.reader(t, "").MGet(ctx, keys...)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range got {
		if !feedtest.JSONEqual(d, batch[i].Doc) {
			t.Fatalf("%s after the retry: %.40s, want %.40s", batch[i].Key, d, batch[i].Doc)
		}
	}
}

// TestCollector: after a publish, the old copy goes in the background;
// an aborted resync's and a crashed one's too; keys under the prefix that
// are not of the layout, and the live copy, stay.
func TestCollector(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	ctx := t.Context()
	s := tg.sink(t, redis.Options{})
	var batch []feed.Record
	for i := range 3000 {
		batch = append(batch, rec(fmt.Sprintf("k%04d", i), feed.Seq(i+1), `{"old":true}`))
	}
	batch = append(batch, rec("gone", 5000, ""))
	applyOK(t, s, batch...)
	old, _ := tg.live(ctx)
	foreign := []string{tg.prefix + "app-own", tg.prefix + "1.x:{a}", tg.prefix + old + ":not-a-tag"}
	for _, k := range foreign {
		tg.admin.Set(ctx, k, "the application's", 0)
	}
	crashed, err := s.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, crashed, rec("crashed", 6000, `1`))
	aborted, err := s.OpenResync(ctx, 2) // retires the crashed one
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, aborted, rec("aborted", 6001, `1`))
	if err := aborted.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("new", 7000, `{"new":true}`))
	// The crashed resync's late call lands nowhere anyone reads, and is
	// told so.
	if _, err := crashed.Apply(ctx, []feed.Record{rec("late", 6002, `1`)}); !errors.Is(err, redis.ErrSuperseded) {
		t.Errorf("a retired resync's Apply: %v; want ErrSuperseded", err)
	}
	if err := crashed.Publish(ctx); !errors.Is(err, redis.ErrSuperseded) {
		t.Errorf("a retired resync's Publish: %v; want ErrSuperseded", err)
	}
	if err := r.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		all := tg.dump(t)
		var left []string
		for k := range all {
			if !strings.HasPrefix(k, tg.prefix+r.(*redis.Resync).Namespace()+":") && k != tg.meta() && !slices.Contains(foreign, k) {
				left = append(left, k)
			}
		}
		if len(left) == 0 {
			for _, k := range foreign {
				if _, ok := all[k]; !ok {
					t.Errorf("the collector removed %q, which is not of the sink's layout", k)
				}
			}
			if len(all) != 2+1+len(foreign) {
				t.Errorf("left: %d keys, want the new copy's two, the meta hash and the foreign ones: %v", len(all), slices.Sorted(maps.Keys(all)))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background collector left %d keys, e.g. %v", len(left), left[:min(5, len(left))])
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, err := s.Sweep(ctx); err != nil || n != 0 {
		t.Errorf("a pass with nothing to collect: %d, %v", n, err)
	}
}

// TestCloseStopsCollector: Close returns while a pass runs, the pass
// stopping at its next step (goleak in TestMain checks nothing is left).
func TestCloseStopsCollector(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, redis.Options{})
	r, err := s.OpenResync(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("a", 1, `1`))
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.Close()
	s.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %s", d)
	}
}

// TestHashEncoding: documents as hashes of their top-level members, each
// a field holding the member's JSON; what a hash cannot hold is rejected
// alone.
func TestHashEncoding(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	ctx := t.Context()
	s := tg.sink(t, redis.Options{Encoding: redis.EncodingHash})
	rej, err := s.Apply(ctx, []feed.Record{
		rec("user/1", 1, `{"name":"Ann","age":41,"tags":["a","b"],"n":"42","nested":{"x":null},"dup":1,"dup":2}`),
		rec("scalar", 2, `42`), rec("array", 3, `[1]`), rec("empty", 4, `{}`),
		rec("user/2", 5, `{"name":"Bo"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	var refused []feed.Key
	for _, r := range rej {
		refused = append(refused, r.Key)
	}
	if !slices.Equal(refused, []feed.Key{"scalar", "array", "empty"}) {
		t.Errorf("rejected %v, want scalar, array and empty", rej)
	}
	ns, _ := tg.live(ctx)
	fields, err := tg.admin.HGetAll(ctx, tg.docKey(ns, "user/1")).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"name": `"Ann"`, "age": `41`, "tags": `["a","b"]`, "n": `"42"`, "nested": `{"x":null}`, "dup": `2`}
	if !maps.Equal(fields, want) {
		t.Errorf("HGETALL user/1 = %v, want %v", fields, want)
	}
	// An update drops the members the new version lacks.
	applyOK(t, s, rec("user/1", 6, `{"name":"Ann B."}`))
	d, ok, err := tg.reader(t, redis.EncodingHash).Get(ctx, "user/1")
	if err != nil || !ok || !feedtest.JSONEqual(d, json.RawMessage(`{"name":"Ann B."}`)) {
		t.Errorf("Get after an update = %s, %v, %v", d, ok, err)
	}
	applyOK(t, s, rec("user/2", 7, ""))
	if _, ok, err := tg.reader(t, redis.EncodingHash).Get(ctx, "user/2"); ok || err != nil {
		t.Errorf("Get after a delete: %v, %v", ok, err)
	}
	// A hash of many members, past one HSET's share of the script's stack.
	big := map[string]int{}
	for i := range 5000 {
		big[fmt.Sprintf("f%d", i)] = i
	}
	bd, _ := json.Marshal(big)
	applyOK(t, s, feed.Record{Key: "big", Seq: 8, Doc: bd})
	if d, _, err := tg.reader(t, redis.EncodingHash).Get(ctx, "big"); err != nil || !feedtest.JSONEqual(d, bd) {
		t.Errorf("a hash of 5000 members reads back as %.60s, %v", d, err)
	}
}

// TestTTL: documents expire with their seqs; a tombstone's seq expires
// after TombstoneTTL.
func TestTTL(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	ctx := t.Context()
	s := tg.sink(t, redis.Options{TTL: 90 * time.Second, TombstoneTTL: 2 * time.Minute})
	applyOK(t, s, rec("a", 1, `1`), rec("b", 2, ""))
	ns, _ := tg.live(ctx)
	for k, want := range map[string]time.Duration{
		tg.docKey(ns, "a"): 90 * time.Second, tg.docKey(ns, "a") + ":seq": 90 * time.Second, tg.docKey(ns, "b") + ":seq": 2 * time.Minute,
	} {
		if got := tg.admin.PTTL(ctx, k).Val(); got <= want-10*time.Second || got > want {
			t.Errorf("PTTL %s = %s, want about %s", k, got, want)
		}
	}
}

// TestReaderFollowsPublish: a Reader made before a publish reads the new
// copy after it; readers racing publishes never see a mix of two copies in
// one MGet, nor a key of the live copy missing.
func TestReaderFollowsPublish(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	ctx := t.Context()
	s := tg.sink(t, redis.Options{})
	keys := []feed.Key{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	batch := func(round int, seq feed.Seq) []feed.Record {
		var out []feed.Record
		for i, k := range keys {
			out = append(out, feed.Record{Key: k, Seq: seq + feed.Seq(i), Doc: json.RawMessage(fmt.Sprintf(`{"round":%d}`, round))})
		}
		return out
	}
	applyOK(t, s, batch(0, 1)...)
	rd := tg.reader(t, "")
	if d, ok, err := rd.Get(ctx, "k0"); err != nil || !ok || string(d) != `{"round":0}` {
		t.Fatalf("Get = %s, %v, %v", d, ok, err)
	}
	if _, ok, err := rd.Get(ctx, "absent"); ok || err != nil {
		t.Fatalf("Get of an absent key = %v, %v", ok, err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	reads := 0
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				docs, err := rd.MGet(ctx, keys...)
				mu.Lock()
				reads++
				if err != nil {
					bad = append(bad, err.Error())
				} else {
					for _, d := range docs {
						if d == nil || string(d) != string(docs[0]) {
							bad = append(bad, fmt.Sprintf("%q", docs))
							break
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	for round := 1; round <= 20; round++ {
		r, err := s.OpenResync(ctx, feed.Generation(round))
		if err != nil {
			t.Fatal(err)
		}
		applyOK(t, r, batch(round, feed.Seq(round*100))...)
		if err := r.Publish(ctx); err != nil {
			t.Fatal(err)
		}
		if d, _, err := rd.Get(ctx, "k3"); err != nil || string(d) != fmt.Sprintf(`{"round":%d}`, round) {
			t.Fatalf("round %d: Get after Publish = %s, %v", round, d, err)
		}
		time.Sleep(5 * time.Millisecond) // let the collector run under the readers
	}
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of %d reads racing publishes were wrong, e.g. %s", len(bad), reads, bad[0])
	}
	t.Logf("%d MGets raced 20 publishes", reads)
}
