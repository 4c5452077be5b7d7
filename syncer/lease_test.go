package syncer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

// TestLeaseLostMidBatch takes the lease away while a sink call is in flight
// and gives it to a rival: the call in flight is the last one the worker
// makes under that lease, its cursor move is refused, and the worker sends
// nothing while the rival holds the lease; then it takes the lease again and
// catches up.
func TestLeaseLostMidBatch(t *testing.T) {
	for _, op := range []string{"apply", "target-apply"} {
		t.Run(op, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				w := newWorld(e, "s")
				opts := testOptions(t, e)
				opts.BatchSize = 10
				if op == "target-apply" {
					for i := range 50 {
						e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
					}
				}
				entered, release := make(chan struct{}), make(chan struct{})
				var blocked, lost atomic.Bool
				var oldHolder atomic.Value
				var staleAfter, duringRival atomic.Int32
				var rivalHolds atomic.Bool
				w.setHook(func(ctx context.Context, c *call) error {
					if lost.Load() && c.Holder == oldHolder.Load() && c.Op != "abort" {
						staleAfter.Add(1)
					}
					if rivalHolds.Load() && c.Op != "abort" {
						duringRival.Add(1)
					}
					if c.Op == op && blocked.CompareAndSwap(false, true) {
						close(entered)
						<-release
					}
					return nil
				})
				run, spy := one(t, e, w, "A", opts)
				if op == "apply" {
					e.waitCaughtUp(w.id)
					for i := range 50 {
						e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
					}
				}
				<-entered
				before := e.cursor(w.id)
				oldHolder.Store(spy.holder(w.id))
				lost.Store(true)
				old, rival := e.steal(t, spy, w.id)
				rivalHolds.Store(true)
				close(release)

				e.eventually("the worker in standby", e.limit(), func() bool {
					st := run.r.States()[0]
					return st.Phase == syncer.PhaseStandby && !st.LeaseHeld
				})
				retry := opts.LeaseRetry
				if retry == 0 {
					retry = syncer.DefaultLeaseRetry
				}
				time.Sleep(3 * retry)
				if n := staleAfter.Load(); n != 0 {
					t.Fatalf("%d sink calls under the lost lease after the one in flight", n)
				}
				if n := duringRival.Load(); n != 0 {
					t.Fatalf("%d sink calls while the rival held the lease", n)
				}
				if c := e.cursor(w.id); c != before {
					t.Fatalf("cursor moved from %v to %v under a lost lease", before, c)
				}
				rivalHolds.Store(false)
				if err := rival.Release(e.ctx); err != nil {
					t.Fatal(err)
				}
				e.waitCaughtUp(w.id)
				if h := spy.holder(w.id); h == old.Holder() || h == rival.Holder() {
					t.Fatalf("caught up under holder %q, want a fresh lease", h)
				}
				want, _ := e.liveDocs()
				sameDocs(t, "sink", w.docs(), want)
				noProblems(t, w)
			})
		})
	}
}

// TestRivals runs two runners over the same two sinks while writers change
// the feed, stopping and starting runners so the leases change hands: only
// the live lease holder ever calls a sink, no key goes back to an older
// version, and both sinks end with the feed's live documents.
func TestRivals(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		worlds := []*world{newWorld(e, "s1"), newWorld(e, "s2")}
		opts := testOptions(t, e)
		opts.BatchSize = 25
		runner := func(name string) *running {
			spy := newSpy(e.h.Store)
			var targets []syncer.Target
			for _, w := range worlds {
				targets = append(targets, syncer.Target{ID: w.id, Sink: w.sinkFor(name, spy)})
			}
			return start(t, e, e.h.Reader, spy, targets, opts)
		}
		a, b := runner("A"), runner("B")
		rng := rand.New(rand.NewPCG(1, 2))
		pause := 20 * time.Millisecond
		if e.fakeNow {
			pause = 100 * time.Millisecond
		}
		for i := range 150 {
			var changes []feed.Change
			for range 10 {
				k := key(rng.IntN(200))
				if rng.IntN(5) == 0 {
					changes = append(changes, feed.Delete(k))
				} else {
					changes = append(changes, feed.Put(k, doc(`{"w":%d,"r":%d}`, i, rng.IntN(1000))))
				}
			}
			e.write(changes...)
			switch i {
			case 50:
				a.stop()
			case 100:
				a = runner("A2")
				b.stop()
			}
			time.Sleep(pause)
		}
		for _, w := range worlds {
			e.waitCaughtUp(w.id)
		}
		want, _ := e.liveDocs()
		for _, w := range worlds {
			sameDocs(t, string(w.id.Sink), w.docs(), want)
			noProblems(t, w)
			onlyHolders(t, w)
		}
		senders := map[string]bool{}
		for _, w := range worlds {
			for _, c := range w.log() {
				senders[c.Worker] = true
			}
		}
		if !senders["A2"] || !(senders["A"] || senders["B"]) {
			t.Fatalf("senders %v: the leases never changed hands", senders)
		}
		_ = a
	})
}

// TestShutdownReleasesLeases stops a runner and finds every lease free at
// once: a new runner takes them all without waiting for a lapse.
func TestShutdownReleasesLeases(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		var worlds []*world
		for _, s := range []string{"s1", "s2", "s3"} {
			worlds = append(worlds, newWorld(e, s))
		}
		e.write(feed.Put("a", doc(`{}`)))
		targets := func(name string, spy *leaseSpy) []syncer.Target {
			var ts []syncer.Target
			for _, w := range worlds {
				ts = append(ts, syncer.Target{ID: w.id, Sink: w.sinkFor(name, spy)})
			}
			return ts
		}
		spy := newSpy(e.h.Store)
		run := start(t, e, e.h.Reader, spy, targets("A", spy), testOptions(t, e))
		for _, w := range worlds {
			e.waitCaughtUp(w.id)
		}
		for _, st := range run.r.States() {
			if !st.LeaseHeld {
				t.Fatalf("%v: lease not held while running", st.ID)
			}
		}
		if err := run.r.Run(e.ctx); err == nil {
			t.Fatal("a second Run of a running runner was accepted")
		}
		run.stop()
		d, err := e.h.Store.Describe(e.ctx, e.feed)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Sinks) != 3 {
			t.Fatalf("%d sinks registered, want 3", len(d.Sinks))
		}
		for _, s := range d.Sinks {
			if s.Lease != nil {
				t.Fatalf("sink %s still leased by %q after shutdown", s.Sink, s.Lease.Holder)
			}
		}
		for _, st := range run.r.States() {
			if st.Phase != syncer.PhaseStopped || st.LeaseHeld {
				t.Fatalf("%v after shutdown: %s, lease held %v", st.ID, st.Phase, st.LeaseHeld)
			}
		}
		spy2 := newSpy(e.h.Store)
		run2 := start(t, e, e.h.Reader, spy2, targets("B", spy2), testOptions(t, e))
		// Far below the 30s ttl a lease left behind would take to lapse.
		limit := time.Second
		if !e.fakeNow {
			limit = 10 * time.Second
		}
		e.eventually("every lease taken by the new runner", limit, func() bool {
			for _, st := range run2.r.States() {
				if !st.LeaseHeld {
					return false
				}
			}
			return true
		})
	})
}

// TestLeaseLostBeforePublish takes the lease away while the resync's last
// batch is in the target, after the last EnsureHeld the batches asked: the
// publish is a change to what the sink serves, so the worker must ask again
// before it, find the lease gone, abort the target and never publish it.
// Taking the lease again, it resyncs from the start and publishes.
func TestLeaseLostBeforePublish(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		opts := testOptions(t, e)
		opts.BatchSize = 10
		var res feed.WriteResult
		for i := range 25 {
			res = e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
		}
		entered, release := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op == "target-apply" && slices.Contains(c.Seqs, res.Last) && once.CompareAndSwap(false, true) {
				close(entered)
				<-release
			}
			return nil
		})
		run, spy := one(t, e, w, "A", opts)
		<-entered
		old, rival := e.steal(t, spy, w.id)
		close(release)
		e.eventually("the worker in standby", e.limit(), func() bool {
			st := run.r.States()[0]
			return st.Phase == syncer.PhaseStandby && !st.LeaseHeld
		})
		var aborted bool
		for _, c := range w.log() {
			if c.Holder != old.Holder() {
				continue
			}
			if c.Op == "publish" {
				t.Fatalf("the target was published by holder %q after its lease was lost", c.Holder)
			}
			aborted = aborted || c.Op == "abort"
		}
		if !aborted {
			t.Fatal("the target of the lost lease was not aborted")
		}
		if c := e.cursor(w.id); !c.IsZero() {
			t.Fatalf("cursor %v under a lost lease, want none", c)
		}
		if err := rival.Release(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.waitCaughtUp(w.id)
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
		onlyHolders(t, w)
		noProblems(t, w)
	})
}

// stallingReader blocks the reads after seq stallAfter until release is
// closed, whatever their context says (a store slow to give up), and counts
// the reads in flight.
type stallingReader struct {
	feed.Reader
	stallAfter atomic.Int64 // 0: none
	release    chan struct{}
	stalled    chan struct{} // closed when the first stalled read begins
	once       sync.Once
	inFlight   atomic.Int32
}

func (r *stallingReader) ReadBatch(ctx context.Context, f feed.FeedName, after feed.Seq, limit feed.BatchLimit) (feed.Batch, error) {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	if s := r.stallAfter.Load(); s != 0 && int64(after) == s {
		r.once.Do(func() { close(r.stalled) })
		<-r.release
	}
	return r.Reader.ReadBatch(ctx, f, after, limit)
}

// TestReadAheadEndsWithTheSession loses the lease while the batch after the
// one being sent is read ahead, then stops the runner: Run returns only once
// that read has, so no read of the worker outlives Run.
func TestReadAheadEndsWithTheSession(t *testing.T) {
	onMem(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		opts := testOptions(t, e)
		e.write(feed.Put(key(0), doc(`{}`)))
		reader := &stallingReader{Reader: e.h.Reader, release: make(chan struct{}), stalled: make(chan struct{})}
		spy := newSpy(e.h.Store)
		run := start(t, e, reader, spy, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", spy)}}, opts)
		free := sync.OnceFunc(func() { close(reader.release) })
		t.Cleanup(free) // before the runner's stop: a failing test frees the read first
		e.waitCaughtUp(w.id)
		entered, release := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op == "apply" && once.CompareAndSwap(false, true) {
				close(entered)
				<-release
			}
			return nil
		})
		changes := make([]feed.Change, 3*opts.BatchSize)
		for i := range changes {
			changes[i] = feed.Put(key(i+1), doc(`{}`))
		}
		// The read ahead of the first batch stalls. Its position is set
		// before the write: set after, the worker could read ahead before
		// it, never stall, and leave the test waiting for ever.
		head, err := e.h.Reader.Head(e.ctx, e.feed)
		if err != nil {
			t.Fatal(err)
		}
		reader.stallAfter.Store(int64(head) + int64(opts.BatchSize))
		if res := e.write(changes...); res.First != head+1 {
			t.Fatalf("the write took seqs from %d; the stall was set for a write from %d", res.First, head+1)
		}
		<-entered
		<-reader.stalled
		e.steal(t, spy, w.id)
		close(release)
		stopped := make(chan struct{})
		go func() { run.stop(); close(stopped) }()
		time.Sleep(time.Minute)
		select {
		case <-stopped:
			t.Fatalf("Run returned with %d reads of the feed still in flight", reader.inFlight.Load())
		default:
		}
		free()
		<-stopped
		if n := reader.inFlight.Load(); n != 0 {
			t.Fatalf("%d reads in flight after Run returned", n)
		}
	})
}

// TestShutdownKeepsLeaseUntilCallReturns stops a runner while a sink call is
// in flight and slow to end: the lease stays the worker's until the call has
// returned, so a rival cannot send beside it, and is free right after.
func TestShutdownKeepsLeaseUntilCallReturns(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		entered, release := make(chan struct{}), make(chan struct{})
		free := sync.OnceFunc(func() { close(release) })
		var once atomic.Bool
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op == "apply" && once.CompareAndSwap(false, true) {
				close(entered)
				<-release // a call that ends when it ends, whatever its context says
			}
			return nil
		})
		run, _ := one(t, e, w, "A", testOptions(t, e))
		t.Cleanup(free) // before the runner's stop: a failing test ends the call first
		e.waitCaughtUp(w.id)
		e.write(feed.Put("a", doc(`{}`)))
		<-entered
		stopped := make(chan struct{})
		go func() { run.stop(); close(stopped) }()
		pause := time.Second
		if !e.fakeNow {
			pause = 300 * time.Millisecond
		}
		time.Sleep(pause) // the shutdown has begun
		if l, err := e.h.Store.AcquireLease(e.ctx, w.id); err == nil {
			_ = l.Release(e.ctx)
			t.Fatal("a rival took the lease while the stopping worker's call was in flight")
		} else if !errors.Is(err, feed.ErrLeaseHeld) {
			t.Fatalf("a rival's take: %v, want ErrLeaseHeld", err)
		}
		free()
		<-stopped
		l, err := e.h.Store.AcquireLease(e.ctx, w.id)
		if err != nil {
			t.Fatalf("a rival could not take the lease once the worker stopped: %v", err)
		}
		_ = l.Release(e.ctx)
	})
}
