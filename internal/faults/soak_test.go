package faults_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/file"
)

// daemonBody is the configuration of a daemon of the soak and the other
// process tests: lease rows with a 2s ttl, a PostgreSQL table and a file.
const daemonBody = `database:
  url: {{db}}
  schema: %s
lease:
  kind: row
  ttl: 2s
  heartbeat: 300ms
  margin: 700ms
http:
  listen: {{listen}}
feeds:
  orders:
    batch: 200
    poll_interval: 200ms
    sinks:
      table:
        type: pgtable
        url: %s
        schema: %s
        table: orders
        create: true
      export:
        type: file
        path: %s
`

// Fault 14, the soak. Three `kairos run` daemons share one feed, a
// PostgreSQL table and a file. A writer commits changes in batches of 50
// over 1000 keys, a tenth of them deletions, and rebuilds the feed once
// half way (a new generation, every live key written again); meanwhile one
// daemon, picked at random, is SIGKILLed every 1.5 to 3 seconds and started
// again half a second later. Along the way the watcher checks I2 on the
// table, I5 and the cursors; at the end, with every daemon up, caught up
// and holding every sink's lease (none left to a killed one): I1 on both
// sinks, I2 on the file's own lines, one generation per copy, and, once
// each daemon exits 0 on SIGTERM, I6: no lease row names a holder, no
// advisory lock and no database session of theirs is left.
//
// 5000 changes by default, written over about 15s (the test takes about
// half a minute); KAIROS_SOAK=1 makes it 50000, KAIROS_SOAK=<n> makes it n,
// at the same pace (50000: about two and a half minutes of writes and some
// 60 kills).
func TestSoak(t *testing.T) {
	t.Parallel()
	changes, budget, span := 5000, 3*time.Minute, 15*time.Second
	if v := os.Getenv("KAIROS_SOAK"); v != "" {
		changes, budget = 50000, 20*time.Minute
		if n, err := strconv.Atoi(v); err == nil && n > 1 {
			changes = n
		}
		span = time.Duration(changes/5000) * 15 * time.Second // the writer's pace of the short soak
	}
	e := newEnvFor(t, budget)
	target := pgtest.Schema(t)
	path := filepath.Join(t.TempDir(), "orders.jsonl")
	body := fmt.Sprintf(daemonBody, e.schema, sinkURL(pgtest.URL()), target, path)
	ds := []*daemon{newDaemon(t, "A", pgtest.URL(), body), newDaemon(t, "B", pgtest.URL(), body), newDaemon(t, "C", pgtest.URL(), body)}
	for _, d := range ds {
		d.start()
	}
	w := e.watch(e.pool, `"`+target+`".orders`)
	sinks := []feed.SinkName{"table", "export"}

	done := make(chan struct{})
	kills := make(chan int, 1)
	var lastKill time.Time // written before kills is sent, read after
	go func() {
		n := 0
		defer func() { kills <- n }()
		for {
			select {
			case <-done:
				return
			case <-time.After(1500*time.Millisecond + rand.N(1500*time.Millisecond)):
			}
			d := ds[rand.N(len(ds))]
			d.kill()
			lastKill = time.Now()
			n++
			time.Sleep(500 * time.Millisecond)
			d.start()
		}
	}()
	began := time.Now()
	const batch = 50
	pace := span / time.Duration(changes/batch) // the short soak writes for about 15s
	rebuilt := false
	for written := 0; written < changes; written += batch {
		if !rebuilt && written >= changes/2 {
			g := e.rebuild()
			t.Logf("rebuilt to generation %d after %d changes", g, written)
			rebuilt = true
		}
		keys := make([]feed.Key, batch)
		seen := map[feed.Key]bool{}
		for i := range keys {
			k := key(rand.N(1000))
			for seen[k] {
				k = key(rand.N(1000))
			}
			seen[k] = true
			keys[i] = k
		}
		e.write(keys, func(feed.Key) bool { return rand.N(10) == 0 })
		time.Sleep(pace)
	}
	close(done)
	n := <-kills
	t.Logf("%d changes written in %v, %d daemons SIGKILLed and restarted meanwhile", changes, time.Since(began).Round(time.Millisecond), n)
	for _, d := range ds {
		if !d.running() {
			d.start()
		}
	}
	eventually(t, "every sink caught up", budget/2, e.caughtUp(sinks...))
	// A sink may have caught up under a holder killed since, whose lease
	// stays recorded until its ttl (2s) runs out and a live daemon takes
	// it; the daemons stopped before then would leave it named, as a kill
	// must. A lease that expires more than a ttl after the last kill was
	// renewed since, by a live holder, which the stop must release.
	eventually(t, "every sink held by a live daemon", budget/2, func() bool {
		d, err := e.store.Describe(e.ctx, e.feed)
		if err != nil {
			return false
		}
		held := 0
		for _, s := range d.Sinks {
			if s.Lease != nil && s.Lease.ExpiresAt.After(lastKill.Add(2*time.Second)) {
				held++
			}
		}
		return held == len(sinks)
	})
	w.stop(t)
	t.Logf("holders seen: table %d, export %d", len(w.holders["table"]), len(w.holders["export"]))
	want, _ := live(e.ctx, t, e.store, e.feed)
	for _, s := range sinks {
		if p := e.parked(s); len(p) > 0 {
			t.Errorf("%s parked %d keys; nothing here is refusable", s, len(p))
		}
	}
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
	for _, d := range ds {
		d.term()
	}
	e.checkReleased(t, sinks...)
	if n := e.sessionsLeft(ds...); n != 0 {
		t.Errorf("I6: %d database sessions of the stopped daemons are left", n)
	}
}
