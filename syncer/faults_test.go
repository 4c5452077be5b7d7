package syncer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/syncer"
)

// TestSinkErrorsBackOff fails the sink for five calls: the cursor stays where
// it was through every failure, the waits between attempts grow
// exponentially within their jitter, and the worker then catches up.
func TestSinkErrorsBackOff(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "webhook")
		opts := testOptions(t, e)
		opts.BackoffMin = time.Second
		opts.BackoffMax = time.Minute
		if !e.fakeNow {
			opts.BackoffMin, opts.BackoffMax = 20*time.Millisecond, time.Second
		}
		run, _ := one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		before := e.cursor(w.id)

		var mu sync.Mutex
		var at []time.Time
		var cursors []feed.Cursor
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op != "apply" {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			if len(at) == 5 {
				return nil
			}
			at = append(at, time.Now())
			cur, _ := e.h.Store.ReadCursor(ctx, w.id)
			cursors = append(cursors, cur)
			return fmt.Errorf("503 service unavailable (%d)", len(at))
		})
		for i := range 30 {
			e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
		}
		e.waitCaughtUp(w.id)
		mu.Lock()
		defer mu.Unlock()
		if len(at) != 5 {
			t.Fatalf("%d failed calls, want 5", len(at))
		}
		for i, c := range cursors {
			if c != before {
				t.Errorf("failed call %d saw cursor %v; it must stay at %v", i, c, before)
			}
		}
		for i := 1; i < len(at); i++ {
			nominal := opts.BackoffMin << (i - 1)
			d := at[i].Sub(at[i-1])
			lo, hi := nominal/2, nominal
			if !e.fakeNow {
				hi += 500 * time.Millisecond // scheduling, in real time
			}
			if d < lo || d > hi {
				t.Errorf("wait before attempt %d was %v, want %v to %v", i+1, d, lo, hi)
			}
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink after recovery", w.docs(), want)
		var se *syncer.SinkError
		if err := run.r.States()[0].LastError; !errors.As(err, &se) || se.Op != "apply" || !strings.Contains(err.Error(), "503") {
			t.Errorf("last error %v, want the sink's apply error", err)
		}
		noProblems(t, w)
	})
}

// TestSinkHangCut hangs the sink until its context ends: the worker cuts the
// call at SinkTimeout, backs off, and catches up once the sink answers again.
func TestSinkHangCut(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "slow")
		opts := testOptions(t, e)
		opts.SinkTimeout = 2 * time.Second
		run, _ := one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		before := e.cursor(w.id)

		type cut struct {
			waited time.Duration
			err    error
			cursor feed.Cursor // the store's, as the call is cut
		}
		cuts := make(chan cut, 1)
		var hung atomic.Bool
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op != "apply" || !hung.CompareAndSwap(false, true) {
				return nil
			}
			start := time.Now()
			<-ctx.Done()
			waited := time.Since(start)
			cur, _ := e.h.Store.ReadCursor(context.WithoutCancel(ctx), w.id)
			cuts <- cut{waited, ctx.Err(), cur}
			return ctx.Err()
		})
		e.write(feed.Put("a", doc(`{"a":1}`)))
		var got cut
		select {
		case got = <-cuts:
		case <-time.After(e.limit()):
			t.Fatal("the sink call was never cut")
		}
		if !errors.Is(got.err, context.DeadlineExceeded) {
			t.Fatalf("the sink's context ended with %v, want its deadline", got.err)
		}
		slack := time.Duration(0)
		if !e.fakeNow {
			slack = time.Second // scheduling, in real time on a shared machine
		}
		if got.waited < opts.SinkTimeout-slack || got.waited > opts.SinkTimeout+slack {
			t.Fatalf("the call was cut after %v, want %v", got.waited, opts.SinkTimeout)
		}
		if got.cursor != before {
			t.Fatalf("cursor moved to %v during the hung call", got.cursor)
		}
		e.waitCaughtUp(w.id)
		if d := w.docs()["a"]; !feedtest.JSONEqual(d, doc(`{"a":1}`)) {
			t.Fatalf("a in the sink is %s", d)
		}
		if err := run.r.States()[0].LastError; !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "deadline") {
			t.Fatalf("last error %v, want the cut call", err)
		}
	})
}

// TestSinkPanics panics in the sink twice: the worker survives, reports the
// panic as its last error, and catches up.
func TestSinkPanics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "buggy")
		var panics atomic.Int32
		w.setHook(func(ctx context.Context, c *call) error {
			if (c.Op == "target-apply" || c.Op == "apply") && panics.Add(1) <= 2 {
				panic("nil map in the sink")
			}
			return nil
		})
		e.write(feed.Put("a", doc(`{"a":1}`)))
		run, _ := one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		e.write(feed.Put("b", doc(`{"b":1}`)))
		e.waitCaughtUp(w.id)
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
		if n := panics.Load(); n < 3 {
			t.Fatalf("%d calls reached the hook, want the 2 panics and more", n)
		}
		if err := run.r.States()[0].LastError; err == nil || !strings.Contains(err.Error(), "panic: nil map in the sink") {
			t.Fatalf("last error %v, want the panic", err)
		}
	})
}

// TestStoreFaults fails reads of the feed and cursor moves for a while: the
// worker resends (idempotently), never moves the cursor on a failed move, and
// ends with the feed's documents.
func TestStoreFaults(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "cache")
		spy := newSpy(e.h.Store)
		reader := &faultyReader{Reader: e.h.Reader}
		reader.fails.Store(3)
		spy.casFails.Store(3)
		for i := range 150 {
			e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
		}
		run := start(t, e, reader, spy, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", spy)}}, testOptions(t, e))
		e.waitCaughtUp(w.id)
		for i := range 50 {
			e.write(feed.Delete(key(i)))
		}
		spy.casFails.Store(2)
		reader.fails.Store(2)
		e.waitCaughtUp(w.id)
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
		noProblems(t, w)
		if n := spy.cas.Load(); n < 2+3+2 {
			t.Fatalf("%d cursor moves attempted, want at least the 5 failed and 2 that landed", n)
		}
		publishes := 0
		for _, c := range w.log() {
			if c.Op == "publish" {
				publishes++
			}
		}
		if publishes < 2 {
			t.Fatalf("%d publishes: a resync whose cursor move failed must be made again", publishes)
		}
		if st := run.r.States()[0]; !errors.Is(st.LastError, feed.ErrWriteFailed) && !errors.Is(st.LastError, feed.ErrUnreadable) {
			t.Fatalf("last error %v, want an injected store fault", st.LastError)
		}
	})
}

// TestMoveLandedAnswerLost has a cursor move land and its answer fail, as
// when the network drops a commit's reply: the worker does not trust its own
// view of the cursor after the fault but reads it again, so it neither sends
// the batch again nor loses its lease to a move that expects the old cursor.
func TestMoveLandedAnswerLost(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		e.write(feed.Put("a", doc(`{}`)))
		run, spy := one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		spy.casLost.Store(1)
		e.write(feed.Put("b", doc(`{}`)))
		e.waitCaughtUp(w.id)
		e.write(feed.Put("c", doc(`{}`)))
		e.waitCaughtUp(w.id)
		if n := spy.takes.Load(); n != 1 {
			t.Fatalf("%d leases taken, want 1: a move that landed made the worker's next move expect the old cursor", n)
		}
		if err := run.r.States()[0].LastError; !errors.Is(err, feed.ErrWriteFailed) {
			t.Fatalf("last error %v, want the injected lost answer", err)
		}
		for s, n := range applied(w) {
			if n != 1 {
				t.Fatalf("seq %d was applied %d times, want once: its move had landed", s, n)
			}
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
	})
}

// TestBadRejection has the sink reject a key it was not sent: nothing is
// parked on that guess, the cursor stays, and the worker goes on once the sink
// behaves.
func TestBadRejection(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "liar")
		spy := newSpy(e.h.Store)
		var lies atomic.Int32
		bad := &lyingSink{recSink: w.sinkFor("A", spy), lies: &lies}
		bad.honest.Store(true)
		run := start(t, e, e.h.Reader, spy, []syncer.Target{{ID: w.id, Sink: bad}}, testOptions(t, e))
		e.waitCaughtUp(w.id)
		before := e.cursor(w.id)
		bad.honest.Store(false)
		e.write(feed.Put("real", doc(`{}`)))
		e.eventually("two lies told", e.limit(), func() bool { return lies.Load() >= 2 })
		if c := e.cursor(w.id); c != before {
			t.Fatalf("cursor moved to %v on a batch with a bogus rejection", c)
		}
		if p := e.parked(w.id); len(p) != 0 {
			t.Fatalf("parked %+v on a bogus rejection", p)
		}
		var se *syncer.SinkError
		if err := run.r.States()[0].LastError; !errors.As(err, &se) || !strings.Contains(err.Error(), "not a record of the batch") {
			t.Fatalf("last error %v, want the sink's broken contract", err)
		}
		bad.honest.Store(true)
		e.waitCaughtUp(w.id)
		if _, ok := w.docs()["real"]; !ok {
			t.Fatal("the record never reached the sink")
		}
	})
}

// lyingSink rejects a key it was never sent until it is made honest.
type lyingSink struct {
	*recSink
	lies   *atomic.Int32
	honest atomic.Bool
}

func (s *lyingSink) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	rej, err := s.recSink.Apply(ctx, recs)
	if err == nil && !s.honest.Load() {
		s.lies.Add(1)
		rej = append(rej, feed.Rejection{Key: "never-sent", Seq: 1, Reason: "nope"})
	}
	return rej, err
}

// invalidStore refuses ReadCursor as invalid input while broken is set: a bug
// in the store or the worker, not a passing fault.
type invalidStore struct {
	feed.SyncStore
	broken atomic.Bool
	calls  atomic.Int32
}

func (s *invalidStore) ReadCursor(ctx context.Context, id feed.SinkID) (feed.Cursor, error) {
	if s.broken.Load() {
		s.calls.Add(1)
		return feed.Cursor{}, feed.Invalid("id", "refused on purpose")
	}
	return s.SyncStore.ReadCursor(ctx, id)
}

// levelCounter counts log records at error level.
type levelCounter struct {
	slog.Handler
	errors *atomic.Int32
}

func (h levelCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.errors.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h levelCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return levelCounter{h.Handler.WithAttrs(as), h.errors}
}

// TestStoreSaysInvalid has the store call the worker's input invalid: the
// worker logs it as an error, backs off rather than spinning, and recovers
// once the store does.
func TestStoreSaysInvalid(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		store := &invalidStore{SyncStore: e.h.Store}
		store.broken.Store(true)
		var errorLogs atomic.Int32
		opts := testOptions(t, e)
		opts.BackoffMin, opts.BackoffMax = 100*time.Millisecond, time.Second
		opts.Logger = slog.New(levelCounter{opts.Logger.Handler(), &errorLogs})
		spy := newSpy(store)
		run := start(t, e, e.h.Reader, spy, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", spy)}}, opts)
		began := time.Now()
		e.eventually("three refusals", e.limit(), func() bool { return store.calls.Load() >= 3 })
		time.Sleep(5 * time.Second)
		// Over 5s and more with waits of 50ms, 100ms, … capped at 1s, a
		// worker that backs off asks at most a dozen times; one that spins
		// asks thousands of times.
		elapsed := time.Since(began)
		if n := store.calls.Load(); n > int32(elapsed/(opts.BackoffMax/2))+8 {
			t.Fatalf("%d refused reads in %v: the worker is not backing off", n, elapsed)
		}
		if n := errorLogs.Load(); n < 3 {
			t.Fatalf("%d error-level logs for %d invalid-input refusals", n, store.calls.Load())
		}
		if err := run.r.States()[0].LastError; !errors.Is(err, feed.ErrInvalid) {
			t.Fatalf("last error %v, want the store's refusal", err)
		}
		store.broken.Store(false)
		e.write(feed.Put("a", doc(`{}`)))
		e.waitCaughtUp(w.id)
		if _, ok := w.docs()["a"]; !ok {
			t.Fatal("the worker never recovered")
		}
	})
}

// hollowStore hands out leases that are lost at once.
type hollowStore struct {
	feed.SyncStore
	takes atomic.Int32
}

func (s *hollowStore) AcquireLease(ctx context.Context, id feed.SinkID) (feed.Lease, error) {
	// Past a few hundred takes the worker is spinning; refusing then lets a
	// synctest bubble's time move again, so the test fails rather than hangs.
	if s.takes.Load() > 300 {
		return nil, &feed.LeaseHeldError{ID: id}
	}
	l, err := s.SyncStore.AcquireLease(ctx, id)
	if err != nil {
		return nil, err
	}
	s.takes.Add(1)
	return hollowLease{l}, nil
}

type hollowLease struct{ feed.Lease }

func (l hollowLease) EnsureHeld(context.Context) error {
	return &feed.LeaseLostError{ID: l.ID(), Reason: "hollow on purpose"}
}

// TestLeaseNeverHolds gives the worker leases that are lost before it can
// send: it never calls the sink, and it backs off between takes instead of
// spinning on take and release.
func TestLeaseNeverHolds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		store := &hollowStore{SyncStore: e.h.Store}
		opts := testOptions(t, e)
		opts.BackoffMin, opts.BackoffMax = 100*time.Millisecond, time.Second
		e.write(feed.Put("a", doc(`{}`)))
		run := start(t, e, e.h.Reader, store, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", nil)}}, opts)
		began := time.Now()
		e.eventually("three takes", e.limit(), func() bool { return store.takes.Load() >= 3 })
		time.Sleep(5 * time.Second)
		elapsed := time.Since(began)
		if n := store.takes.Load(); n > int32(elapsed/(opts.BackoffMax/2))+8 {
			t.Fatalf("%d leases taken in %v: the worker is not backing off", n, elapsed)
		}
		if calls := w.log(); len(calls) != 0 {
			t.Fatalf("%d sink calls under leases that never held, first %s", len(calls), calls[0].Op)
		}
		if err := run.r.States()[0].LastError; !errors.Is(err, feed.ErrLeaseLost) {
			t.Fatalf("last error %v, want the lost lease", err)
		}
	})
}

// deafReader cannot subscribe.
type deafReader struct {
	feed.Reader
	tries atomic.Int32
}

func (r *deafReader) Subscribe(context.Context, feed.FeedName) (feed.Subscription, error) {
	r.tries.Add(1)
	return nil, feed.Unreadable("listening for commits", fmt.Errorf("injected fault"))
}

// TestNoWakeUps takes the worker's subscription away: it still sends every
// change, on its poll, and keeps trying to subscribe about once a poll.
func TestNoWakeUps(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		reader := &deafReader{Reader: e.h.Reader}
		opts := testOptions(t, e)
		opts.PollInterval = time.Second
		spy := newSpy(e.h.Store)
		run := start(t, e, reader, spy, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", spy)}}, opts)
		began := time.Now()
		for i := range 5 {
			e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
			e.waitCaughtUp(w.id)
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
		time.Sleep(3 * opts.PollInterval) // at least two more polls, each a chance to subscribe
		elapsed := time.Since(began)
		if n := reader.tries.Load(); n < 3 || n > int32(elapsed/opts.PollInterval)+3 {
			t.Fatalf("%d subscription attempts in %v, want about one a poll", n, elapsed)
		}
		if err := run.r.States()[0].LastError; !errors.Is(err, feed.ErrUnreadable) || !strings.Contains(err.Error(), "subscribing") {
			t.Fatalf("last error %v, want the failed subscription", err)
		}
	})
}

// stuckReader's Subscribe never answers: it blocks until its ctx ends, as a
// wake-up source behind a dead connection does.
type stuckReader struct {
	feed.Reader
	tries atomic.Int32
}

func (r *stuckReader) Subscribe(ctx context.Context, _ feed.FeedName) (feed.Subscription, error) {
	r.tries.Add(1)
	<-ctx.Done()
	return nil, feed.Unreadable("listening for commits", ctx.Err())
}

// TestWakeUpsThatHang: a subscribe that never answers holds the worker up no
// longer than its poll interval: every change still reaches the sink, on the
// poll, and the State shows the wake-ups missing and why.
func TestWakeUpsThatHang(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		reader := &stuckReader{Reader: e.h.Reader}
		opts := testOptions(t, e)
		opts.PollInterval = time.Second
		e.write(feed.Put(key(0), doc(`{"i":0}`)))
		run := start(t, e, reader, e.h.Store, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", nil)}}, opts)
		for i := range 3 {
			e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
			e.eventually("the write in the sink, by polling", 20*opts.PollInterval, func() bool { _, ok := w.docs()[key(i)]; return ok })
		}
		st := run.r.States()[0]
		if st.WakeUps || !errors.Is(st.WakeUpError, feed.ErrUnreadable) || !strings.Contains(st.WakeUpError.Error(), "no answer within") {
			t.Fatalf("State.WakeUps %v, WakeUpError %v; want no wake-ups and the subscribe that did not answer", st.WakeUps, st.WakeUpError)
		}
		e.eventually("another subscribe, a poll later", 20*opts.PollInterval, func() bool { return reader.tries.Load() >= 2 })
	})
}

// retryLater is a sink error that says when to come back, as an HTTP 429's
// Retry-After does.
type retryLater struct{ after time.Duration }

func (e retryLater) Error() string {
	return fmt.Sprintf("429 too many requests; retry after %v", e.after)
}
func (e retryLater) RetryDelay() time.Duration { return e.after }

// TestSinkRetryDelayHonoured: a sink error that asks for a wait
// (feed.RetryDelayer) longer than the worker's whole backoff range is
// honoured, in the bubble's fake time: the next attempt comes no sooner,
// and the worker then catches up.
func TestSinkRetryDelayHonoured(t *testing.T) {
	onMem(t, func(t *testing.T, e *env) {
		w := newWorld(e, "webhook")
		opts := testOptions(t, e)
		opts.BackoffMin, opts.BackoffMax = 100*time.Millisecond, time.Second
		one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		const after = 3 * time.Minute // far past BackoffMax, within waitCaughtUp's bound
		var mu sync.Mutex
		var at []time.Time
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op != "apply" {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Now())
			if len(at) <= 2 {
				return fmt.Errorf("delivery refused: %w", retryLater{after})
			}
			return nil
		})
		e.write(feed.Put(key(1), doc(`{"i":1}`)))
		e.waitCaughtUp(w.id)
		mu.Lock()
		defer mu.Unlock()
		if len(at) != 3 {
			t.Fatalf("%d apply calls, want 2 refused and 1 that landed", len(at))
		}
		for i := 1; i < len(at); i++ {
			if d := at[i].Sub(at[i-1]); d < after {
				t.Errorf("attempt %d came %v after the one before, which asked for %v", i+1, d, after)
			}
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink after the wait", w.docs(), want)
	})
}

// lostReplies loses the answer of the next call of each kind it is armed
// for: the call blocks until its context ends, as one whose reply was lost on
// a connection TCP still thinks alive does in a client that honours its
// context. A lost cursor move lands first: only its answer is lost.
type lostReplies struct {
	feed.Reader
	feed.SyncStore
	batches, cursors, moves atomic.Int32 // replies still to lose
	lost                    atomic.Int32 // replies lost
}

func (s *lostReplies) lose(ctx context.Context, left *atomic.Int32) error {
	if left.Add(-1) < 0 {
		left.Store(0)
		return nil
	}
	s.lost.Add(1)
	<-ctx.Done()
	return feed.Unreadable("the store", ctx.Err())
}

func (s *lostReplies) ReadBatch(ctx context.Context, f feed.FeedName, after feed.Seq, limit feed.BatchLimit) (feed.Batch, error) {
	if err := s.lose(ctx, &s.batches); err != nil {
		return feed.Batch{}, err
	}
	return s.Reader.ReadBatch(ctx, f, after, limit)
}

func (s *lostReplies) ReadCursor(ctx context.Context, id feed.SinkID) (feed.Cursor, error) {
	if err := s.lose(ctx, &s.cursors); err != nil {
		return feed.Cursor{}, err
	}
	return s.SyncStore.ReadCursor(ctx, id)
}

func (s *lostReplies) CASCursor(ctx context.Context, m feed.CursorMove) error {
	if err := s.SyncStore.CASCursor(ctx, m); err != nil {
		return err
	}
	return s.lose(ctx, &s.moves)
}

// TestStoreCallsHaveADeadline loses the reply of a feed read, of a cursor
// read and of a cursor move that landed. Each is cut at Options.StoreTimeout
// and is a fault the worker backs off from and retries, so the worker catches
// up with the feed instead of waiting for ever on an answer that never comes.
func TestStoreCallsHaveADeadline(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		e.write(feed.Put("a", doc(`{}`)))
		spy := newSpy(e.h.Store)
		store := &lostReplies{Reader: e.h.Reader, SyncStore: spy}
		opts := testOptions(t, e)
		opts.StoreTimeout = time.Second
		start(t, e, store, store, []syncer.Target{{ID: w.id, Sink: w.sinkFor("A", spy)}}, opts)
		e.waitCaughtUp(w.id)

		store.batches.Store(1)
		store.cursors.Store(1)
		store.moves.Store(1)
		for i := range 30 {
			e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
		}
		e.eventually("the worker to meet the three lost replies", e.limit(), func() bool { return store.lost.Load() == 3 })
		e.write(feed.Put("b", doc(`{}`)))
		e.waitCaughtUp(w.id)
		want, _ := e.liveDocs()
		sameDocs(t, "sink after the lost replies", w.docs(), want)
		noProblems(t, w)
	})
}
