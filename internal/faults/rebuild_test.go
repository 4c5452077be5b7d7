package faults_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/syncer"
)

// Fault 10, the late sender. Worker A freezes inside a send of generation
// 1's records (after its EnsureHeld); the feed is rebuilt into generation 2,
// which no longer holds the odd keys; A's sessions go, B takes the lapsed
// leases, resyncs every sink into a fresh copy and publishes it; only then
// does A wake and send its generation-1 batch to what is now the live copy.
// No sink may then serve a mixed generation: the stale records are older
// than every record of the copy (seqs are never reset), so a sink's seq
// guard refuses those of keys the copy holds, and its resync floor (the
// first seq the copy was sent) refuses those of keys it does not. Run over a
// PostgreSQL table, a file and a bleve index.
func TestOldGenerationSendsAfterPublish(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	targets := []*target{pgtableTarget(t, e.ctx), fileTarget(t, ""), bleveTarget(t, e.ctx, "", e.allKeys)}
	recs := make([]*recorder, len(targets))
	for i, tg := range targets {
		recs[i] = newRecorder(tg.probe)
	}
	sinks := []feed.SinkName{"table", "export", "search"}
	opts := syncer.Options{BatchSize: 100, MoveInterval: -1}
	a := e.newWorker("A", false, targets, recs, opts)
	e.put(0, 200)
	eventually(t, "A holds every sink, caught up", 30*time.Second, func() bool { return a.holds() && e.caughtUp(sinks...)() })
	b := e.newWorker("B", false, targets, recs, opts)

	arrived := make(chan int, len(recs))
	wake := make(chan struct{})
	for i, r := range recs {
		var once sync.Once
		r.setBefore(func(ctx context.Context, proc, op string, rs []feed.Record) context.Context {
			if proc != "A" {
				return ctx
			}
			once.Do(func() { arrived <- i })
			<-wake
			return context.WithoutCancel(ctx)
		})
	}
	froze := time.Now()
	e.put(0, 200) // generation 1, version 2 of every key: A freezes in its send
	for range recs {
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatal("A did not reach a send to every sink")
		}
	}
	e.cut(a)
	g := e.rebuildKeeping(func(k feed.Key) bool { return k[len(k)-1]%2 == 0 })
	eventually(t, "B published generation 2 everywhere", 60*time.Second, func() bool { return b.holds() && e.caughtUp(sinks...)() })
	want, _ := live(e.ctx, t, e.store, e.feed)
	if len(want) != 100 {
		t.Fatalf("generation %d holds %d keys, want the 100 even ones", g, len(want))
	}
	a.restore()
	close(wake)
	time.Sleep(time.Second) // A's stale calls land, its moves are refused
	eventually(t, "still caught up under B", 30*time.Second, e.caughtUp(sinks...))
	for _, tg := range targets {
		docs := tg.read(t)
		sameDocs(t, string(tg.name)+" after the late send", docs, want, nil)
		checkOneGeneration(t, string(tg.name), docs, e.gen)
	}
	for i, r := range recs {
		stale := 0
		for _, c := range r.snapshot() {
			if c.proc == "A" && c.start.After(froze) {
				stale++
				t.Logf("%s: A's late call: %s of seqs %d to %d, error %v", targets[i].name, c.op, c.first, c.last, c.err)
			}
		}
		if stale != 1 {
			t.Errorf("I4: A made %d calls to %s after it froze; want exactly the frozen one", stale, targets[i].name)
		}
	}
	a.stop()
	b.stop()
	e.checkReleased(t, sinks...)
}

// Fault 10, the crash. Daemon A (`kairos run`) is SIGKILLed while it fills
// a resync's copy of a PostgreSQL table and a file after a rebuild that
// drops half the keys; daemon B takes the lapsed leases, opens the copies
// again from empty, fills and publishes them. Throughout, the watcher reads
// the live table: never two generations at once, never an older one after
// a newer, no key back (I2); at the end both sinks hold exactly generation
// 2's live documents (I1), the file's own lines never take a key back, and
// B stops cleanly with nothing left held (I6).
func TestDaemonKilledMidResync(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	target := pgtest.Schema(t)
	path := filepath.Join(t.TempDir(), "orders.jsonl")
	body := fmt.Sprintf(daemonBody, e.schema, sinkURL(pgtest.URL()), target, path)
	a, b := newDaemon(t, "A", pgtest.URL(), body), newDaemon(t, "B", pgtest.URL(), body)
	sinks := []feed.SinkName{"table", "export"}
	a.start()
	for i := range 20 {
		e.put(i*1000, i*1000+1000)
	}
	eventually(t, "A caught up on generation 1", 90*time.Second, e.caughtUp(sinks...))
	aHolds := map[feed.LeaseHolder]bool{}
	if d, err := e.store.Describe(e.ctx, e.feed); err == nil {
		for _, s := range d.Sinks {
			if s.Lease != nil {
				aHolds[s.Lease.Holder] = true
			}
		}
	}
	b.start()
	w := e.watch(e.pool, `"`+target+`".orders`)
	e.rebuildKeeping(func(k feed.Key) bool { return k[len(k)-1]%2 == 0 })
	var shadows int
	eventually(t, "A filling the table's copy", 30*time.Second, func() bool {
		_ = e.pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'orders'`, target).Scan(&shadows)
		return shadows > 0
	})
	a.kill()
	var copied int
	_ = e.pool.QueryRow(e.ctx, `SELECT coalesce(sum(n_live_tup), 0)::int FROM pg_stat_user_tables WHERE schemaname = $1 AND relname <> 'orders'`, target).Scan(&copied)
	t.Logf("A killed with the table's copy open (about %d rows in it)", copied)
	eventually(t, "B published generation 2 everywhere", 90*time.Second, e.caughtUp(sinks...))
	w.stop(t)
	want, _ := live(e.ctx, t, e.store, e.feed)
	table := readTable(t, e, target)
	sameDocs(t, "the table", table, want, nil)
	snap, err := file.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sameDocs(t, "the file", snap.Docs, want, nil)
	checkOneGeneration(t, "the table", table, e.gen)
	checkOneGeneration(t, "the file", snap.Docs, e.gen)
	checkFileLines(t, path)
	// A sink whose copy A had published before it died is caught up without
	// B, which takes its lapsed lease only at its next try (every few
	// seconds): B stops once it holds every sink, so that the check below
	// judges B's release rather than A's death.
	eventually(t, "B holding every lease the killed A held", 30*time.Second, func() bool {
		d, err := e.store.Describe(e.ctx, e.feed)
		if err != nil {
			return false
		}
		for _, s := range d.Sinks {
			if s.Lease == nil || aHolds[s.Lease.Holder] {
				return false
			}
		}
		return len(d.Sinks) == len(sinks)
	})
	b.term()
	e.checkReleased(t, sinks...)
	if n := e.sessionsLeft(a, b); n != 0 {
		t.Errorf("I6: %d database sessions of the stopped daemons are left", n)
	}
}
