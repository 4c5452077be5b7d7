package faults_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// Fault 1. Two workers on advisory-lock leases share a PostgreSQL table and
// a file. Mid-batch (inside a sink call of the holder, after its
// EnsureHeld), the holder's lock sessions are ended with
// pg_terminate_backend, and its lease pool cannot reconnect (so the rival,
// not the holder under a new lease, is the one to take over). The holder notices, starts no new sink call (the one
// in flight lands late, the only stale call allowed), the rival takes both
// sinks over, and nothing is lost; every key only ever moves up in both
// sinks (I2), the holder's calls after the kill are at most the one in
// flight per sink (I4), and nothing is left held once both stop (I6).
func TestAdvisorySessionTerminatedMidBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	targets := []*target{pgtableTarget(t, e.ctx), fileTarget(t, "")}
	recs := []*recorder{newRecorder(targets[0].probe), newRecorder(targets[1].probe)}
	opts := syncer.Options{BatchSize: 100, MoveInterval: -1}

	a := e.newWorker("A", true, targets, recs, opts)
	e.put(0, 100)
	eventually(t, "A holds both sinks and caught up", 30*time.Second, func() bool { return a.holds() && e.caughtUp("table", "export")() })
	b := e.newWorker("B", true, targets, recs, opts)
	before := e.holders()

	// Kill A's lock sessions inside A's next call to the table, once.
	var once sync.Once
	killed := make(chan time.Time, 1)
	recs[0].setBefore(func(ctx context.Context, proc, op string, rs []feed.Record) context.Context {
		if proc != "A" || op != "apply" {
			return ctx
		}
		once.Do(func() {
			a.leasesDown.Store(true)
			var n int
			err := e.pool.QueryRow(context.WithoutCancel(ctx), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)`, a.app).Scan(&n)
			if err != nil || n == 0 {
				t.Errorf("terminating A's lock sessions: %d ended, %v", n, err)
			}
			killed <- time.Now()
		})
		return ctx
	})
	for i := 0; i < 20; i++ {
		e.put(i*150, i*150+150) // 3000 keys, 100 of them again, in 20 commits
	}
	var at time.Time
	select {
	case at = <-killed:
	case <-time.After(30 * time.Second):
		t.Fatal("A never sent the batch its sessions were to be ended in")
	}
	eventually(t, "B holds both sinks", 30*time.Second, b.holds)
	if h := e.holders(); h["table"] == before["table"] || h["export"] == before["export"] {
		t.Errorf("I5: a holder came back: before %v, after %v", before, h)
	}
	eventually(t, "both sinks caught up", 60*time.Second, e.caughtUp("table", "export"))
	e.checkSinks(t, targets...)
	for i, r := range recs {
		r.checkNoRegress(t, targets[i].name)
		late := 0
		for _, c := range r.snapshot() {
			if c.proc == "A" && c.start.After(at) {
				late++
			}
		}
		if late > 1 {
			t.Errorf("I4: A started %d calls to %s after its lock sessions were ended; at most the one in flight may land", late, targets[i].name)
		}
		t.Logf("%s: A started %d calls after the kill", targets[i].name, late)
	}
	a.stop()
	b.stop()
	e.checkReleased(t, "table", "export")
}
