package syncer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// hourPoll makes a wait that returns prove it was woken: its poll would come
// only an hour later.
var hourPoll = syncer.WaitOptions{PollInterval: time.Hour}

// waitFor runs WaitApplied in the background and hands its answer back.
type waitFor struct {
	done chan struct{}
	res  syncer.WaitResult
	err  error
	at   time.Time // when it returned
}

func startWait(ctx context.Context, store feed.SyncStore, id feed.SinkID, w feed.WriteResult, opts syncer.WaitOptions) *waitFor {
	wf := &waitFor{done: make(chan struct{})}
	go func() {
		defer close(wf.done)
		wf.res, wf.err = syncer.WaitApplied(ctx, store, id, w, opts)
		wf.at = time.Now()
	}()
	return wf
}

func (wf *waitFor) result(t *testing.T, limit time.Duration) (syncer.WaitResult, error) {
	t.Helper()
	select {
	case <-wf.done:
		return wf.res, wf.err
	case <-time.After(limit):
		t.Fatalf("WaitApplied did not return within %v", limit)
		return syncer.WaitResult{}, nil
	}
}

// readSpy counts the cursor reads of a store, so a test knows a waiter has
// read once and is waiting. It keeps the store's CursorWatcher.
type readSpy struct {
	feed.SyncStore
	watcher feed.CursorWatcher
	reads   atomic.Int32
}

func (s *readSpy) ReadCursor(ctx context.Context, id feed.SinkID) (feed.Cursor, error) {
	defer s.reads.Add(1)
	return s.SyncStore.ReadCursor(ctx, id)
}

func (s *readSpy) SubscribeCursors(ctx context.Context, f feed.FeedName) (feed.Subscription, error) {
	return s.watcher.SubscribeCursors(ctx, f)
}

func watched(t *testing.T, s feed.SyncStore) *readSpy {
	w, ok := s.(feed.CursorWatcher)
	if !ok {
		t.Fatalf("%T is not a feed.CursorWatcher", s)
	}
	return &readSpy{SyncStore: s, watcher: w}
}

// moveBy moves id's cursor to next by hand, as a worker in another process
// would, returning when the move landed.
func moveBy(t *testing.T, e *env, store feed.SyncStore, id feed.SinkID, from, next feed.Cursor) {
	t.Helper()
	l, err := store.AcquireLease(e.ctx, id)
	if err != nil {
		t.Fatalf("AcquireLease: %v", err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	if err := store.CASCursor(e.ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Expected: from, Next: next}); err != nil {
		t.Fatalf("CASCursor: %v", err)
	}
}

// watchedSplit is a split store that keeps the store's CursorWatcher.
type watchedSplit struct {
	split
	feed.CursorWatcher
}

// TestWaitApplied: a write waited for on one sink and on every sink of the
// feed comes back applied once each worker moved past it, and the sinks hold
// it by then.
func TestWaitApplied(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		a, b := newWorld(e, "search"), newWorld(e, "cache")
		spyA, spyB := newSpy(e.h.Store), newSpy(e.h.Store)
		start(t, e, e.h.Reader, spyA, []syncer.Target{{ID: a.id, Sink: a.sinkFor("A", spyA)}}, testOptions(t, e))
		start(t, e, e.h.Reader, spyB, []syncer.Target{{ID: b.id, Sink: b.sinkFor("B", spyB)}}, testOptions(t, e))
		e.waitCaughtUp(a.id, b.id) // both registered
		ctx, cancel := context.WithTimeout(e.ctx, e.limit())
		defer cancel()
		for i := range 3 {
			w := e.write(feed.Put(key(i), doc(`{"i":%d}`, i)), feed.Put("other", doc(`{"i":%d}`, i)))
			r, err := syncer.WaitApplied(ctx, e.h.Store, a.id, w, syncer.WaitOptions{})
			if err != nil || r.Outcome != syncer.OutcomeApplied || r.ID != a.id || r.Cursor.Generation != w.Generation || r.Cursor.Seq < w.Last || len(r.Parked) != 0 {
				t.Fatalf("WaitApplied(%v) = %+v, %v; want applied at or past %d", w, r, err, w.Last)
			}
			if _, ok := a.docs()[key(i)]; !ok {
				t.Fatalf("applied, but %s is not in the sink", key(i))
			}
			all, err := syncer.WaitAppliedAll(ctx, e.h.Store, e.feed, w, syncer.WaitOptions{})
			if err != nil || len(all) != 2 || all[0].ID != b.id || all[1].ID != a.id {
				t.Fatalf("WaitAppliedAll = %+v, %v; want cache then search", all, err)
			}
			for _, r := range all {
				if r.Outcome != syncer.OutcomeApplied || r.Cursor.Seq < w.Last {
					t.Fatalf("WaitAppliedAll: %+v; want applied", r)
				}
			}
			if _, ok := b.docs()[key(i)]; !ok {
				t.Fatalf("applied on every sink, but %s is not in the cache", key(i))
			}
		}
		// Nothing to wait for in an empty write.
		if r, err := syncer.WaitApplied(ctx, e.h.Store, a.id, feed.WriteResult{}, syncer.WaitOptions{}); err != nil || r.Outcome != syncer.OutcomeApplied {
			t.Fatalf("WaitApplied of an empty write = %+v, %v; want applied", r, err)
		}
	})
}

// TestWaitAppliedParked: a write one of whose records the sink refuses comes
// back parked, naming that record and the sink's reason, and only it: a
// record parked by an earlier write is not this write's.
func TestWaitAppliedParked(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		w := newWorld(e, "index")
		w.setReject(func(r feed.Record) string {
			if strings.Contains(string(r.Doc), "bad") {
				return "mapping conflict on field bad"
			}
			return ""
		})
		e.write(feed.Put("old", doc(`{"bad":0}`)))
		one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		res := e.write(feed.Put("k1", doc(`{"ok":1}`)), feed.Put("k2", doc(`{"bad":2}`)))
		ctx, cancel := context.WithTimeout(e.ctx, e.limit())
		defer cancel()
		r, err := syncer.WaitApplied(ctx, e.h.Store, w.id, res, syncer.WaitOptions{})
		if err != nil || r.Outcome != syncer.OutcomeParked {
			t.Fatalf("WaitApplied = %+v, %v; want parked", r, err)
		}
		if len(r.Parked) != 1 || r.Parked[0].Key != "k2" || r.Parked[0].Seq != res.Last || r.Parked[0].Reason != "mapping conflict on field bad" {
			t.Fatalf("parked %+v; want only k2 at %d with the sink's reason", r.Parked, res.Last)
		}
		if _, ok := w.docs()["k1"]; !ok {
			t.Fatal("parked, but the accepted k1 is not in the sink")
		}
	})
}

// TestWaitAppliedSuperseded: a write of generation 1 waited for while no
// worker runs; the feed is rebuilt before the sink ever applies it, and once
// the sink publishes generation 2 the wait says superseded.
func TestWaitAppliedSuperseded(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		w := newWorld(e, "index")
		res := e.write(feed.Put("k", doc(`{"g":1}`)))
		ctx, cancel := context.WithTimeout(e.ctx, e.limit())
		defer cancel()
		wf := startWait(ctx, e.h.Store, w.id, res, syncer.WaitOptions{})
		e.rebuild()
		e.write(feed.Put("k", doc(`{"g":2}`)))
		one(t, e, w, "A", testOptions(t, e))
		r, err := wf.result(t, e.limit())
		if err != nil || r.Outcome != syncer.OutcomeSuperseded || r.Cursor.Generation != 2 {
			t.Fatalf("WaitApplied = %+v, %v; want superseded by generation 2", r, err)
		}
	})
}

// TestWaitAppliedDeadline: with no worker, the wait ends at ctx's deadline,
// promptly (its poll is an hour), with ctx's error and the outcome pending.
func TestWaitAppliedDeadline(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		res := e.write(feed.Put("k", doc(`{}`)))
		const deadline = 200 * time.Millisecond
		ctx, cancel := context.WithTimeout(e.ctx, deadline)
		defer cancel()
		began := time.Now()
		r, err := startWait(ctx, e.h.Store, e.id("nobody"), res, hourPoll).result(t, 10*time.Second)
		took := time.Since(began)
		if !errors.Is(err, context.DeadlineExceeded) || r.Outcome != syncer.OutcomePending {
			t.Fatalf("WaitApplied past its deadline = %+v, %v; want pending and context.DeadlineExceeded", r, err)
		}
		if took > deadline+2*time.Second {
			t.Fatalf("WaitApplied returned %v after a %v deadline", took, deadline)
		}
		t.Logf("returned %v after the start, for a %v deadline", took, deadline)
	})
}

// TestWaitAppliedWokenByMove: the waiter reads the cursor once, then sleeps
// with an hour's poll; a cursor move, made by hand as another process's worker
// would, wakes it at once.
func TestWaitAppliedWokenByMove(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		id := e.id("index")
		res := e.write(feed.Put("k", doc(`{}`)))
		spy := watched(t, e.h.Store)
		ctx, cancel := context.WithTimeout(e.ctx, e.limit())
		defer cancel()
		wf := startWait(ctx, spy, id, res, hourPoll)
		e.eventually("the waiter's first read", e.limit(), func() bool { return spy.reads.Load() >= 1 })
		time.Sleep(20 * time.Millisecond) // let it reach its wait
		moveBy(t, e, e.h.Store, id, feed.Cursor{}, feed.Cursor{Generation: res.Generation, Seq: res.Last})
		moved := time.Now()
		r, err := wf.result(t, 10*time.Second)
		if err != nil || r.Outcome != syncer.OutcomeApplied {
			t.Fatalf("WaitApplied = %+v, %v; want applied", r, err)
		}
		if d := wf.at.Sub(moved); d > 2*time.Second {
			t.Fatalf("the waiter returned %v after the move; its poll is an hour, so no wake-up reached it", d)
		} else {
			t.Logf("the waiter returned %v after the move, after %d cursor reads", d, spy.reads.Load())
		}
	})
}

// TestWaitAppliedOtherStore: the waiter runs on a second pgfeed store, with a
// pool and a listener of its own, as a web handler's process beside the
// daemon's; the move made through the first store wakes it.
func TestWaitAppliedOtherStore(t *testing.T) {
	t.Parallel()
	first, _, schema := newPG(t, pgfeed.Options{})
	pool := namedPool(t, "kairos-wait-other")
	second, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	e := &env{t: t, ctx: t.Context(), feed: "other", b: pgBackend}
	id := e.id("index")
	spy := watched(t, second)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	var from feed.Cursor
	for i := range 3 {
		res, err := first.WriteCommitted(e.ctx, e.feed, []feed.Change{feed.Put("k", doc(`{"i":%d}`, i))})
		if err != nil {
			t.Fatal(err)
		}
		reads := spy.reads.Load()
		wf := startWait(ctx, spy, id, res, hourPoll)
		e.eventually("the waiter's first read", time.Minute, func() bool { return spy.reads.Load() > reads })
		time.Sleep(20 * time.Millisecond) // let it reach its wait
		next := feed.Cursor{Generation: res.Generation, Seq: res.Last}
		moveBy(t, e, first, id, from, next)
		moved := time.Now()
		from = next
		r, err := wf.result(t, 10*time.Second)
		if err != nil || r.Outcome != syncer.OutcomeApplied {
			t.Fatalf("wait %d = %+v, %v; want applied", i, r, err)
		}
		d := wf.at.Sub(moved)
		if d > 2*time.Second {
			t.Fatalf("wait %d returned %v after the other store's move; no wake-up reached it", i, d)
		}
		t.Logf("wait %d returned %v after the other store's move", i, d)
	}
}

// TestWaitCaughtUp: a runner over two sinks of one feed and one of another;
// WaitCaughtUp returns once every target applied its feed's head as read at
// the call, each sink then holding every document written before it, and
// names what a sink parked.
func TestWaitCaughtUp(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		a, b := newWorld(e, "search"), newWorld(e, "cache")
		b.setReject(func(r feed.Record) string {
			if r.Key == "refused" {
				return "too big"
			}
			return ""
		})
		spy := newSpy(e.h.Store)
		opts := testOptions(t, e)
		opts.PollInterval = time.Hour
		// The runner's store is a wrapper, which must keep the store's
		// CursorWatcher for WaitCaughtUp to be woken.
		r, err := syncer.NewRunner(watchedSplit{split{e.h.Reader, spy}, watched(t, e.h.Store).watcher},
			[]syncer.Target{{ID: a.id, Sink: a.sinkFor("A", spy)}, {ID: b.id, Sink: b.sinkFor("B", spy)}}, opts)
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(context.WithoutCancel(e.ctx))
		run := &running{r: r, cancel: stop, done: make(chan struct{})}
		go func() { defer close(run.done); _ = r.Run(rctx) }()
		t.Cleanup(run.stop)
		ctx, cancel := context.WithTimeout(e.ctx, e.limit())
		defer cancel()
		for round := range 3 {
			for i := range 250 {
				e.write(feed.Put(key(i), doc(`{"round":%d}`, round)))
			}
			if round == 1 {
				e.write(feed.Put("refused", doc(`{}`)))
			}
			want, batch := e.liveDocs()
			rs, err := run.r.WaitCaughtUp(ctx)
			if err != nil || len(rs) != 2 {
				t.Fatalf("round %d: WaitCaughtUp = %+v, %v (cursors now %v, %v; head %d; states %+v)", round, rs, err, e.cursor(a.id), e.cursor(b.id), batch.Head, run.r.States())
			}
			if rs[0].ID != a.id || rs[0].Outcome != syncer.OutcomeApplied || rs[0].Cursor.Seq < batch.Head {
				t.Fatalf("round %d: search %+v; want applied at or past %d", round, rs[0], batch.Head)
			}
			sameDocs(t, "search once caught up", a.docs(), want)
			if round == 0 {
				if rs[1].Outcome != syncer.OutcomeApplied {
					t.Fatalf("round 0: cache %+v; want applied", rs[1])
				}
				sameDocs(t, "cache once caught up", b.docs(), want)
				continue
			}
			if rs[1].Outcome != syncer.OutcomeParked || len(rs[1].Parked) != 1 || rs[1].Parked[0].Key != "refused" || rs[1].Parked[0].Reason != "too big" {
				t.Fatalf("round %d: cache %+v; want parked, naming the refused key", round, rs[1])
			}
			delete(want, "refused")
			sameDocs(t, "cache once caught up", b.docs(), want)
		}
	})
}

// TestWaitAppliedBadInput: a store, sink, feed, write or poll interval a
// caller got wrong is refused with an error naming it, before any wait.
func TestWaitAppliedBadInput(t *testing.T) {
	e := newEnv(t, memBackend)
	id := e.id("s")
	good := feed.WriteResult{Generation: 1, First: 1, Last: 2}
	// No worker runs: an input let through would wait, so the wait is cut
	// short and fails as not refused.
	ctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
	defer cancel()
	for _, c := range []struct {
		what  string
		store feed.SyncStore
		id    feed.SinkID
		w     feed.WriteResult
		opts  syncer.WaitOptions
		field string
	}{
		{"no store", nil, id, good, syncer.WaitOptions{}, "store"},
		{"a bad sink name", e.h.Store, feed.SinkID{Feed: e.feed, Sink: "a b"}, good, syncer.WaitOptions{}, "sink"},
		{"generation 0", e.h.Store, id, feed.WriteResult{First: 1, Last: 1}, syncer.WaitOptions{}, "write.generation"},
		{"first seq 0", e.h.Store, id, feed.WriteResult{Generation: 1, Last: 3}, syncer.WaitOptions{}, "write.first"},
		{"last below first", e.h.Store, id, feed.WriteResult{Generation: 1, First: 3, Last: 2}, syncer.WaitOptions{}, "write.last"},
		{"a negative poll interval", e.h.Store, id, good, syncer.WaitOptions{PollInterval: -time.Second}, "wait.poll_interval"},
	} {
		_, err := syncer.WaitApplied(ctx, c.store, c.id, c.w, c.opts)
		var inv *feed.InvalidError
		if !errors.As(err, &inv) || !strings.Contains(inv.Field, c.field) {
			t.Errorf("WaitApplied with %s = %v; want an *feed.InvalidError naming %s", c.what, err, c.field)
		}
		_, err = syncer.WaitAppliedAll(ctx, c.store, c.id.Feed, c.w, c.opts)
		if c.field != "sink" && (!errors.As(err, &inv) || !strings.Contains(inv.Field, c.field)) {
			t.Errorf("WaitAppliedAll with %s = %v; want an *feed.InvalidError naming %s", c.what, err, c.field)
		}
	}
}
