package syncer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/syncer"
)

// backend builds the store a scenario runs over. Scenarios take a backend so
// that each runs on memfeed (inside a synctest bubble, fake time) and on any
// other store that implements the contract (in real time).
type backend struct {
	name string
	// synctest: the scenario runs inside testing/synctest, on fake time.
	synctest bool
	new      func(t *testing.T) feedtest.StoreHarness
	// concurrent: the scenario's feeds are in the concurrent write mode,
	// and a scenario's runners seal them (inConcurrentMode).
	concurrent bool
}

// inConcurrentMode is b with every feed its scenarios write moved to the
// concurrent write mode before its first write or rebuild. Nothing but a
// scenario's runner seals them (a Runner runs the store's sealer, through
// split), so a scenario's writes reach its sinks as they would in a daemon.
func inConcurrentMode(b backend) backend {
	inner := b.new
	b.name += "-concurrent"
	b.concurrent = true
	b.new = func(t *testing.T) feedtest.StoreHarness {
		h := inner(t)
		var mu sync.Mutex
		set := map[feed.FeedName]bool{}
		ensure := func(ctx context.Context, f feed.FeedName) error {
			mu.Lock()
			defer mu.Unlock()
			if set[f] {
				return nil
			}
			if err := h.SetMode(ctx, f, feed.WriteConcurrent); err != nil {
				return err
			}
			set[f] = true
			return nil
		}
		write, rebuild := h.Write, h.Rebuild
		h.Write = func(ctx context.Context, f feed.FeedName, changes []feed.Change) (feed.WriteResult, error) {
			if err := ensure(ctx, f); err != nil {
				return feed.WriteResult{}, err
			}
			return write(ctx, f, changes)
		}
		h.Rebuild = func(ctx context.Context, f feed.FeedName) (feed.Generation, error) {
			if err := ensure(ctx, f); err != nil {
				return 0, err
			}
			return rebuild(ctx, f)
		}
		return h
	}
	return b
}

var memBackend = backend{
	name:     "memfeed",
	synctest: true,
	new: func(t *testing.T) feedtest.StoreHarness {
		s, err := memfeed.New(memfeed.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return feedtest.StoreHarness{
			Store:  s,
			Reader: s,
			Write:  s.WriteCommitted,
			Rebuild: func(ctx context.Context, f feed.FeedName) (feed.Generation, error) {
				tx := s.Begin()
				defer tx.Rollback()
				g, err := tx.ResetFeed(ctx, f)
				if err != nil {
					return 0, err
				}
				return g, tx.Commit()
			},
			SetMode: s.SetWriteMode,
			Seal:    s.SealRound,
		}
	},
}

// backends are the stores every scenario runs on; pg_test.go adds Postgres
// when it is there.
var backends = []backend{memBackend}

// concurrentBackends are the backends in the concurrent write mode, which
// forEachBackendBothModes adds to backends; pg_test.go adds Postgres's.
var concurrentBackends = []backend{inConcurrentMode(memBackend)}

// forEachBackend runs scenario once per backend, in a synctest bubble where the
// backend allows it.
func forEachBackend(t *testing.T, scenario func(t *testing.T, e *env)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			if b.synctest {
				synctestRun(t, func(t *testing.T) { scenario(t, newEnv(t, b)) })
				return
			}
			scenario(t, newEnv(t, b))
		})
	}
}

// forEachBackendBothModes is forEachBackend over the backends of both write
// modes. The scenarios that run it write through the store and run their
// workers on a Runner over split, which runs the store's sealer. The others
// run the locked mode only: most wrap the store in a fault or a spy with no
// sealer, or count its calls.
func forEachBackendBothModes(t *testing.T, scenario func(t *testing.T, e *env)) {
	all := backends
	backends = append(slices.Clip(backends), concurrentBackends...)
	defer func() { backends = all }()
	forEachBackend(t, scenario)
}

// forEachConcurrentBackend is forEachBackend over the backends of the
// concurrent write mode alone, for a scenario about unsealed writes.
func forEachConcurrentBackend(t *testing.T, scenario func(t *testing.T, e *env)) {
	all := backends
	backends = slices.Clone(concurrentBackends)
	defer func() { backends = all }()
	forEachBackend(t, scenario)
}

// forEachBackendRealTime runs scenario once per backend in real time, for
// what fake time cannot measure (rates, latencies).
func forEachBackendRealTime(t *testing.T, scenario func(t *testing.T, e *env)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b)
			e.fakeNow = false
			scenario(t, e)
		})
	}
}

// env is one scenario's store, feed and shared sink world.
type env struct {
	t       *testing.T
	ctx     context.Context
	b       backend
	h       feedtest.StoreHarness
	feed    feed.FeedName
	seq     atomic.Int64 // names keys and documents uniquely per env
	fakeNow bool
}

var feedCounter atomic.Int64

func newEnv(t *testing.T, b backend) *env {
	h := b.new(t)
	e := &env{
		t:       t,
		ctx:     t.Context(),
		b:       b,
		h:       h,
		feed:    feed.FeedName(fmt.Sprintf("f%d_%d", time.Now().UnixNano()%1e9, feedCounter.Add(1))),
		fakeNow: b.synctest,
	}
	if b.concurrent {
		// Before any runner starts, so its sealer finds the mode at its
		// first probe (a switch later would wake it too, where the store
		// listens).
		if err := h.SetMode(e.ctx, e.feed, feed.WriteConcurrent); err != nil {
			t.Fatalf("SetMode: %v", err)
		}
	}
	return e
}

func (e *env) id(sink string) feed.SinkID {
	return feed.SinkID{Feed: e.feed, Sink: feed.SinkName(sink)}
}

// write commits changes. In the concurrent mode it also seals them at once
// (rounds until one seals nothing), so a scenario's own writes stand in the
// feed as the locked mode's would when its runner starts or its next step
// looks; writes in sink hooks (hookWrite) are left to the runner's sealer.
func (e *env) write(changes ...feed.Change) feed.WriteResult {
	e.t.Helper()
	res, err := e.h.Write(e.ctx, e.feed, changes)
	if err != nil {
		e.t.Fatalf("write: %v", err)
	}
	if e.b.concurrent && len(res.Unsealed) > 0 {
		for {
			n, err := e.h.Seal(e.ctx, e.feed)
			if err != nil {
				e.t.Fatalf("seal: %v", err)
			}
			if n == 0 {
				break
			}
		}
		// The seqs the write's keys got, as the locked mode's result has
		// them when the keys are in key order (a round's order).
		gen, first, last, sealed, err := e.h.Store.(syncer.SealWaiter).SealedRange(e.ctx, e.feed, res.Unsealed)
		if err != nil || !sealed {
			e.t.Fatalf("SealedRange after sealing: %v, %v", sealed, err)
		}
		res = feed.WriteResult{Generation: gen, First: first, Last: last}
	}
	return res
}

func (e *env) rebuild() feed.Generation {
	e.t.Helper()
	g, err := e.h.Rebuild(e.ctx, e.feed)
	if err != nil {
		e.t.Fatalf("rebuild: %v", err)
	}
	return g
}

// The hook… helpers are write, rebuild and cursor for a sink hook, which runs
// on the worker's goroutine: a Fatalf there would end that goroutine and not
// the test, leaving the runner's shutdown to wait for it until the package
// times out. They report a failure with Errorf instead, which fails the test
// at its end, and let the worker carry on.

func (e *env) hookWrite(changes ...feed.Change) {
	if _, err := e.h.Write(context.WithoutCancel(e.ctx), e.feed, changes); err != nil {
		e.t.Errorf("write in a sink hook: %v", err)
	}
}

func (e *env) hookRebuild() {
	if _, err := e.h.Rebuild(context.WithoutCancel(e.ctx), e.feed); err != nil {
		e.t.Errorf("rebuild in a sink hook: %v", err)
	}
}

func (e *env) hookCursor(id feed.SinkID) feed.Cursor {
	c, err := e.h.Store.ReadCursor(context.WithoutCancel(e.ctx), id)
	if err != nil {
		e.t.Errorf("read cursor in a sink hook: %v", err)
	}
	return c
}

func doc(format string, args ...any) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(format, args...))
}

// liveDocs reads the feed's live documents (tombstones left out).
func (e *env) liveDocs() (map[feed.Key]json.RawMessage, feed.Batch) {
	e.t.Helper()
	docs, last, err := e.readLive()
	if err != nil {
		e.t.Fatalf("read: %v", err)
	}
	return docs, last
}

// readLive is liveDocs returning its error, for a sink hook.
func (e *env) readLive() (map[feed.Key]json.RawMessage, feed.Batch, error) {
	out := map[feed.Key]json.RawMessage{}
	var after feed.Seq
	var last feed.Batch
	for {
		b, err := e.h.Reader.ReadBatch(context.WithoutCancel(e.ctx), e.feed, after, feed.BatchLimit{Records: feed.MaxBatchLimit})
		if err != nil {
			return nil, feed.Batch{}, err
		}
		for _, r := range b.Records {
			if r.Doc != nil {
				out[r.Key] = r.Doc
			} else {
				delete(out, r.Key)
			}
			after = r.Seq
		}
		last = b
		if len(b.Records) < feed.MaxBatchLimit {
			return out, last, nil
		}
	}
}

// readRows reads every row of the feed, tombstones included (doc nil), by
// key, with its seq, for a sink hook.
func (e *env) readRows() (map[feed.Key]entry, error) {
	out := map[feed.Key]entry{}
	var after feed.Seq
	for {
		b, err := e.h.Reader.ReadBatch(context.WithoutCancel(e.ctx), e.feed, after, feed.BatchLimit{Records: feed.MaxBatchLimit})
		if err != nil {
			return nil, err
		}
		for _, r := range b.Records {
			out[r.Key] = entry{seq: r.Seq, doc: r.Doc}
			after = r.Seq
		}
		if len(b.Records) < feed.MaxBatchLimit {
			return out, nil
		}
	}
}

func (e *env) cursor(id feed.SinkID) feed.Cursor {
	e.t.Helper()
	c, err := e.h.Store.ReadCursor(e.ctx, id)
	if err != nil {
		e.t.Fatalf("read cursor: %v", err)
	}
	return c
}

func (e *env) parked(id feed.SinkID) []feed.ParkedRecord {
	e.t.Helper()
	p, err := e.h.Store.ReadParked(e.ctx, id)
	if err != nil {
		e.t.Fatalf("read parked: %v", err)
	}
	return p
}

// caughtUp reports whether the sink's cursor is of the feed's generation and
// nothing of the feed lies after it.
func (e *env) caughtUp(id feed.SinkID) bool {
	c, err := e.h.Store.ReadCursor(e.ctx, id)
	if err != nil || c.IsZero() {
		return false
	}
	if e.b.concurrent {
		// Caught up with what is sealed is not caught up while the sealer
		// has more to seal.
		if d, err := e.h.Store.Describe(e.ctx, e.feed); err != nil || d.Unsealed > 0 {
			return false
		}
	}
	b, err := e.h.Reader.ReadBatch(e.ctx, e.feed, c.Seq, feed.BatchLimit{Records: 1})
	return err == nil && b.Generation == c.Generation && len(b.Records) == 0
}

// eventually polls cond until it holds, failing after limit. Inside a
// synctest bubble the polling sleeps advance fake time only while every
// goroutine is blocked, so limit is in fake time there.
func (e *env) eventually(what string, limit time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// The recording sink.

// world is one external system the sink names: its published copy, its
// resync targets, and a log of every call made to it. Several recSinks (one
// per worker) write to one world, as rival workers write to one real sink.
type world struct {
	e  *env
	id feed.SinkID

	mu         sync.Mutex
	live       map[feed.Key]entry
	gen        feed.Generation
	calls      []call
	violations []string
	// hook runs at the start of every call, outside the lock. An error fails
	// the call with it; it may block (honouring ctx) or panic.
	hook func(ctx context.Context, c *call) error
	// reject refuses a record with the reason it returns, when non-empty.
	reject func(r feed.Record) string
	// checkLease makes every changing call check, against the store, that the
	// caller's holder is the live recorded one.
	checkLease bool
	// begun counts the calls made, to catch a worker that spins.
	begun atomic.Int64
}

// spinCalls is more sink calls than any scenario makes. A worker past it is
// spinning (a bug): each further call then fails the test and sleeps, so that
// a synctest bubble's fake time, which stands still while the worker is never
// blocked, moves on and the scenario's waits time out with their message
// instead of the package timing out.
const spinCalls = 50_000

type entry struct {
	seq feed.Seq
	doc json.RawMessage // nil: deleted
}

// call is one call to a sink, as the recording sink saw it.
type call struct {
	Worker string
	Holder feed.LeaseHolder
	Op     string // apply, open, target-apply, publish, abort
	Gen    feed.Generation
	Seqs   []feed.Seq
	At     time.Time
	// HeldInStore: when the call began, the store named Holder as the live
	// lease holder (only with world.checkLease).
	HeldInStore bool
	Err         error
	Done        time.Time
	target      *recTarget // the target of a target call
}

func newWorld(e *env, sink string) *world {
	return &world{e: e, id: e.id(sink), live: map[feed.Key]entry{}, checkLease: true}
}

// sinkFor returns a sink over w for one worker, which learns its current lease
// holder from spy.
func (w *world) sinkFor(worker string, spy *leaseSpy) *recSink {
	return &recSink{w: w, worker: worker, spy: spy}
}

func (w *world) begin(ctx context.Context, worker string, spy *leaseSpy, op string, gen feed.Generation, recs []feed.Record, target *recTarget) (*call, error) {
	if n := w.begun.Add(1); n > spinCalls {
		if n == spinCalls+1 {
			w.e.t.Errorf("sink %s: more than %d calls; the worker is spinning", w.id, spinCalls)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c := &call{Worker: worker, Op: op, Gen: gen, At: time.Now(), target: target}
	if spy != nil {
		c.Holder = spy.holder(w.id)
	}
	for _, r := range recs {
		c.Seqs = append(c.Seqs, r.Seq)
	}
	if w.checkLease && op != "abort" {
		c.HeldInStore = w.heldInStore(c.Holder)
	}
	var err error
	if h := w.hookFn(); h != nil {
		err = h(ctx, c)
	}
	return c, err
}

func (w *world) hookFn() func(context.Context, *call) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hook
}

func (w *world) setHook(h func(ctx context.Context, c *call) error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hook = h
}

func (w *world) setReject(f func(r feed.Record) string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reject = f
}

func (w *world) end(c *call, err error) {
	c.Err = err
	c.Done = time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, *c)
}

func (w *world) heldInStore(h feed.LeaseHolder) bool {
	if h == "" {
		return false
	}
	d, err := w.e.h.Store.Describe(context.WithoutCancel(w.e.ctx), w.id.Feed)
	if err != nil {
		return false
	}
	for _, s := range d.Sinks {
		if s.Sink == w.id.Sink {
			// An advisory holder has no expiry: it lasts with its session.
			return s.Lease != nil && s.Lease.Holder == h && (s.Lease.ExpiresAt.IsZero() || s.Lease.ExpiresAt.After(time.Now()))
		}
	}
	return false
}

// apply writes records into m unconditionally (a plain upsert, as a sink that
// cannot condition on seq does) and records any key that goes back to an
// older version: the driver's no-regress guarantee, not the sink's, is what
// keeps that from happening.
func (w *world) apply(m map[feed.Key]entry, recs []feed.Record, where string) []feed.Rejection {
	var rej []feed.Rejection
	for _, r := range recs {
		if w.reject != nil {
			if reason := w.reject(r); reason != "" {
				rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: reason})
				continue
			}
		}
		if old, ok := m[r.Key]; ok && old.seq > r.Seq {
			w.violations = append(w.violations, fmt.Sprintf("%s: key %q went back from seq %d to %d", where, r.Key, old.seq, r.Seq))
		}
		m[r.Key] = entry{seq: r.Seq, doc: bytes.Clone(r.Doc)}
	}
	return rej
}

// docs returns the published copy's live documents.
func (w *world) docs() map[feed.Key]json.RawMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[feed.Key]json.RawMessage{}
	for k, v := range w.live {
		if v.doc != nil {
			out[k] = v.doc
		}
	}
	return out
}

func (w *world) generation() feed.Generation {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen
}

func (w *world) log() []call {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.calls)
}

func (w *world) problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.violations)
}

// recSink is one worker's handle on a world. It implements feed.Sink.
type recSink struct {
	w      *world
	worker string
	spy    *leaseSpy
}

func (s *recSink) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	c, err := s.w.begin(ctx, s.worker, s.spy, "apply", 0, recs, nil)
	if err != nil {
		s.w.end(c, err)
		return nil, err
	}
	s.w.mu.Lock()
	rej := s.w.apply(s.w.live, recs, "live")
	s.w.mu.Unlock()
	s.w.end(c, nil)
	return rej, nil
}

func (s *recSink) OpenResync(ctx context.Context, gen feed.Generation) (feed.ResyncTarget, error) {
	c, err := s.w.begin(ctx, s.worker, s.spy, "open", gen, nil, nil)
	s.w.end(c, err)
	if err != nil {
		return nil, err
	}
	return &recTarget{s: s, gen: gen, m: map[feed.Key]entry{}}, nil
}

type recTarget struct {
	s   *recSink
	gen feed.Generation
	mu  sync.Mutex
	m   map[feed.Key]entry // nil once published or aborted
}

func (t *recTarget) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	c, err := t.s.w.begin(ctx, t.s.worker, t.s.spy, "target-apply", t.gen, recs, t)
	if err != nil {
		t.s.w.end(c, err)
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		err := fmt.Errorf("target closed")
		t.s.w.end(c, err)
		return nil, err
	}
	t.s.w.mu.Lock()
	rej := t.s.w.apply(t.m, recs, fmt.Sprintf("target g%d", t.gen))
	t.s.w.mu.Unlock()
	t.s.w.end(c, nil)
	return rej, nil
}

// docs returns the target's live documents, for a hook that checks it.
func (t *recTarget) docs() map[feed.Key]json.RawMessage {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[feed.Key]json.RawMessage{}
	for k, v := range t.m {
		if v.doc != nil {
			out[k] = v.doc
		}
	}
	return out
}

// entries returns the target's entries by key, tombstones included, for a
// hook that checks it.
func (t *recTarget) entries() map[feed.Key]entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.m)
}

func (t *recTarget) Publish(ctx context.Context) error {
	c, err := t.s.w.begin(ctx, t.s.worker, t.s.spy, "publish", t.gen, nil, t)
	if err != nil {
		t.s.w.end(c, err)
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		err := fmt.Errorf("target closed")
		t.s.w.end(c, err)
		return err
	}
	t.s.w.mu.Lock()
	t.s.w.live, t.s.w.gen = t.m, t.gen
	t.s.w.mu.Unlock()
	t.m = nil
	t.s.w.end(c, nil)
	return nil
}

func (t *recTarget) Abort(ctx context.Context) error {
	c, _ := t.s.w.begin(ctx, t.s.worker, t.s.spy, "abort", t.gen, nil, t)
	t.mu.Lock()
	t.m = nil
	t.mu.Unlock()
	t.s.w.end(c, nil)
	return nil
}

// ---------------------------------------------------------------------------
// Store and reader wrappers.

// leaseSpy is a SyncStore that remembers the lease each sink was last given,
// so a recording sink can name its caller's holder and a test can take a lease
// away, and that fails chosen calls with infrastructure faults.
type leaseSpy struct {
	feed.SyncStore
	mu       sync.Mutex
	leases   map[feed.SinkID]feed.Lease
	casFails atomic.Int32 // the next n CASCursor calls fail, landing nothing
	// casLost: the next n CASCursor calls land and then fail, as a commit
	// whose answer the network lost.
	casLost atomic.Int32
	cas     atomic.Int32 // CASCursor calls made
	takes   atomic.Int32 // leases taken
}

func newSpy(s feed.SyncStore) *leaseSpy {
	return &leaseSpy{SyncStore: s, leases: map[feed.SinkID]feed.Lease{}}
}

func (s *leaseSpy) AcquireLease(ctx context.Context, id feed.SinkID) (feed.Lease, error) {
	l, err := s.SyncStore.AcquireLease(ctx, id)
	if err == nil {
		s.takes.Add(1)
		s.mu.Lock()
		s.leases[id] = l
		s.mu.Unlock()
	}
	return l, err
}

func (s *leaseSpy) lease(id feed.SinkID) feed.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leases[id]
}

func (s *leaseSpy) holder(id feed.SinkID) feed.LeaseHolder {
	if l := s.lease(id); l != nil {
		return l.Holder()
	}
	return ""
}

func (s *leaseSpy) CASCursor(ctx context.Context, m feed.CursorMove) error {
	s.cas.Add(1)
	if s.casFails.Add(-1) >= 0 {
		return feed.WriteFailed("moving the cursor", fmt.Errorf("injected fault"))
	}
	s.casFails.Store(0)
	err := s.SyncStore.CASCursor(ctx, m)
	if s.casLost.Add(-1) >= 0 && err == nil {
		return feed.WriteFailed("moving the cursor", fmt.Errorf("injected: the answer was lost"))
	}
	s.casLost.Store(0)
	return err
}

// steal takes the sink's lease away from the worker spy last gave one to, as
// a rival would once it lapsed: it releases the worker's lease and takes it
// for the test, until the test ends or it releases the rival's lease itself.
func (e *env) steal(t *testing.T, spy *leaseSpy, id feed.SinkID) (old, rival feed.Lease) {
	t.Helper()
	old = spy.lease(id)
	if err := old.Release(e.ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	rctx, cancel := context.WithCancel(e.ctx)
	t.Cleanup(cancel)
	rival, err := e.h.Store.AcquireLease(rctx, id)
	if err != nil {
		t.Fatalf("the rival could not take the released lease: %v", err)
	}
	return old, rival
}

// faultyReader fails the next n ReadBatch calls with an infrastructure fault.
type faultyReader struct {
	feed.Reader
	fails atomic.Int32
}

func (r *faultyReader) ReadBatch(ctx context.Context, f feed.FeedName, after feed.Seq, limit feed.BatchLimit) (feed.Batch, error) {
	if r.fails.Add(-1) >= 0 {
		return feed.Batch{}, feed.Unreadable("reading the feed", fmt.Errorf("injected fault"))
	}
	r.fails.Store(0)
	return r.Reader.ReadBatch(ctx, f, after, limit)
}

// ---------------------------------------------------------------------------
// Assertions.

// sameDocs fails t unless got and want hold the same keys with equal JSON.
func sameDocs(t *testing.T, what string, got, want map[feed.Key]json.RawMessage) {
	t.Helper()
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[k]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("missing %q", k))
		case !feedtest.JSONEqual(g, want[k]):
			diffs = append(diffs, fmt.Sprintf("%q is %s, want %s", k, g, want[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("extra %q = %s", k, got[k]))
		}
	}
	if len(diffs) > 0 {
		if len(diffs) > 10 {
			diffs = append(diffs[:10], fmt.Sprintf("… %d more", len(diffs)-10))
		}
		t.Fatalf("%s: %d keys wanted, %d held; differences: %v", what, len(want), len(got), diffs)
	}
}

// noProblems fails t if the world saw a key go back to an older version.
func noProblems(t *testing.T, w *world) {
	t.Helper()
	if p := w.problems(); len(p) > 0 {
		t.Fatalf("%d regressions, first: %v", len(p), p[:min(5, len(p))])
	}
}

// onlyHolders fails t if any changing call was made by a worker that was not
// the live lease holder in the store when the call began.
func onlyHolders(t *testing.T, w *world) {
	t.Helper()
	n := 0
	for _, c := range w.log() {
		if c.Op == "abort" {
			continue
		}
		n++
		if !c.HeldInStore {
			t.Fatalf("call %s by worker %s (holder %q) at %v was made while the store did not name it the live holder", c.Op, c.Worker, c.Holder, c.At)
		}
	}
	if n == 0 {
		t.Fatal("no sink call was made at all")
	}
}
