package faults_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// Fault 9. A writer keeps its transaction open for seconds while eight
// others commit in a loop, and a worker tails the feed into a PostgreSQL
// table and a file throughout:
//
//   - early: the long writer writes its feed rows first and then holds the
//     transaction open. In the locked mode it holds the feed lock, so the
//     others queue behind it and commit after it, with higher seqs; in the
//     concurrent mode they commit and are sealed and sent meanwhile, and its
//     rows, unsealed until it commits, are sealed after theirs;
//   - late: the long writer does its own work first and writes its feed
//     rows only just before committing; the others commit meanwhile, and its
//     rows take seqs above theirs.
//
// Either way no row is skipped by the tailing worker: both sinks end equal
// to the feed (I1), every committed row at or below the cursor was sent (I3:
// the recorder saw each seq the feed holds), and no key went back (I2).
func TestLongTransactionNoRowSkipped(t *testing.T) {
	t.Parallel()
	longTransaction(t, feed.WriteLocked)
}

// TestLongTransactionNoRowSkippedConcurrent is fault 9 in the concurrent
// write mode, with the feed's sealer running beside the worker.
func TestLongTransactionNoRowSkippedConcurrent(t *testing.T) {
	t.Parallel()
	longTransaction(t, feed.WriteConcurrent)
}

func longTransaction(t *testing.T, mode feed.WriteMode) {
	e := newEnv(t)
	if mode == feed.WriteConcurrent {
		if err := e.store.SetWriteMode(e.ctx, e.feed, mode); err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(e.ctx)
		sealed := make(chan error, 1)
		go func() { sealed <- e.store.RunSealer(ctx, e.feed) }()
		defer func() {
			stop()
			if err := <-sealed; err != nil {
				t.Errorf("the sealer: %v", err)
			}
		}()
	}
	targets := []*target{pgtableTarget(t, e.ctx), fileTarget(t, "")}
	recs := []*recorder{newRecorder(targets[0].probe), newRecorder(targets[1].probe)}
	w := e.newWorker("A", false, targets, recs, syncer.Options{BatchSize: 20, MoveInterval: -1, PollInterval: 50 * time.Millisecond})
	sinks := []feed.SinkName{"table", "export"}

	for _, late := range []bool{false, true} {
		base := 10000
		if late {
			base = 20000
		}
		var wg sync.WaitGroup
		long := make(chan time.Time, 1)
		var openUntil time.Time
		wg.Go(func() {
			err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
				cs := []feed.Change{e.change(key(base), false), e.change(key(base+1), false)}
				if !late {
					if _, err := e.store.Write(e.ctx, tx, e.feed, cs); err != nil {
						return err
					}
				}
				time.Sleep(3 * time.Second)
				if late {
					if _, err := e.store.Write(e.ctx, tx, e.feed, cs); err != nil {
						return err
					}
				}
				// Open until here: a short commit that returned before this
				// moment landed while the transaction was open. (The time
				// after BeginFunc returns would not do: a short writer
				// waiting on the feed lock gets it at the long commit and
				// may return before this goroutine runs again.)
				openUntil = time.Now()
				return nil
			})
			if err != nil {
				t.Errorf("the long writer: %v", err)
			}
			long <- openUntil
		})
		time.Sleep(200 * time.Millisecond) // the long writer is in
		var shortAt []time.Time
		var mu sync.Mutex
		for g := range 8 {
			wg.Go(func() {
				for i := range 10 {
					if _, err := e.store.WriteCommitted(e.ctx, e.feed, []feed.Change{e.change(key(base+100+g*10+i), false)}); err != nil {
						t.Errorf("writer %d: %v", g, err)
						return
					}
					mu.Lock()
					shortAt = append(shortAt, time.Now())
					mu.Unlock()
					time.Sleep(100 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		longAt := <-long
		before := 0
		for _, at := range shortAt {
			if at.Before(longAt) {
				before++
			}
		}
		t.Logf("%s, late=%v: %d of %d short commits landed while the long transaction was open", mode, late, before, len(shortAt))
		if !late && mode == feed.WriteLocked && before > 0 {
			t.Errorf("early: %d short writers committed before the long one, under the feed lock it held", before)
		}
		if !late && mode == feed.WriteConcurrent && before == 0 {
			t.Errorf("early, concurrent mode: no short writer committed while the long transaction was open; they should not wait for it")
		}
		if late && before == 0 {
			t.Errorf("late: no short writer committed while the long transaction was open; the fault did not happen")
		}
		if mode == feed.WriteConcurrent {
			// The long writer's rows wait for the sealer after it commits:
			// caught up means caught up with them too, or the sinks are
			// compared with a feed that has yet to seal them.
			eventually(t, "sealed", 30*time.Second, func() bool {
				d, err := e.store.Describe(e.ctx, e.feed)
				return err == nil && d.Unsealed == 0
			})
		}
		eventually(t, "caught up", 30*time.Second, e.caughtUp(sinks...))
		e.checkSinks(t, targets...)
	}
	// I3: every seq the feed holds reached each sink in an apply call.
	all := map[feed.Seq]bool{}
	var after feed.Seq
	for {
		b, err := e.store.ReadBatch(e.ctx, e.feed, after, feed.BatchLimit{Records: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range b.Records {
			all[r.Seq] = true
			after = r.Seq
		}
		if !b.More {
			break
		}
	}
	for i, r := range recs {
		r.checkNoRegress(t, targets[i].name)
		sent := map[feed.Seq]bool{}
		for _, c := range r.calls {
			if c.err == nil {
				for _, s := range c.seqs {
					sent[s] = true
				}
			}
		}
		for s := range all {
			if !sent[s] {
				t.Errorf("I3: seq %d is at or below %s's cursor but never reached it", s, targets[i].name)
			}
		}
	}
	w.stop()
	e.checkReleased(t, sinks...)
}
