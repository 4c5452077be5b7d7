package syncer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// catchUpFrom starts one worker over world w with opts, lets it resync a
// one-record feed and go idle, and then writes n records in one commit, so
// that the worker has n/opts.BatchSize full batches to catch up on. It
// returns the runner, its spy, the write and the CASCursor calls made before
// the write.
func catchUpFrom(t *testing.T, e *env, w *world, opts syncer.Options, n int) (*running, *leaseSpy, feed.WriteResult, int32) {
	t.Helper()
	e.write(feed.Put(key(0), doc(`{"i":0}`)))
	run, spy := one(t, e, w, "A", opts)
	e.waitCaughtUp(w.id)
	e.eventually("idle", e.limit(), func() bool { return run.r.States()[0].Phase == syncer.PhaseIdle })
	before := spy.cas.Load()
	changes := make([]feed.Change, n)
	for i := range changes {
		changes[i] = feed.Put(key(i+1), doc(`{"i":%d}`, i+1))
	}
	return run, spy, e.write(changes...), before
}

// catchUpCalls numbers the apply calls of the catch-up catchUpFrom sets off
// (the resync of its first record is not one): next returns the ordinal of
// call c among them, counting from 1, or 0 for any other call.
type catchUpCalls struct{ n atomic.Int32 }

func (k *catchUpCalls) next(c *call) int32 {
	if c.Op != "apply" || c.Seqs[0] == 1 {
		return 0
	}
	return k.n.Add(1)
}

// applied counts, per seq, the apply calls that returned without error and
// carried it.
func applied(w *world) map[feed.Seq]int {
	out := map[feed.Seq]int{}
	for _, c := range w.log() {
		if c.Op == "apply" && c.Err == nil {
			for _, s := range c.Seqs {
				out[s]++
			}
		}
	}
	return out
}

// TestMovesPutOffWhileCatchingUp: a catch-up of ten full batches moves the
// cursor once, at its end, when MoveInterval has not passed; with a negative
// interval it moves after each of the ten. Either way every
// record reaches the sink exactly once and the cursor ends at the head.
func TestMovesPutOffWhileCatchingUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		moves    int32
	}{
		{"interval not passed", time.Hour, 1},
		{"every batch", -1, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				w := newWorld(e, "s")
				opts := testOptions(t, e)
				opts.MoveInterval = tc.interval
				run, spy, res, before := catchUpFrom(t, e, w, opts, 10*opts.BatchSize)
				e.eventually("the cursor at the head", e.limit(), func() bool { return e.cursor(w.id).Seq == res.Last })
				e.eventually("idle", e.limit(), func() bool { return run.r.States()[0].Phase == syncer.PhaseIdle })
				if got := spy.cas.Load() - before; got != tc.moves {
					t.Errorf("the catch-up moved the cursor %d times, want %d", got, tc.moves)
				}
				counts := applied(w)
				for s := res.First; s <= res.Last; s++ {
					if counts[s] != 1 {
						t.Fatalf("seq %d was applied %d times, want once", s, counts[s])
					}
				}
				if st := run.r.States()[0]; st.Cursor != e.cursor(w.id) || st.Lag != 0 {
					t.Errorf("state cursor %v lag %d, want the store's %v and 0", st.Cursor, st.Lag, e.cursor(w.id))
				}
				want, _ := e.liveDocs()
				sameDocs(t, "sink", w.docs(), want)
				noProblems(t, w)
			})
		})
	}
}

// TestPutOffMovesLand: the batches a sink took while their moves were put off
// are not sent again when the worker stops, when the sink fails, or when it
// parks a record: each of those lands the move first.
func TestPutOffMovesLand(t *testing.T) {
	t.Run("on shutdown", func(t *testing.T) {
		forEachBackend(t, func(t *testing.T, e *env) {
			w := newWorld(e, "s")
			opts := testOptions(t, e)
			opts.MoveInterval = time.Hour
			var applies catchUpCalls
			reached := make(chan struct{})
			w.setHook(func(ctx context.Context, c *call) error {
				if applies.next(c) == 5 {
					close(reached)
					<-ctx.Done() // the fifth batch is in flight when the worker stops
					return ctx.Err()
				}
				return nil
			})
			run, _, res, _ := catchUpFrom(t, e, w, opts, 10*opts.BatchSize)
			<-reached
			if c := e.cursor(w.id); c.Seq != res.First-1 {
				t.Fatalf("cursor %v during the catch-up, want it still at %d: moves put off", c, res.First-1)
			}
			run.stop()
			end := res.First + feed.Seq(4*opts.BatchSize) - 1
			if c := e.cursor(w.id); c.Seq != end {
				t.Fatalf("cursor %v after shutdown, want %d: the end of the fourth batch, the last one applied", c, end)
			}
		})
	})

	t.Run("before a backoff", func(t *testing.T) {
		forEachBackend(t, func(t *testing.T, e *env) {
			w := newWorld(e, "s")
			opts := testOptions(t, e)
			opts.MoveInterval = time.Hour
			var applies catchUpCalls
			var atRetry atomic.Int64
			w.setHook(func(ctx context.Context, c *call) error {
				switch applies.next(c) {
				case 5:
					return errors.New("injected sink fault")
				case 6:
					atRetry.Store(int64(e.hookCursor(w.id).Seq))
				}
				return nil
			})
			_, _, res, _ := catchUpFrom(t, e, w, opts, 10*opts.BatchSize)
			e.eventually("the cursor at the head", e.limit(), func() bool { return e.cursor(w.id).Seq == res.Last })
			end := res.First + feed.Seq(4*opts.BatchSize) - 1
			if got := feed.Seq(atRetry.Load()); got != end {
				t.Fatalf("cursor %d when the failed batch was sent again, want %d: the end of the batch before it", got, end)
			}
			counts := applied(w)
			for s := res.First; s <= res.Last; s++ {
				if counts[s] != 1 {
					t.Fatalf("seq %d was applied %d times, want once", s, counts[s])
				}
			}
			noProblems(t, w)
		})
	})

	t.Run("with a park", func(t *testing.T) {
		forEachBackend(t, func(t *testing.T, e *env) {
			w := newWorld(e, "s")
			opts := testOptions(t, e)
			opts.MoveInterval = time.Hour
			refused := key(2*opts.BatchSize + 50) // in the third batch of the catch-up
			w.setReject(func(r feed.Record) string {
				if r.Key == refused {
					return "refused for the test"
				}
				return ""
			})
			var applies catchUpCalls
			var atFourth atomic.Int64
			w.setHook(func(ctx context.Context, c *call) error {
				if applies.next(c) == 4 {
					atFourth.Store(int64(e.hookCursor(w.id).Seq))
				}
				return nil
			})
			_, _, res, _ := catchUpFrom(t, e, w, opts, 10*opts.BatchSize)
			e.eventually("the cursor at the head", e.limit(), func() bool { return e.cursor(w.id).Seq == res.Last })
			end := res.First + feed.Seq(3*opts.BatchSize) - 1
			if got := feed.Seq(atFourth.Load()); got != end {
				t.Fatalf("cursor %d when the batch after the park was sent, want %d: a park moves at once", got, end)
			}
			if p := e.parked(w.id); len(p) != 1 || p[0].Key != refused {
				t.Fatalf("parked %v, want only %q", p, refused)
			}
		})
	})
}

// TestPutOffMovesUnderALostLease: a worker that loses its lease while moves
// are put off cannot land them (the move is fenced), and the next holder
// sends those batches again; nothing regresses and the sink ends right.
func TestPutOffMovesUnderALostLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		opts := testOptions(t, e)
		opts.MoveInterval = time.Hour
		var applies catchUpCalls
		entered, release := make(chan struct{}), make(chan struct{})
		w.setHook(func(ctx context.Context, c *call) error {
			if applies.next(c) == 5 {
				close(entered)
				<-release
			}
			return nil
		})
		run, spy, res, _ := catchUpFrom(t, e, w, opts, 10*opts.BatchSize)
		<-entered
		before := e.cursor(w.id)
		_, rival := e.steal(t, spy, w.id)
		close(release)
		e.eventually("the worker in standby", e.limit(), func() bool {
			st := run.r.States()[0]
			return st.Phase == syncer.PhaseStandby && !st.LeaseHeld
		})
		if c := e.cursor(w.id); c != before {
			t.Fatalf("cursor moved from %v to %v under a lost lease", before, c)
		}
		if err := rival.Release(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.eventually("the cursor at the head", e.limit(), func() bool { return e.cursor(w.id).Seq == res.Last })
		counts := applied(w)
		for s := res.First; s <= res.Last; s++ {
			want := 1
			if s < res.First+feed.Seq(5*opts.BatchSize) {
				want = 2 // applied under the lost lease, sent again by the next
			}
			if counts[s] != want {
				t.Fatalf("seq %d was applied %d times, want %d", s, counts[s], want)
			}
		}
		// The counters: every call's records count as sent; as applied, each
		// record once, when a move that landed covered it (the resync's one
		// record, then the catch-up's, none of the five batches whose moves
		// the lost lease could not land).
		e.eventually("idle", e.limit(), func() bool { return run.r.States()[0].Phase == syncer.PhaseIdle })
		st := run.r.States()[0]
		if want := int64(1 + 15*opts.BatchSize); st.RecordsSent != want {
			t.Errorf("RecordsSent %d, want %d: every record handed to the sink", st.RecordsSent, want)
		}
		if want := int64(1 + 10*opts.BatchSize); st.RecordsApplied != want {
			t.Errorf("RecordsApplied %d, want %d: each record once, when its move landed", st.RecordsApplied, want)
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
		noProblems(t, w)
	})
}
