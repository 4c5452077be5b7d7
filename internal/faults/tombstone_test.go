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
//   - delete, collect, recreate.
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
	for _, r := range recs {
		r.checkNoRegress(t)
	}
	w.stop()
	e.checkReleased(t, sinks...)
}
