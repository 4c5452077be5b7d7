package faults_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestLostCommitReply is fault 6: a statement the server committed whose
// answer never reaches the worker, because the connection is cut in its
// place (the lose_reply toxic). The worker sees a failed write that in fact
// landed.
//
//   - cursor-move: three cursor moves land but look failed. The worker must
//     not count on either outcome: it reads the cursor again and carries on
//     under the same lease, or gives the lease up; either way the cursor
//     never goes back or passes a row the sink has not taken (I3, checked
//     while it runs), nothing is counted applied twice, and the sink ends
//     right (I1, I2).
//   - lease-take: the worker's first lease take lands but looks failed. The
//     holder it recorded is one the worker never learnt of, so the worker
//     must wait for that lease to lapse, by the database's clock, before a
//     fresh take succeeds under a new holder: no holder repeats (I5), the
//     unknown one never calls the sink, and the sink ends right.
//   - advisory-take: the same for an advisory lease, whose holder is recorded
//     on the lock's own session. The cut ends that session and frees the
//     lock, so the next take may claim the row at once; the holder it
//     replaces is still one the worker never used.
func TestLostCommitReply(t *testing.T) {
	t.Parallel()
	t.Run("cursor-move", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.seed(200)
		load := e.writeLoad(200, 10*time.Millisecond)
		mon := e.monitorI3("s")
		mem := memfeed.NewSink(memfeed.SinkOptions{})
		p := newProxy(t, upstreamHost(t))
		// The simple protocol, so that every answer carries its row
		// description and the cursor move's answer can be told apart by its
		// columns (pgfeed's cas statement returns count, generation, head).
		store := e.store(e.pool(p.addr, pgx.QueryExecModeSimpleProtocol, 4), pgfeed.Options{Lease: rowLease})
		cut := p.loseReplies(pgRowDescription("count", "generation", "head"))
		a := e.startWorker("A", store, "s", mem, testOptions(), false)
		// Arm the cuts once the resync is over: its move runs in a
		// transaction with the parked list, and a cut there would lose the
		// transaction, not just its answer.
		e.caughtUp("s", 30*time.Second)
		for i := range 3 {
			cut.left.Store(1)
			e.eventually("a cursor move's answer to be lost", 20*time.Second, func() bool { return cut.made.Load() == int32(i+1) })
			e.caughtUp("s", 20*time.Second)
		}
		load.halt()
		e.caughtUp("s", 20*time.Second)

		// Each lost answer hid a move that landed: the audit has a move to
		// the very cursor of a move the worker saw fail.
		landed := map[int64]string{}
		for _, r := range e.audit() {
			if r.NewSeq != nil && r.NewHolder != "" {
				landed[*r.NewSeq] = r.NewHolder
			}
		}
		_, _, moves := e.rec.snapshot()
		lost := 0
		for _, m := range moves {
			if m.Err != nil && landed[int64(m.Next.Seq)] == string(m.Holder) {
				lost++
			}
		}
		if lost < 3 {
			t.Fatalf("%d of the worker's failed moves landed in the database; the cuts were meant to make 3 (the test proves nothing)", lost)
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink", mem.Documents(), want)
		stale, handovers := checkI4(t, e.rec)
		n := checkI2(t, e.rec, stale)
		e.checkLeaseAudit()
		e.checkCursorAudit("s")
		// RecordsApplied counts a record once its move is known to have
		// landed; a move whose answer was lost counts nothing (the worker
		// reads the cursor again rather than guess), so each of the three
		// leaves at least one record the sink took uncounted, and none is
		// counted twice.
		type keySeq struct {
			k feed.Key
			s feed.Seq
		}
		took := map[keySeq]bool{}
		_, calls, _ := e.rec.snapshot()
		for _, c := range calls {
			if c.Err == nil && c.ended {
				for _, r := range c.Records {
					took[keySeq{r.Key, r.Seq}] = true
				}
			}
		}
		st := a.w.State()
		if st.RecordsApplied > int64(len(took)-lost) {
			t.Errorf("RecordsApplied is %d; the sink took %d records and %d moves covering some of them were never known to land: a move was counted on a guess", st.RecordsApplied, len(took), lost)
		}
		t.Logf("%d moves landed with their answers lost; %d records sent, %d applied by count; %d lease changes; %d I3 checks",
			lost, n, st.RecordsApplied, handovers, mon.checks.Load())
	})

	for _, advisory := range []bool{false, true} {
		name := "lease-take"
		if advisory {
			name = "advisory-take"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lostTake(t, advisory)
		})
	}
}

// lostTake loses the answer to the worker's first lease take: a lease row's
// COMMIT, or the INSERT that records an advisory holder (autocommitted on
// the lock's own session, which the cut then ends, freeing the lock).
func lostTake(t *testing.T, advisory bool) {
	e := newEnv(t)
	e.seed(200)
	load := e.writeLoad(200, 10*time.Millisecond)
	mon := e.monitorI3("s")
	mem := memfeed.NewSink(memfeed.SinkOptions{})
	p := newProxy(t, upstreamHost(t))
	var store *pgfeed.Store
	var cut *cutter
	if advisory {
		store = e.store(e.pool("", pgx.QueryExecModeCacheStatement, 4), pgfeed.Options{AdvisoryLock: e.pool(p.addr, pgx.QueryExecModeSimpleProtocol, 2)})
		cut = p.loseReplies(pgInsertOneReply)
	} else {
		store = e.store(e.pool(p.addr, pgx.QueryExecModeSimpleProtocol, 4), pgfeed.Options{Lease: rowLease})
		// The store's only transaction before the first lease is the take.
		cut = p.loseReplies(pgCommitReply)
	}
	cut.left.Store(1)
	start := time.Now()
	e.startWorker("A", store, "s", mem, testOptions(), false)
	e.caughtUp("s", 30*time.Second)
	if cut.made.Load() != 1 {
		t.Fatal("no take's answer was lost: the test proves nothing")
	}
	took := time.Since(start)
	takes, _, _ := e.rec.snapshot()
	known := map[string]bool{}
	for _, tk := range takes {
		known[string(tk.Holder)] = true
	}
	var ghost string
	for _, r := range e.audit() {
		if r.NewHolder != "" && !known[r.NewHolder] {
			ghost = r.NewHolder
		}
	}
	if ghost == "" {
		t.Fatal("the audit has no take the worker did not learn of: the lost answer hid nothing")
	}
	if !advisory && took < rowLease.TTL {
		t.Errorf("the worker caught up %v after its start; a lease it could not know of should have kept it out for a ttl (%v)", took, rowLease.TTL)
	}
	e.finalChecks("s", load, mem, 20*time.Second)
	_, calls, _ := e.rec.snapshot()
	for _, c := range calls {
		if string(c.Holder) == ghost {
			t.Fatalf("a sink call was made under the holder whose take's answer was lost")
		}
	}
	t.Logf("lost take %s; first sync done %v after the start; %d I3 checks", ghost, took.Round(time.Millisecond), mon.checks.Load())
}
