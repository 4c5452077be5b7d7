package syncer_test

import (
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// TestCatchUp100k writes 100,000 changes while no worker runs, then starts
// one on a sink that is already at the feed's generation, and measures the
// incremental catch-up in real time. The rate is logged; the test checks that
// every change arrived, in order, with no key going back.
func TestCatchUp100k(t *testing.T) {
	if testing.Short() {
		t.Skip("100k changes: not in -short")
	}
	forEachBackendRealTime(t, func(t *testing.T, e *env) {
		const changes, perCommit = 100_000, 1000
		w := newWorld(e, "bulk")
		opts := testOptions(t, e)
		opts.BatchSize = 1000
		run, _ := one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id) // the empty resync: from here on, incremental
		run.stop()

		for c := range changes / perCommit {
			batch := make([]feed.Change, 0, perCommit)
			for i := range perCommit {
				n := c*perCommit + i
				// Keys repeat across commits so compaction happens, and one
				// change in ten deletes.
				k := key(n % 60_000)
				if n%10 == 9 {
					batch = append(batch, feed.Delete(k))
				} else {
					batch = append(batch, feed.Put(k, doc(`{"n":%d,"pad":"0123456789abcdef0123456789abcdef"}`, n)))
				}
			}
			e.write(batch...)
		}
		_, last := e.liveDocs()
		before := e.cursor(w.id)

		earlier := len(w.log())
		begin := time.Now()
		run, _ = one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		took := time.Since(begin)
		run.stop()

		sent := int64(0)
		for _, c := range w.log()[earlier:] {
			if c.Op != "apply" {
				t.Fatalf("a %s call during an incremental catch-up", c.Op)
			}
			sent += int64(len(c.Seqs))
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
		noProblems(t, w)
		if c := e.cursor(w.id); c.Seq != last.Head || c.Generation != before.Generation {
			t.Fatalf("cursor %v, want %d at generation %d", c, last.Head, before.Generation)
		}
		t.Logf("%s: caught up on %d changes (%d rows after compaction) in %v: %.0f rows/s", e.b.name, changes, sent, took.Round(time.Millisecond), float64(sent)/took.Seconds())
	})
}
