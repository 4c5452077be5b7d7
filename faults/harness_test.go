package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// env is one test's PostgreSQL schema with the feed's tables, a store that
// writes to it directly (never through a proxy), the audit of every lease
// change, and the recorder every worker of the test reports to.
type env struct {
	t      *testing.T
	ctx    context.Context
	schema string
	direct *pgxpool.Pool
	writer *pgfeed.Store
	feed   feed.FeedName
	rec    *recorder
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := t.Context()
	schema := pgtest.Schema(t)
	direct := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	if _, err := pgfeed.Migrate(ctx, direct, pgfeed.Options{Schema: schema}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	writer, err := pgfeed.New(ctx, direct, pgfeed.Options{Schema: schema, Logger: quiet()})
	if err != nil {
		t.Fatalf("pgfeed.New: %v", err)
	}
	t.Cleanup(writer.Close)
	e := &env{t: t, ctx: ctx, schema: schema, direct: direct, writer: writer, feed: "orders", rec: &recorder{}}
	e.auditLeases()
	return e
}

// quiet is the logger of stores and workers: warnings and errors only, on
// stderr when KAIROS_FAULTS_VERBOSE is set, nowhere otherwise (the faults
// are the point, and each would log).
func quiet() *slog.Logger {
	var w io.Writer = io.Discard
	if os.Getenv("KAIROS_FAULTS_VERBOSE") != "" {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// auditLeases installs a trigger on the cursors table that logs, with the
// database's clock_timestamp(), every change of a row's lease holder and
// every move of its cursor: the ground truth of who held the lease when, and
// of where the cursor went, whatever the workers believed.
func (e *env) auditLeases() {
	q := `"` + e.schema + `"`
	e.exec(`CREATE TABLE ` + q + `.audit (
	id bigserial PRIMARY KEY,
	at timestamptz NOT NULL,
	sink text NOT NULL,
	old_holder text, old_expires timestamptz,
	new_holder text, new_expires timestamptz,
	old_seq bigint, new_seq bigint, old_gen bigint, new_gen bigint)`)
	e.exec(`CREATE FUNCTION ` + q + `.audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO ` + q + `.audit (at, sink, new_holder, new_expires, new_seq, new_gen)
		VALUES (clock_timestamp(), NEW.sink, NEW.lease_holder, NEW.lease_expires_at, NEW.seq, NEW.generation);
	ELSIF NEW.lease_holder IS DISTINCT FROM OLD.lease_holder
	   OR NEW.seq IS DISTINCT FROM OLD.seq OR NEW.generation IS DISTINCT FROM OLD.generation THEN
		INSERT INTO ` + q + `.audit (at, sink, old_holder, old_expires, new_holder, new_expires, old_seq, new_seq, old_gen, new_gen)
		VALUES (clock_timestamp(), NEW.sink, OLD.lease_holder, OLD.lease_expires_at, NEW.lease_holder, NEW.lease_expires_at,
		        OLD.seq, NEW.seq, OLD.generation, NEW.generation);
	END IF;
	RETURN NEW;
END $$`)
	e.exec(`CREATE TRIGGER audit AFTER INSERT OR UPDATE ON ` + q + `.feed_cursors FOR EACH ROW EXECUTE FUNCTION ` + q + `.audit()`)
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.direct.Exec(ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", strings.SplitN(sql, "\n", 2)[0], err)
	}
}

// auditRow is one logged change of a cursor row.
type auditRow struct {
	At                     time.Time
	Sink                   string
	OldHolder, NewHolder   string
	OldExpires, NewExpires *time.Time
	OldSeq, NewSeq         *int64
	OldGen, NewGen         *int64
}

func (e *env) audit() []auditRow {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := e.direct.Query(ctx, `SELECT at, sink, coalesce(old_holder, ''), coalesce(new_holder, ''), old_expires, new_expires, old_seq, new_seq, old_gen, new_gen FROM "`+e.schema+`".audit ORDER BY id`)
	if err != nil {
		e.t.Fatalf("reading the audit: %v", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (auditRow, error) {
		var a auditRow
		err := r.Scan(&a.At, &a.Sink, &a.OldHolder, &a.NewHolder, &a.OldExpires, &a.NewExpires, &a.OldSeq, &a.NewSeq, &a.OldGen, &a.NewGen)
		return a, err
	})
	if err != nil {
		e.t.Fatalf("reading the audit: %v", err)
	}
	return out
}

// checkLeaseAudit asserts, from the database's own log, what a lease-row
// lease promises across every change of holder: a holder replaced only once
// its lease lapsed by the database's clock (or after it cleared itself), and
// no holder taking the lease twice (I5). It returns the takes it saw.
func (e *env) checkLeaseAudit() (takes int) {
	e.t.Helper()
	seen := map[string]bool{}
	for _, a := range e.audit() {
		if a.NewHolder == "" || a.NewHolder == a.OldHolder {
			continue
		}
		takes++
		if seen[a.NewHolder] {
			e.t.Errorf("I5: holder %s took the lease of %s twice", a.NewHolder, a.Sink)
		}
		seen[a.NewHolder] = true
		if a.OldHolder != "" && a.OldExpires != nil && a.OldExpires.After(a.At) {
			e.t.Errorf("two holders: %s took the lease of %s at %s while %s held it until %s (database clock)",
				a.NewHolder, a.Sink, a.At.Format(time.StampMicro), a.OldHolder, a.OldExpires.Format(time.StampMicro))
		}
	}
	return takes
}

// checkCursorAudit asserts that the cursor of sink only ever moved forward
// within a generation, and returns how many moves landed.
func (e *env) checkCursorAudit(sink string) (moves int) {
	e.t.Helper()
	for _, a := range e.audit() {
		if a.Sink != sink || a.NewSeq == nil || (a.OldSeq != nil && *a.OldSeq == *a.NewSeq && eq(a.OldGen, a.NewGen)) {
			continue
		}
		moves++
		if a.OldSeq != nil && eq(a.OldGen, a.NewGen) && *a.NewSeq < *a.OldSeq {
			e.t.Errorf("the cursor of %s went back from %d to %d", sink, *a.OldSeq, *a.NewSeq)
		}
	}
	return moves
}

func eq(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// write commits changes to the feed through the direct store, retrying
// nothing: the writer's path has no fault.
func (e *env) write(changes ...feed.Change) feed.WriteResult {
	e.t.Helper()
	res, err := e.writer.WriteCommitted(e.ctx, e.feed, changes)
	if err != nil {
		e.t.Fatalf("write: %v", err)
	}
	return res
}

func key(i int) feed.Key { return feed.Key(fmt.Sprintf("k%04d", i)) }

func doc(i, v int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"id":%d,"v":%d,"name":"item %d"}`, i, v, i))
}

// liveDocs reads the feed's live documents and its head.
func (e *env) liveDocs() (map[feed.Key]json.RawMessage, feed.Seq) {
	e.t.Helper()
	out := map[feed.Key]json.RawMessage{}
	var after, head feed.Seq
	for {
		b, err := e.writer.ReadBatch(e.ctx, e.feed, after, feed.BatchLimit{Records: 1000})
		if err != nil {
			e.t.Fatalf("reading the feed: %v", err)
		}
		head = b.Head
		for _, r := range b.Records {
			if r.Deleted() {
				delete(out, r.Key)
			} else {
				out[r.Key] = slices.Clone(r.Doc)
			}
			after = r.Seq
		}
		if !b.More {
			return out, head
		}
	}
}

// cursor reads where sink stands, from the database.
func (e *env) cursor(sink string) feed.Cursor {
	e.t.Helper()
	c, err := e.writer.ReadCursor(e.ctx, feed.SinkID{Feed: e.feed, Sink: feed.SinkName(sink)})
	if err != nil {
		e.t.Fatalf("ReadCursor: %v", err)
	}
	return c
}

// eventually polls cond until it holds or limit passes.
func (e *env) eventually(what string, limit time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// caughtUp waits until sink's cursor reaches the feed's head.
func (e *env) caughtUp(sink string, limit time.Duration) {
	e.t.Helper()
	_, head := e.liveDocs()
	e.eventually(fmt.Sprintf("%s to reach seq %d", sink, head), limit, func() bool {
		return e.cursor(sink).Seq >= head
	})
}

// pool opens a pool on the test database through addr (a proxy's), in mode.
func (e *env) pool(addr string, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	e.t.Helper()
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	if addr != "" {
		u.Host = addr
		// In clear, so that a toxic can read the protocol it cuts.
		q := u.Query()
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
	}
	return pgtest.PoolWith(e.t, u.String(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.MaxConns = maxConns
		cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	})
}

// store builds a store over db on the test's schema.
func (e *env) store(db pgfeed.DBTX, opts pgfeed.Options) *pgfeed.Store {
	e.t.Helper()
	opts.Schema = e.schema
	if opts.Logger == nil {
		opts.Logger = quiet()
	}
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	s, err := pgfeed.New(ctx, db, opts)
	if err != nil {
		e.t.Fatalf("pgfeed.New: %v", err)
	}
	e.t.Cleanup(s.Close)
	return s
}

// ---------------------------------------------------------------------------
// What the workers did: takes, sink calls and cursor moves, as they happened.

type recorder struct {
	mu    sync.Mutex
	takes []*takeRec
	calls []*callRec
	moves []*moveRec
}

// takeRec is one lease a worker took: from when it asked to when it got it.
type takeRec struct {
	Worker     string
	Holder     feed.LeaseHolder
	Start, End time.Time
}

// callRec is one sink call that reached the target.
type callRec struct {
	Worker     string
	Holder     feed.LeaseHolder
	Op         string // apply, open, target-apply, publish, abort
	Space      string // which copy of the sink: "live", or a resync target's
	Records    []feed.Record
	Start, End time.Time
	Err        error
	Rejected   int // records the sink refused (the worker parks them)
	ended      bool
}

// moveRec is one cursor move a worker asked for.
type moveRec struct {
	Worker     string
	Holder     feed.LeaseHolder
	Next       feed.Cursor
	Start, End time.Time
	Err        error
}

func (r *recorder) snapshot() ([]takeRec, []callRec, []moveRec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ts []takeRec
	for _, x := range r.takes {
		ts = append(ts, *x)
	}
	var cs []callRec
	for _, x := range r.calls {
		cs = append(cs, *x)
	}
	var ms []moveRec
	for _, x := range r.moves {
		ms = append(ms, *x)
	}
	return ts, cs, ms
}

// spyStore is one worker's store, seen from outside: it records the leases
// the worker takes and the cursor moves it asks for, and knows the lease the
// worker holds now, so the recording sink can name the holder of each call.
type spyStore struct {
	feed.Store
	worker string
	rec    *recorder
	mu     sync.Mutex
	lease  feed.Lease
	// skipEnsureHeld makes the worker's leases answer every EnsureHeld with
	// nil: a worker that never checks its lease, for the bite tests.
	skipEnsureHeld bool
}

func (s *spyStore) AcquireLease(ctx context.Context, id feed.SinkID) (feed.Lease, error) {
	start := time.Now()
	l, err := s.Store.AcquireLease(ctx, id)
	if err != nil {
		return nil, err
	}
	s.rec.mu.Lock()
	s.rec.takes = append(s.rec.takes, &takeRec{Worker: s.worker, Holder: l.Holder(), Start: start, End: time.Now()})
	s.rec.mu.Unlock()
	s.mu.Lock()
	s.lease = l
	s.mu.Unlock()
	if s.skipEnsureHeld {
		return blindLease{l}, nil
	}
	return l, nil
}

// blindLease is a lease whose EnsureHeld always says yes.
type blindLease struct{ feed.Lease }

func (blindLease) EnsureHeld(context.Context) error { return nil }

func (s *spyStore) holder() feed.LeaseHolder {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lease == nil {
		return ""
	}
	return s.lease.Holder()
}

func (s *spyStore) CASCursor(ctx context.Context, m feed.CursorMove) error {
	mr := &moveRec{Worker: s.worker, Holder: m.Holder, Next: m.Next, Start: time.Now()}
	err := s.Store.CASCursor(ctx, m)
	s.rec.mu.Lock()
	mr.End, mr.Err = time.Now(), err
	s.rec.moves = append(s.rec.moves, mr)
	s.rec.mu.Unlock()
	return err
}

// recSink wraps a sink and records every call made to it, with the worker
// and the holder it was made under.
type recSink struct {
	inner   feed.Sink
	spy     *spyStore
	targets *atomic.Int64
}

func (s *recSink) begin(op, space string, recs []feed.Record) *callRec {
	c := &callRec{Worker: s.spy.worker, Holder: s.spy.holder(), Op: op, Space: space, Start: time.Now()}
	for _, r := range recs {
		c.Records = append(c.Records, feed.Record{Key: r.Key, Seq: r.Seq, Doc: slices.Clone(r.Doc)})
	}
	s.spy.rec.mu.Lock()
	s.spy.rec.calls = append(s.spy.rec.calls, c)
	s.spy.rec.mu.Unlock()
	return c
}

func (s *recSink) end(c *callRec, rejected int, err error) {
	s.spy.rec.mu.Lock()
	c.End, c.Err, c.Rejected, c.ended = time.Now(), err, rejected, true
	s.spy.rec.mu.Unlock()
}

func (s *recSink) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	c := s.begin("apply", "live", recs)
	rej, err := s.inner.Apply(ctx, recs)
	s.end(c, len(rej), err)
	return rej, err
}

func (s *recSink) OpenResync(ctx context.Context, gen feed.Generation) (feed.ResyncTarget, error) {
	space := fmt.Sprintf("target%d", s.targets.Add(1))
	c := s.begin("open", space, nil)
	t, err := s.inner.OpenResync(ctx, gen)
	s.end(c, 0, err)
	if err != nil {
		return nil, err
	}
	return &recTarget{inner: t, sink: s, space: space}, nil
}

type recTarget struct {
	inner feed.ResyncTarget
	sink  *recSink
	space string
}

func (t *recTarget) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	c := t.sink.begin("target-apply", t.space, recs)
	rej, err := t.inner.Apply(ctx, recs)
	t.sink.end(c, len(rej), err)
	return rej, err
}

func (t *recTarget) Publish(ctx context.Context) error {
	c := t.sink.begin("publish", t.space, nil)
	err := t.inner.Publish(ctx)
	t.sink.end(c, 0, err)
	return err
}

func (t *recTarget) Abort(ctx context.Context) error {
	c := t.sink.begin("abort", t.space, nil)
	err := t.inner.Abort(ctx)
	t.sink.end(c, 0, err)
	return err
}

// ---------------------------------------------------------------------------
// Workers.

// worker is one syncer worker run by the test, on a store of its own.
type worker struct {
	name   string
	spy    *spyStore
	w      *syncer.Worker
	cancel context.CancelFunc
	done   chan struct{}
}

// testOptions are the workers' options: short waits, so that a lease change
// is seen within a second.
func testOptions() syncer.Options {
	return syncer.Options{
		BatchSize:    100,
		PollInterval: 200 * time.Millisecond,
		BackoffMin:   20 * time.Millisecond,
		BackoffMax:   200 * time.Millisecond,
		LeaseRetry:   100 * time.Millisecond,
		Logger:       quiet(),
	}
}

var sinkTargets atomic.Int64

// startWorker runs a worker named name over store for sink, its calls
// recorded, until the test ends or stop is called.
func (e *env) startWorker(name string, store feed.Store, sinkName string, sink feed.Sink, opts syncer.Options, blind bool) *worker {
	e.t.Helper()
	spy := &spyStore{Store: store, worker: name, rec: e.rec, skipEnsureHeld: blind}
	rs := &recSink{inner: sink, spy: spy, targets: &sinkTargets}
	w, err := syncer.NewWorker(spy, feed.SinkID{Feed: e.feed, Sink: feed.SinkName(sinkName)}, rs, opts)
	if err != nil {
		e.t.Fatalf("NewWorker: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wk := &worker{name: name, spy: spy, w: w, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(wk.done)
		_ = w.Run(ctx)
	}()
	e.t.Cleanup(func() { wk.stop(e.t) })
	return wk
}

// stop ends the worker and waits for it, within a bound.
func (w *worker) stop(t testing.TB) {
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Errorf("worker %s did not stop within 30s of its context ending", w.name)
	}
}

// ---------------------------------------------------------------------------
// The invariants, judged from the recorder.

// checkI4 asserts that after losing its lease a worker starts no new sink
// call, makes at most one stale call per lost lease, and moves no cursor. A
// lease is lost once a rival's take returns; a call of the old holder that
// began before then and ended after the rival asked is the stale one. It
// returns the stale calls, which checkI2 leaves out, and how many leases
// changed hands.
func checkI4(t *testing.T, rec *recorder) (stale map[*callRec]bool, handovers int) {
	t.Helper()
	rec.mu.Lock()
	takes := slices.Clone(rec.takes)
	calls := slices.Clone(rec.calls)
	moves := slices.Clone(rec.moves)
	rec.mu.Unlock()
	sort.Slice(takes, func(i, j int) bool { return takes[i].End.Before(takes[j].End) })
	stale = map[*callRec]bool{}
	for i, old := range takes {
		if i+1 >= len(takes) {
			break
		}
		next := takes[i+1] // the rival that took over from old (or the same worker again)
		handovers++
		n := 0
		rec.mu.Lock()
		for _, c := range calls {
			if c.Holder != old.Holder || c.Op == "abort" {
				continue
			}
			if c.Start.After(next.End) {
				t.Errorf("I4: worker %s began %s at %s under holder %s, after %s took the lease at %s",
					c.Worker, c.Op, c.Start.Format(time.StampMicro), c.Holder, next.Holder, next.End.Format(time.StampMicro))
			}
			if !c.ended || c.End.After(next.Start) {
				n++
				stale[c] = true
			}
		}
		rec.mu.Unlock()
		if n > 1 {
			t.Errorf("I4: %d sink calls of holder %s were under way when %s took the lease; at most one may be", n, old.Holder, next.Holder)
		}
		for _, m := range moves {
			if m.Holder == old.Holder && m.Start.After(next.End) && m.Err == nil {
				t.Errorf("I4: holder %s moved the cursor to %v at %s, after %s took the lease", m.Holder, m.Next, m.Start.Format(time.StampMicro), next.Holder)
			}
		}
	}
	return stale, handovers
}

// checkI2 asserts that no key went back to an older version in the sink:
// every call that reached a copy of the sink, in the order they began,
// carries for each key a seq at or above the last one sent to that copy,
// except the stale calls, which the sink's seq guard must absorb. A publish
// makes the resync target's copy the live one.
func checkI2(t *testing.T, rec *recorder, stale map[*callRec]bool) (records int) {
	t.Helper()
	rec.mu.Lock()
	calls := slices.Clone(rec.calls)
	rec.mu.Unlock()
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].Start.Before(calls[j].Start) })
	spaces := map[string]map[feed.Key]feed.Seq{"live": {}}
	bad := 0
	for _, c := range calls {
		if c.Op == "publish" && c.Err == nil {
			spaces["live"] = maps.Clone(spaces[c.Space])
			continue
		}
		m := spaces[c.Space]
		if m == nil {
			m = map[feed.Key]feed.Seq{}
			spaces[c.Space] = m
		}
		for _, r := range c.Records {
			records++
			if prev := m[r.Key]; r.Seq < prev && !stale[c] {
				bad++
				if bad <= 5 {
					t.Errorf("I2: worker %s (holder %s) sent %s at seq %d to %s after seq %d had been sent", c.Worker, c.Holder, r.Key, r.Seq, c.Space, prev)
				}
			}
			if r.Seq > m[r.Key] {
				m[r.Key] = r.Seq
			}
		}
	}
	if bad > 5 {
		t.Errorf("I2: %d regressions in all", bad)
	}
	return records
}

// sameDocs fails t unless got and want hold the same keys with equal JSON (I1).
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
		t.Fatalf("I1: %s: %d keys wanted, %d held; differences: %v", what, len(want), len(got), diffs)
	}
}

// i3Monitor checks I3 while the workers run: every row at or below the
// cursor that landed was applied to the sink by a call that succeeded (no
// record is parked in these tests). It polls until stopped.
type i3Monitor struct {
	e      *env
	sink   string
	stop   chan struct{}
	done   chan struct{}
	checks atomic.Int64
	mu     sync.Mutex
	errs   []string
}

func (e *env) monitorI3(sink string) *i3Monitor {
	m := &i3Monitor{e: e, sink: sink, stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	e.t.Cleanup(m.finish)
	return m
}

func (m *i3Monitor) run() {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if err := m.check(); err != "" {
			m.mu.Lock()
			m.errs = append(m.errs, err)
			m.mu.Unlock()
		}
	}
}

func (m *i3Monitor) check() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var seq *int64
	q := `"` + m.e.schema + `"`
	if err := m.e.direct.QueryRow(ctx, `SELECT seq FROM `+q+`.feed_cursors WHERE feed = $1 AND sink = $2`, string(m.e.feed), m.sink).Scan(&seq); err != nil || seq == nil {
		return ""
	}
	// What reached the sink by calls that succeeded, as of now: a move lands
	// only after the calls it covers returned, so reading the calls after
	// the cursor sees all of them.
	applied := map[string]map[feed.Key]feed.Seq{"live": {}}
	m.e.rec.mu.Lock()
	calls := slices.Clone(m.e.rec.calls)
	for _, c := range calls {
		if !c.ended || c.Err != nil {
			continue
		}
		if c.Op == "publish" {
			applied["live"] = maps.Clone(applied[c.Space])
			continue
		}
		a := applied[c.Space]
		if a == nil {
			a = map[feed.Key]feed.Seq{}
			applied[c.Space] = a
		}
		for _, r := range c.Records {
			a[r.Key] = max(a[r.Key], r.Seq)
		}
	}
	m.e.rec.mu.Unlock()
	rows, err := m.e.direct.Query(ctx, `SELECT key, seq FROM `+q+`.feed_rows
		WHERE feed = coalesce((SELECT store FROM `+q+`.feed_generations WHERE feed = $1), $1) AND seq <= $2`, string(m.e.feed), *seq)
	if err != nil {
		return ""
	}
	defer rows.Close()
	m.checks.Add(1)
	for rows.Next() {
		var k string
		var s int64
		if rows.Scan(&k, &s) != nil {
			return ""
		}
		if applied["live"][feed.Key(k)] < feed.Seq(s) {
			return fmt.Sprintf("I3: the cursor of %s is at %d but %s at seq %d was never applied (last applied: %d)", m.sink, *seq, k, s, applied["live"][feed.Key(k)])
		}
	}
	return ""
}

// finish stops the monitor and reports what it found.
func (m *i3Monitor) finish() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, err := range m.errs {
		if i == 5 {
			m.e.t.Errorf("… %d more I3 failures", len(m.errs)-5)
			break
		}
		m.e.t.Error(err)
	}
}
