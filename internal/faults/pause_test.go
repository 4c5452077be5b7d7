package faults_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// Fault 5, in process. Worker A holds lease rows on a PostgreSQL table, a
// Redis namespace and a file; B stands by. A reads a batch, passes its
// EnsureHeld, and freezes before the send (the recorder's hook, which sits
// exactly there: the worker calls the sink right after EnsureHeld). While it
// is frozen its sessions are gone, as a stopped process's heartbeats are;
// the keys are written again; for at least 2 × ttl, and until B, who took
// the lapsed lease, has sent the newer versions everywhere. Then A wakes and
// its stale call goes out, with the deadline it would have had on waking.
// Every sink's seq guard makes that call a no-op: no key goes back (I2, read
// from the targets themselves after every call), A starts no call but the
// one frozen (I4), its cursor move is refused (B's holder stays on the row
// and the cursor at the head), and both sinks end equal to the feed (I1).
func TestWorkerPausedBeforeSend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	targets := []*target{pgtableTarget(t, e.ctx), redisTarget(t, e.ctx, e.allKeys), fileTarget(t, "")}
	recs := make([]*recorder, len(targets))
	for i, tg := range targets {
		recs[i] = newRecorder(tg.probe)
	}
	opts := syncer.Options{BatchSize: 100, MoveInterval: -1}
	a := e.newWorker("A", false, targets, recs, opts)
	e.put(0, 100)
	eventually(t, "A holds every sink, caught up", 30*time.Second, func() bool { return a.holds() && e.caughtUp("table", "cache", "export")() })
	b := e.newWorker("B", false, targets, recs, opts)
	eventually(t, "B stands by", 30*time.Second, func() bool { return len(b.runner.States()) == 3 })

	// Every A worker that reaches a send freezes there; once all three have,
	// A's sessions go.
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
	before := time.Now() // A is caught up: every call of A from here on is one it froze in or a later one
	e.put(0, 50)         // version 2 of 50 keys: A takes them and freezes
	for range recs {
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatal("A did not reach a send to every sink")
		}
	}
	e.cut(a)
	v3 := e.put(0, 50) // version 3, which only B can send
	began := time.Now()
	eventually(t, "B sent version 3 everywhere", 60*time.Second, func() bool {
		for _, tg := range targets {
			got, err := tg.probe(e.ctx, []feed.Key{key(0), key(49)})
			if err != nil || got[key(0)] < v3.First || got[key(49)] < v3.Last {
				return false
			}
		}
		return true
	})
	if wait := 2*e.lease.TTL - time.Since(began); wait > 0 {
		time.Sleep(wait) // A stays frozen for 2 × ttl at least
	}
	a.restore()
	close(wake)
	eventually(t, "every sink at the head under B", 30*time.Second, func() bool { return b.holds() && e.caughtUp("table", "cache", "export")() })
	time.Sleep(500 * time.Millisecond) // A's stale calls and refused moves land
	if !e.caughtUp("table", "cache", "export")() {
		t.Errorf("I4: a cursor moved back after A woke")
	}
	hs := e.holders()
	for _, s := range b.runner.States() {
		if hs[s.ID.Sink] != s.Holder {
			t.Errorf("I4: %s's row names %s, want B's %s", s.ID.Sink, hs[s.ID.Sink], s.Holder)
		}
	}
	e.checkSinks(t, targets...)
	for i, r := range recs {
		r.checkNoRegress(t)
		stale := 0
		for _, c := range r.snapshot() {
			if c.proc == "A" && c.start.After(before) {
				stale++
			}
		}
		if stale > 1 {
			t.Errorf("I4: A started %d calls to %s since it froze; at most the frozen one may land", stale, targets[i].name)
		}
		t.Logf("%s: A's calls since it froze: %d", targets[i].name, stale)
	}
	a.stop()
	b.stop()
	e.checkReleased(t, "table", "cache", "export")
}
