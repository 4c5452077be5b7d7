package syncer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/syncer"
)

// testOptions are the options a scenario's workers run with: small batches so
// that a few hundred records make several, and, in real time, short waits.
func testOptions(t *testing.T, e *env) syncer.Options {
	o := syncer.Options{
		BatchSize: 100,
		Logger:    slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if !e.fakeNow {
		o.LeaseRetry = 100 * time.Millisecond
		o.BackoffMin = 10 * time.Millisecond
		o.BackoffMax = 200 * time.Millisecond
		o.PollInterval = time.Second
	}
	return o
}

// limit is how long a scenario waits for the workers to get somewhere: fake
// time inside synctest, where it costs nothing, or real time.
func (e *env) limit() time.Duration {
	if e.fakeNow {
		return 10 * time.Minute
	}
	return 60 * time.Second
}

// split is a feed.Store made of a reader and a sync store that may differ:
// the tests wrap the sync store in a spy and leave the reader as it is.
type split struct {
	feed.Reader
	feed.SyncStore
}

// RunSealer runs the reader's sealer when it has one (memfeed and pgfeed
// do), so a Runner over a split seals as one over the store itself.
func (s split) RunSealer(ctx context.Context, f feed.FeedName) error {
	if sl, ok := s.Reader.(syncer.Sealer); ok {
		return sl.RunSealer(ctx, f)
	}
	return nil
}

// SealedRange is the reader's, for a wait on a concurrent-mode write.
func (s split) SealedRange(ctx context.Context, f feed.FeedName, keys []feed.Key) (feed.Generation, feed.Seq, feed.Seq, bool, error) {
	if sw, ok := s.Reader.(syncer.SealWaiter); ok {
		return sw.SealedRange(ctx, f, keys)
	}
	return 0, 0, 0, false, feed.Invalid("store", "has no SealedRange")
}

type running struct {
	r      *syncer.Runner
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs a runner until stop or the end of the test.
func start(t *testing.T, e *env, reader feed.Reader, store feed.SyncStore, targets []syncer.Target, opts syncer.Options) *running {
	t.Helper()
	r, err := syncer.NewRunner(split{reader, store}, targets, opts)
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(e.ctx))
	run := &running{r: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(run.done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(run.stop)
	return run
}

func (r *running) stop() {
	r.cancel()
	<-r.done
}

// one starts a single worker named worker over world w.
func one(t *testing.T, e *env, w *world, worker string, opts syncer.Options) (*running, *leaseSpy) {
	spy := newSpy(e.h.Store)
	return start(t, e, e.h.Reader, spy, []syncer.Target{{ID: w.id, Sink: w.sinkFor(worker, spy)}}, opts), spy
}

func key(i int) feed.Key { return feed.Key(fmt.Sprintf("k%05d", i)) }

func (e *env) waitCaughtUp(ids ...feed.SinkID) {
	e.t.Helper()
	for _, id := range ids {
		e.eventually(id.String()+" caught up", e.limit(), func() bool { return e.caughtUp(id) })
	}
}

func TestInitialResync(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		for i := range 250 {
			e.write(feed.Put(key(i), doc(`{"n":%d}`, i)))
		}
		e.write(feed.Delete(key(3)), feed.Put(key(4), doc(`{"n":"four"}`)))
		w := newWorld(e, "search")
		run, spy := one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)

		want, last := e.liveDocs()
		sameDocs(t, "published copy", w.docs(), want)
		if g := w.generation(); g != feed.FirstGeneration {
			t.Errorf("published generation %d, want 1", g)
		}
		if c, want := e.cursor(w.id), (feed.Cursor{Generation: 1, Seq: last.Head}); c != want {
			t.Errorf("cursor %v, want %v", c, want)
		}
		// The calls: open g1, the rows in ascending seq order in batches of
		// 100, publish; nothing to the live copy before the publish.
		var ops []string
		var seqs []feed.Seq
		for _, c := range w.log() {
			ops = append(ops, c.Op)
			seqs = append(seqs, c.Seqs...)
		}
		if want := []string{"open", "target-apply", "target-apply", "target-apply", "publish"}; !slices.Equal(ops, want) {
			t.Errorf("calls %v, want %v", ops, want)
		}
		if len(seqs) != 250 || !slices.IsSorted(seqs) || seqs[0] < 1 || seqs[249] != last.Head {
			t.Errorf("resync sent %d seqs (sorted %v) ending at %v; want the 250 rows up to %d", len(seqs), slices.IsSorted(seqs), seqs[len(seqs)-1], last.Head)
		}
		noProblems(t, w)
		onlyHolders(t, w)

		e.eventually("idle", e.limit(), func() bool { return run.r.States()[0].Phase == syncer.PhaseIdle })
		st := run.r.States()[0]
		if !st.LeaseHeld || st.Holder != spy.holder(w.id) || st.Holder == "" {
			t.Errorf("state lease %v %q, want held by %q", st.LeaseHeld, st.Holder, spy.holder(w.id))
		}
		if st.Cursor != e.cursor(w.id) || st.RecordsSent != 250 || st.RecordsApplied != 250 || st.Resyncs != 1 || st.Lag != 0 || st.Head != last.Head || st.LastAdvance.IsZero() || st.LastError != nil {
			t.Errorf("state %+v", st)
		}
	})
}

func TestTombstonesDeleteKeys(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		for i := range 10 {
			e.write(feed.Put(key(i), doc(`{"n":%d}`, i)))
		}
		w := newWorld(e, "cache")
		one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		if n := len(w.docs()); n != 10 {
			t.Fatalf("sink holds %d keys after the resync, want 10", n)
		}
		e.write(feed.Delete(key(1)), feed.Delete(key(4)), feed.Delete(key(7)), feed.Put(key(8), doc(`{"n":"eight"}`)))
		e.waitCaughtUp(w.id)
		want, _ := e.liveDocs()
		if len(want) != 7 {
			t.Fatalf("feed has %d live keys, want 7", len(want))
		}
		sameDocs(t, "sink after deletes", w.docs(), want)
		// Every registered sink is past the tombstones: they can go, and the
		// sink stays as it is.
		n, err := e.h.Store.CollectTombstones(e.ctx, e.feed)
		if err != nil || n != 3 {
			t.Fatalf("collected %d, %v; want 3", n, err)
		}
		e.write(feed.Put(key(20), doc(`{"n":20}`)))
		e.waitCaughtUp(w.id)
		want, _ = e.liveDocs()
		sameDocs(t, "sink after collection", w.docs(), want)
		noProblems(t, w)
	})
}

func TestParkUnparkRetry(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		w := newWorld(e, "index")
		bad := func(r feed.Record) string {
			if strings.Contains(string(r.Doc), "bad") {
				return "mapping conflict on field bad"
			}
			return ""
		}
		w.setReject(bad)
		k1 := e.write(feed.Put("k1", doc(`{"ok":1}`)), feed.Put("k2", doc(`{"bad":1}`)), feed.Put("k3", doc(`{"ok":3}`)))
		run, _ := one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		// Refused in the resync: parked, and the cursor moved on.
		p := e.parked(w.id)
		if len(p) != 1 || p[0].Key != "k2" || p[0].Seq != k1.First+1 || p[0].Reason != "mapping conflict on field bad" || p[0].ParkedAt.IsZero() {
			t.Fatalf("parked after the resync %+v, want k2 at %d", p, k1.First+1)
		}
		if _, ok := w.docs()["k2"]; ok {
			t.Fatal("the refused k2 is in the sink")
		}
		// Sent, the three; applied, the two the sink took.
		e.eventually("the resync counted", e.limit(), func() bool { return run.r.States()[0].Resyncs == 1 })
		if st := run.r.States()[0]; st.RecordsSent != 3 || st.RecordsApplied != 2 {
			t.Fatalf("RecordsSent %d, RecordsApplied %d after a resync of 3 records with one refused; want 3 and 2", st.RecordsSent, st.RecordsApplied)
		}

		// Refused in an incremental batch.
		k4 := e.write(feed.Put("k4", doc(`{"bad":4}`)), feed.Put("k5", doc(`{"ok":5}`)))
		e.waitCaughtUp(w.id)
		p = e.parked(w.id)
		if len(p) != 2 || p[1].Key != "k4" || p[1].Seq != k4.First {
			t.Fatalf("parked %+v, want k2 and k4", p)
		}
		if c := e.cursor(w.id); c.Seq != k4.Last {
			t.Fatalf("cursor %v did not move past the parked record to %d", c, k4.Last)
		}
		e.eventually("state shows 2 parked", e.limit(), func() bool { return run.r.States()[0].Parked == 2 })

		// A newer version the sink accepts unparks the key.
		e.write(feed.Put("k2", doc(`{"ok":2}`)))
		e.waitCaughtUp(w.id)
		if p = e.parked(w.id); len(p) != 1 || p[0].Key != "k4" {
			t.Fatalf("parked %+v, want only k4 once k2's newer version was accepted", p)
		}
		if d := w.docs()["k2"]; !feedtest.JSONEqual(d, doc(`{"ok":2}`)) {
			t.Fatalf("k2 in the sink is %s", d)
		}

		// A retried record reaches the sink once the sink takes it.
		w.setReject(nil)
		ok, err := e.h.Store.RetryParked(e.ctx, w.id, "k4")
		if err != nil || !ok {
			t.Fatalf("RetryParked: %v, %v", ok, err)
		}
		e.waitCaughtUp(w.id)
		if p = e.parked(w.id); len(p) != 0 {
			t.Fatalf("parked %+v after the retry, want none", p)
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink after the retry", w.docs(), want)
		e.eventually("state shows 0 parked", e.limit(), func() bool { return run.r.States()[0].Parked == 0 })
		noProblems(t, w)
	})
}

func TestRejectionReasonCleaned(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		raw := "bad\x00byte \xff and " + strings.Repeat("é", feed.MaxReasonLen)
		w := newWorld(e, "index")
		w.setReject(func(feed.Record) string { return raw })
		e.write(feed.Put("a", doc(`{}`)))
		one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		p := e.parked(w.id)
		if len(p) != 1 {
			t.Fatalf("parked %+v, want a", p)
		}
		r := p[0].Reason
		if !utf8.ValidString(r) || strings.ContainsRune(r, 0) || len(r) > feed.MaxReasonLen || !strings.HasPrefix(r, "bad byte \uFFFD and é") {
			t.Fatalf("reason not cleaned: %q (%d bytes)", r[:min(len(r), 40)], len(r))
		}
	})
}

// TestResyncUnderWrites changes the feed while a resync streams it, keys
// behind and ahead of the stream alike, and checks the fresh copy at the
// moment of its publish, before any incremental batch could make up for a
// gap, and before the cursor moved.
//
// In both modes the copy must hold, for every key whose row in the feed is
// at or below the highest seq the copy was sent, or below the head before
// the worker started (all sealed by then, so the stream had to reach it),
// exactly that row's document; and no key the feed has not at a seq as high
// as the copy's. In the locked mode the hook's writes are readable at their
// commit, so the copy must equal the feed's live documents outright, and no
// incremental apply may follow. In the concurrent mode the hook's writes
// wait for the runner's sealer and may be sealed after the stream's last
// read, so they may arrive by incremental applies; once the writes are
// sealed and the worker caught up, the sink equals the feed in both.
//
// The hook runs on the worker's goroutine and only records what it finds; the
// test goroutine reads the record and fails without holding the hook's lock,
// so that a failing check cannot leave the worker waiting for it in a sink
// call and the runner's shutdown waiting for the worker.
func TestResyncUnderWrites(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		for i := range 400 {
			e.write(feed.Put(key(i), doc(`{"v":0}`)))
		}
		_, before := e.liveDocs()
		w := newWorld(e, "search")
		var applies atomic.Int32
		var mu sync.Mutex
		var publishErrs []string
		publishes := 0
		w.setHook(func(ctx context.Context, c *call) error {
			switch c.Op {
			case "target-apply":
				n := int(applies.Add(1))
				if n > 3 {
					return nil
				}
				// After batch n-1 (keys below 100·(n-1) are streamed): update
				// and delete keys behind and ahead, add new ones.
				behind, ahead := (n-1)*100-7, 350+n
				if behind < 0 {
					behind = 5
				}
				e.hookWrite(
					feed.Put(key(behind), doc(`{"v":%d}`, n)),
					feed.Delete(key(behind+1)),
					feed.Put(key(ahead), doc(`{"v":%d}`, n)),
					feed.Delete(key(ahead+10)),
					feed.Put(key(1000+n), doc(`{"new":%d}`, n)),
				)
			case "publish":
				var errs []string
				if cur := e.hookCursor(w.id); !cur.IsZero() {
					errs = append(errs, fmt.Sprintf("the cursor is already %v: it must move only once the copy is published", cur))
				}
				rows, err := e.readRows()
				if err != nil {
					errs = append(errs, fmt.Sprintf("reading the feed: %v", err))
				}
				got := c.target.entries()
				errs = append(errs, copyAgrees(got, rows, before.Head)...)
				if !e.b.concurrent {
					want, _, err := e.readLive()
					if err != nil {
						errs = append(errs, fmt.Sprintf("reading the feed: %v", err))
					}
					live := c.target.docs()
					if len(live) != len(want) {
						errs = append(errs, fmt.Sprintf("the target has %d keys, the feed %d", len(live), len(want)))
					}
					for _, k := range slices.Sorted(maps.Keys(want)) {
						if !feedtest.JSONEqual(live[k], want[k]) {
							errs = append(errs, fmt.Sprintf("%q is %s in the target and %s in the feed", k, live[k], want[k]))
							break
						}
					}
				}
				mu.Lock()
				publishes++
				publishErrs = append(publishErrs, errs...)
				mu.Unlock()
			}
			return nil
		})
		one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		e.eventually("the publish checked", e.limit(), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return publishes > 0
		})
		mu.Lock()
		n, errs := publishes, slices.Clone(publishErrs)
		mu.Unlock()
		if n != 1 || len(errs) > 0 {
			t.Fatalf("%d publishes (want 1); found at publish: %v", n, errs)
		}
		if !e.b.concurrent {
			for _, c := range w.log() {
				if c.Op == "apply" {
					t.Fatalf("an incremental apply followed the resync: the resync's cursor stopped short")
				}
			}
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
		if want[key(1003)] == nil {
			t.Fatalf("the feed lacks the third hook write: the hook did not run as planned")
		}
		noProblems(t, w)
	})
}

// copyAgrees checks a resync copy at its publish (got, by key, tombstones
// included) against the feed's rows then (rows): every row at or below the
// highest seq the copy was sent, or at or below floor (a head the stream
// had to reach), must be in the copy as it is in the feed; a key the copy
// holds live must have a row in the feed at a seq no lower.
func copyAgrees(got, rows map[feed.Key]entry, floor feed.Seq) []string {
	var errs []string
	for _, e := range got {
		floor = max(floor, e.seq)
	}
	for _, k := range slices.Sorted(maps.Keys(rows)) {
		r := rows[k]
		if r.seq > floor {
			continue
		}
		g := got[k]
		if !feedtest.JSONEqual(g.doc, r.doc) || (r.doc != nil && g.seq != r.seq) {
			errs = append(errs, fmt.Sprintf("%q is %s at seq %d in the copy, %s at seq %d in the feed (at or below seq %d, which the copy had to reach)", k, orAbsent(g.doc), g.seq, orAbsent(r.doc), r.seq, floor))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if g := got[k]; g.doc != nil {
			if r, ok := rows[k]; !ok || r.seq < g.seq {
				errs = append(errs, fmt.Sprintf("%q is in the copy at seq %d, in the feed at seq %d (0: absent)", k, g.seq, r.seq))
			}
		}
	}
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Sprintf("… %d more", len(errs)-5))
	}
	return errs
}

func orAbsent(d json.RawMessage) string {
	if d == nil {
		return "absent"
	}
	return string(d)
}

// TestGenerationMoves rebuilds the feed in the middle of a resync's stream and
// again once the worker is caught up: each time the worker resyncs into a
// fresh copy and publishes the new generation.
func TestGenerationMoves(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		for i := range 300 {
			e.write(feed.Put(key(i), doc(`{"g":1}`)))
		}
		w := newWorld(e, "search")
		var applies atomic.Int32
		w.setHook(func(ctx context.Context, c *call) error {
			// On the first of three batches: the second may already be
			// read ahead, of generation 1, but the third is read after
			// this and sees generation 2. (On the second, the last batch
			// could be read ahead before the rebuild and say nothing
			// follows: the copy would then be exact for generation 1 and
			// published, and generation 2 resynced after it.)
			if c.Op == "target-apply" && c.Gen == 1 && applies.Add(1) == 1 {
				e.hookRebuild()
				for i := range 120 {
					e.hookWrite(feed.Put(key(5000+i), doc(`{"g":2}`)))
				}
			}
			return nil
		})
		run, _ := one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		if g := w.generation(); g != 2 {
			t.Fatalf("published generation %d, want 2", g)
		}
		want, _ := e.liveDocs()
		if len(want) != 120 {
			t.Fatalf("feed holds %d docs, want 120", len(want))
		}
		sameDocs(t, "sink after the mid-stream rebuild", w.docs(), want)
		var ops []string
		for _, c := range w.log() {
			ops = append(ops, fmt.Sprintf("%s/g%d", c.Op, c.Gen))
		}
		if !slices.Contains(ops, "abort/g1") || slices.Contains(ops, "publish/g1") || !slices.Contains(ops, "publish/g2") {
			t.Fatalf("calls %v: want the g1 target aborted, never published, and g2 published", ops)
		}

		// Caught up, then rebuilt: the incremental read sees generation 3.
		e.rebuild()
		e.write(feed.Put("only", doc(`{"g":3}`)))
		e.waitCaughtUp(w.id)
		if g, c := w.generation(), e.cursor(w.id); g != 3 || c.Generation != 3 {
			t.Fatalf("published generation %d, cursor %v; want 3", g, c)
		}
		want, _ = e.liveDocs()
		sameDocs(t, "sink after the second rebuild", w.docs(), want)
		e.eventually("two more resyncs counted", e.limit(), func() bool { return run.r.States()[0].Resyncs == 2 })
		noProblems(t, w)
	})
}

// TestWakeUp shows that an idle worker sends a commit on its wake-up, not on
// its poll: the poll interval is an hour, and the commit arrives at once.
func TestWakeUp(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		w := newWorld(e, "cache")
		opts := testOptions(t, e)
		opts.PollInterval = time.Hour
		run, _ := one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		e.eventually("idle", e.limit(), func() bool { return run.r.States()[0].Phase == syncer.PhaseIdle })
		for i := range 3 {
			start := time.Now()
			e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
			e.eventually("the write in the sink", time.Minute, func() bool { _, ok := w.docs()[key(i)]; return ok })
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("commit %d reached the sink after %v", i, d)
			}
		}
	})
}

// TestResyncRefusalSuperseded refuses a key's first version during a resync
// and accepts its newer version, written mid-stream: the key ends in the
// copy and not in the parked list.
func TestResyncRefusalSuperseded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		w := newWorld(e, "index")
		w.setReject(func(r feed.Record) string {
			if strings.Contains(string(r.Doc), "bad") {
				return "bad"
			}
			return ""
		})
		e.write(feed.Put("k0", doc(`{"bad":true}`)))
		for i := range 150 {
			e.write(feed.Put(key(i), doc(`{"i":%d}`, i)))
		}
		var once atomic.Bool
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op == "target-apply" && once.CompareAndSwap(false, true) {
				e.hookWrite(feed.Put("k0", doc(`{"good":true}`)))
			}
			return nil
		})
		one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		if p := e.parked(w.id); len(p) != 0 {
			t.Fatalf("parked %+v: the refused version was superseded by an accepted one", p)
		}
		want, _ := e.liveDocs()
		sameDocs(t, "sink", w.docs(), want)
	})
}

// TestResyncReplacesParked parks a key, then rebuilds the feed without it
// refused: the resync's move replaces the parked list with what the new copy
// refused, so nothing of the old generation stays parked.
func TestResyncReplacesParked(t *testing.T) {
	forEachBackendBothModes(t, func(t *testing.T, e *env) {
		w := newWorld(e, "index")
		w.setReject(func(r feed.Record) string {
			if strings.Contains(string(r.Doc), "bad") {
				return "bad"
			}
			return ""
		})
		e.write(feed.Put("gone", doc(`{"bad":1}`)), feed.Put("fixed", doc(`{"bad":1}`)), feed.Put("ok", doc(`{}`)))
		one(t, e, w, "A", testOptions(t, e))
		e.waitCaughtUp(w.id)
		if p := e.parked(w.id); len(p) != 2 {
			t.Fatalf("parked %+v, want gone and fixed", p)
		}
		e.rebuild()
		e.write(feed.Put("fixed", doc(`{}`)), feed.Put("new", doc(`{"bad":2}`)))
		e.waitCaughtUp(w.id)
		if p := e.parked(w.id); len(p) != 1 || p[0].Key != "new" {
			t.Fatalf("parked after the rebuild's resync %+v, want only new", p)
		}
		want, _ := e.liveDocs()
		delete(want, "new")
		sameDocs(t, "sink", w.docs(), want)
	})
}

// observed records what an Observer heard.
type observed struct {
	mu    sync.Mutex
	calls []string // "op ok" or "op error"
}

func (o *observed) SinkCall(id feed.SinkID, op string, took time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	res := "ok"
	if err != nil {
		res = "error"
	}
	if took < 0 {
		res = "negative"
	}
	o.calls = append(o.calls, op+" "+res)
}

func (o *observed) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.calls)
}

// The Observer hears of every sink call with its operation and outcome: the
// resync's open, applies and publish, then incremental applies, a failing
// one as an error.
func TestObserverHearsEverySinkCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		for i := range 150 {
			e.write(feed.Put(key(i), doc(`{"n":%d}`, i)))
		}
		w := newWorld(e, "search")
		obs := &observed{}
		opts := testOptions(t, e)
		opts.Observer = obs
		var failed atomic.Bool
		w.setHook(func(_ context.Context, c *call) error {
			if c.Op == "apply" && failed.CompareAndSwap(false, true) {
				return fmt.Errorf("target down")
			}
			return nil
		})
		one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		e.write(feed.Put(key(1), doc(`{"n":"one"}`)))
		e.waitCaughtUp(w.id)
		e.eventually("the incremental apply observed", e.limit(), func() bool {
			return slices.Contains(obs.list(), "apply ok")
		})
		got := obs.list()
		want := []string{"open resync ok", "apply resync ok", "apply resync ok", "publish ok", "apply error", "apply ok"}
		if !slices.Equal(got, want) {
			t.Fatalf("observed %v, want %v", got, want)
		}
	})
}
