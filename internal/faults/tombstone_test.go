package faults_test

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// checkModel compares the feed's live documents with what the test wrote:
// each key's last change, a document or none when it was a deletion.
func (e *env) checkModel(t testing.TB, bad map[feed.Key]json.RawMessage) {
	t.Helper()
	got, _ := live(e.ctx, t, e.store, e.feed)
	want := map[feed.Key]json.RawMessage{}
	e.mu.Lock()
	for k, d := range e.last {
		want[k] = d
	}
	e.mu.Unlock()
	for k, d := range bad {
		want[k] = d
	}
	sameDocs(t, "the feed", got, want, nil)
}

// Fault 11. Tombstone collection races with the writes and the parked list,
// with a worker mirroring into a PostgreSQL table (which refuses a document
// whose "v" its integer column cannot hold: a park) and a file:
//
//   - collection against re-upserts of the keys it is collecting, in a
//     tight loop on both sides;
//   - park, then delete the parked key, collect, and retry it;
//   - delete, collect, recreate;
//   - park, stop the worker, delete, collect (the tombstone stays), retry
//     (the tombstone is restamped), and a new worker sends the deletion.
//
// Each key ends right in the feed (the test's own model of its writes) and
// in both sinks (I1), and nothing the collector removed comes back.
func TestTombstoneRaces(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	targets := []*target{pgtableTarget(t, e.ctx), fileTarget(t, "")}
	recs := []*recorder{newRecorder(targets[0].probe), newRecorder(targets[1].probe)}
	w := e.newWorker("A", false, targets, recs, syncer.Options{BatchSize: 50, MoveInterval: -1})
	sinks := []feed.SinkName{"table", "export"}
	e.put(0, 300)
	eventually(t, "caught up", 30*time.Second, e.caughtUp(sinks...))

	// Collection against re-upserts: delete 300 keys, and while a collector
	// runs flat out, put each back, one commit each, half of them deleted
	// again.
	keys := make([]feed.Key, 300)
	for i := range keys {
		keys[i] = key(i)
	}
	e.write(keys, func(feed.Key) bool { return true })
	stop := make(chan struct{})
	var collected int
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := e.store.CollectTombstones(e.ctx, e.feed)
			if err != nil {
				t.Errorf("collect: %v", err)
				return
			}
			collected += n
		}
	})
	for i, k := range keys {
		e.write([]feed.Key{k}, nil)
		if i%2 == 0 {
			e.write([]feed.Key{k}, func(feed.Key) bool { return true })
		}
	}
	eventually(t, "caught up after the re-upserts", 60*time.Second, e.caughtUp(sinks...))
	close(stop)
	wg.Wait()
	n, err := e.store.CollectTombstones(e.ctx, e.feed)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("collection vs re-upsert: %d tombstones collected during the race, %d after", collected, n)
	e.checkModel(t, nil)
	e.checkSinks(t, targets...)

	// Park, delete, collect, retry.
	bad := feed.Key("bad1")
	badDoc := json.RawMessage(`{"k":"bad1","v":"not a number"}`)
	e.mu.Lock()
	e.versions[bad]++
	e.dead[bad] = false
	delete(e.last, bad)
	e.mu.Unlock()
	if _, err := e.store.WriteCommitted(e.ctx, e.feed, []feed.Change{feed.Put(bad, badDoc)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bad1 parked for the table", 30*time.Second, func() bool { return e.caughtUp(sinks...)() && e.parked("table")[bad] })
	e.checkModel(t, map[feed.Key]json.RawMessage{bad: badDoc})
	e.checkSinks(t, targets...) // the file has it, the table does not and says so
	e.write([]feed.Key{bad}, func(feed.Key) bool { return true })
	eventually(t, "caught up after the delete", 30*time.Second, e.caughtUp(sinks...))
	if _, err := e.store.CollectTombstones(e.ctx, e.feed); err != nil {
		t.Fatal(err)
	}
	retried, err := e.store.RetryParked(e.ctx, feed.SinkID{Feed: e.feed, Sink: "table"}, bad)
	if err != nil {
		t.Fatalf("retry after collection: %v", err)
	}
	eventually(t, "caught up after the retry", 30*time.Second, e.caughtUp(sinks...))
	t.Logf("park, delete, collect, retry: retry found it parked: %v; parked now: %v", retried, e.parked("table"))
	if e.parked("table")[bad] {
		t.Errorf("bad1 is still parked for the table after its deletion and retry")
	}
	e.checkModel(t, nil)
	e.checkSinks(t, targets...)

	// Delete, collect, recreate, 50 keys.
	some := keys[:50]
	e.write(some, func(feed.Key) bool { return true })
	eventually(t, "caught up after the delete", 30*time.Second, e.caughtUp(sinks...))
	n, err = e.store.CollectTombstones(e.ctx, e.feed)
	if err != nil || n < len(some) {
		t.Fatalf("collected %d (%v), want at least the %d tombstones every sink passed", n, err, len(some))
	}
	e.write(some, nil)
	eventually(t, "caught up after the recreate", 30*time.Second, e.caughtUp(sinks...))
	e.checkModel(t, nil)
	e.checkSinks(t, targets...)

	// Park, then, with no worker running, delete, collect (which must keep
	// the tombstone: the table's cursor has not passed it, and the key is
	// parked), and retry, which restamps the tombstone above the cursor; a
	// new worker then sends the deletion.
	bad2 := feed.Key("bad2")
	badDoc2 := json.RawMessage(`{"k":"bad2","v":"still not a number"}`)
	e.mu.Lock()
	e.versions[bad2]++
	e.dead[bad2] = false
	delete(e.last, bad2)
	e.mu.Unlock()
	if _, err := e.store.WriteCommitted(e.ctx, e.feed, []feed.Change{feed.Put(bad2, badDoc2)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bad2 parked for the table", 30*time.Second, func() bool { return e.caughtUp(sinks...)() && e.parked("table")[bad2] })
	w.stop()
	e.write([]feed.Key{bad2}, func(feed.Key) bool { return true })
	if _, err := e.store.CollectTombstones(e.ctx, e.feed); err != nil {
		t.Fatal(err)
	}
	if tr := e.trace(bad2); !tr {
		t.Errorf("bad2's tombstone was collected before any sink passed it, while it was parked")
	}
	if ok, err := e.store.RetryParked(e.ctx, feed.SinkID{Feed: e.feed, Sink: "table"}, bad2); err != nil || !ok {
		t.Fatalf("retrying bad2 with no worker running: %v, %v; want it found parked", ok, err)
	}
	w2 := e.newWorker("A2", false, targets, recs, syncer.Options{BatchSize: 50, MoveInterval: -1})
	eventually(t, "caught up after the retry", 30*time.Second, e.caughtUp(sinks...))
	if e.parked("table")[bad2] {
		t.Errorf("bad2 is still parked after its tombstone was retried and sent")
	}
	e.checkModel(t, nil)
	e.checkSinks(t, targets...)
	if n, err := e.store.CollectTombstones(e.ctx, e.feed); err != nil || n == 0 || e.trace(bad2) {
		t.Errorf("collecting once every sink passed bad2's tombstone: %d, %v; still there: %v", n, err, e.trace(bad2))
	}
	for i, r := range recs {
		r.checkNoRegress(t, targets[i].name)
	}
	w2.stop()
	e.checkReleased(t, sinks...)
}

// trace reports whether the feed still holds a row for k, a document or a
// tombstone.
func (e *env) trace(k feed.Key) bool {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM "`+e.schema+`".feed_rows WHERE feed = $1 AND key = $2`, string(e.feed), string(k)).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n > 0
}
