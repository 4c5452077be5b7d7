package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// env is one test's feed: a migrated schema of its own on the shared
// PostgreSQL, a pool, and the store the writer uses. Workers get stores of
// their own (newStore), as separate processes would.
type env struct {
	t      *testing.T
	ctx    context.Context
	url    string // the feed database's
	schema string
	pool   *pgxpool.Pool
	store  *pgfeed.Store
	feed   feed.FeedName
	lease  feed.LeaseOptions

	mu       sync.Mutex
	versions map[feed.Key]int  // the last version written per key, deletes included
	dead     map[feed.Key]bool // keys whose last change was a deletion
	last     map[feed.Key]json.RawMessage
	gen      int // stamped in each document as "g": the rebuilds the test made, plus one
}

// fastLease keeps takeovers within a few seconds.
var fastLease = feed.LeaseOptions{TTL: 2 * time.Second, Heartbeat: 300 * time.Millisecond, Margin: 700 * time.Millisecond}

func newEnv(t *testing.T) *env { return newEnvFor(t, 150*time.Second) }

// newEnvFor is newEnv with every database call of the test bounded by d.
func newEnvFor(t *testing.T, d time.Duration) *env { return newEnvAt(t, pgtest.URL(), d) }

// newEnvAt is newEnvFor on the database at url.
func newEnvAt(t *testing.T, url string, d time.Duration) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	pool := pgtest.Pool(t, url, pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	e := &env{t: t, ctx: ctx, url: url, schema: schema, pool: pool, feed: "orders", lease: fastLease, versions: map[feed.Key]int{}, dead: map[feed.Key]bool{}, last: map[feed.Key]json.RawMessage{}, gen: 1}
	if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	e.store = e.newStore(pool, nil)
	return e
}

// newStore is a store over the env's schema on pool, with advisory leases
// on leases when it is not nil, lease rows otherwise.
func (e *env) newStore(pool *pgxpool.Pool, leases *pgxpool.Pool) *pgfeed.Store {
	e.t.Helper()
	s, err := pgfeed.New(e.ctx, pool, pgfeed.Options{Schema: e.schema, Lease: e.lease, AdvisoryLock: leases, Logger: quiet()})
	if err != nil {
		e.t.Fatalf("pgfeed.New: %v", err)
	}
	e.t.Cleanup(s.Close)
	return s
}

func quiet() *slog.Logger {
	if os.Getenv("KAIROS_FAULTS_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// doc is a key's document at version v, written in the test's generation
// g: every write of a key carries a version one above its last, across
// deletes and rebuilds.
func doc(k feed.Key, v, g int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"k":%q,"v":%d,"g":%d,"pad":"%s"}`, k, v, g, strings.Repeat("x", 40)))
}

func key(i int) feed.Key { return feed.Key(fmt.Sprintf("k%05d", i)) }

// change is the next change of k: a new version, or its deletion.
func (e *env) change(k feed.Key, del bool) feed.Change {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.versions[k]++
	e.dead[k] = del
	if del {
		delete(e.last, k)
		return feed.Delete(k)
	}
	d := doc(k, e.versions[k], e.gen)
	e.last[k] = d
	return feed.Put(k, d)
}

// write commits changes for keys, a delete where del says so.
func (e *env) write(keys []feed.Key, del func(feed.Key) bool) feed.WriteResult {
	e.t.Helper()
	cs := make([]feed.Change, len(keys))
	for i, k := range keys {
		cs[i] = e.change(k, del != nil && del(k))
	}
	res, err := e.store.WriteCommitted(e.ctx, e.feed, cs)
	if err != nil {
		e.t.Fatalf("write: %v", err)
	}
	return res
}

func (e *env) put(from, to int) feed.WriteResult {
	e.t.Helper()
	keys := make([]feed.Key, 0, to-from)
	for i := from; i < to; i++ {
		keys = append(keys, key(i))
	}
	return e.write(keys, nil)
}

// live reads the feed's live documents of its current generation, and its
// head.
func live(ctx context.Context, t testing.TB, r feed.Reader, f feed.FeedName) (map[feed.Key]json.RawMessage, feed.Generation) {
	t.Helper()
	docs := map[feed.Key]json.RawMessage{}
	var after feed.Seq
	var gen feed.Generation
	for {
		b, err := r.ReadBatch(ctx, f, after, feed.BatchLimit{Records: 1000})
		if err != nil {
			t.Fatalf("reading the feed: %v", err)
		}
		if gen != 0 && b.Generation != gen {
			gen, after, docs = 0, 0, map[feed.Key]json.RawMessage{} // a rebuild under the read: again
			continue
		}
		gen = b.Generation
		for _, r := range b.Records {
			if r.Deleted() {
				delete(docs, r.Key)
			} else {
				docs[r.Key] = r.Doc
			}
			after = r.Seq
		}
		if !b.More {
			return docs, gen
		}
	}
}

// sameDocs is I1's comparison: got holds exactly want's keys, each with an
// equal JSON value (a sink may re-encode a document), less the keys parked.
func sameDocs(t testing.TB, what string, got, want map[feed.Key]json.RawMessage, parked map[feed.Key]bool) {
	t.Helper()
	var problems []string
	for k, w := range want {
		if parked[k] {
			continue
		}
		g, ok := got[k]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s missing", k))
			continue
		}
		if !jsonEqual(g, w) {
			problems = append(problems, fmt.Sprintf("%s = %s, want %s", k, g, w))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			problems = append(problems, fmt.Sprintf("%s present, but not live in the feed", k))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > 10 {
			problems = append(problems[:10], fmt.Sprintf("… and %d more", len(problems)-10))
		}
		t.Errorf("I1: %s differs from the feed (%d live keys, sink has %d):\n  %s", what, len(want), len(got), strings.Join(problems, "\n  "))
	}
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// eventually polls ok every 50ms until it holds or within passes.
func eventually(t testing.TB, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// caughtUp reports whether every sink of the feed has its cursor at the
// head of the current generation.
func (e *env) caughtUp(sinks ...feed.SinkName) func() bool {
	return func() bool {
		d, err := e.store.Describe(e.ctx, e.feed)
		if err != nil {
			return false
		}
		at := map[feed.SinkName]feed.Cursor{}
		for _, s := range d.Sinks {
			at[s.Sink] = s.Cursor
		}
		for _, s := range sinks {
			c, ok := at[s]
			if !ok || c.Generation != d.Generation || c.Seq < d.Head {
				return false
			}
		}
		return true
	}
}

// parked is a sink's parked keys.
func (e *env) parked(s feed.SinkName) map[feed.Key]bool {
	e.t.Helper()
	ps, err := e.store.ReadParked(e.ctx, feed.SinkID{Feed: e.feed, Sink: s})
	if err != nil {
		e.t.Fatal(err)
	}
	m := map[feed.Key]bool{}
	for _, p := range ps {
		m[p.Key] = true
	}
	return m
}

// run starts a runner over store for targets and returns a stop that cancels
// it and waits for it to return.
func run(t testing.TB, store feed.Store, targets []syncer.Target, opts syncer.Options) (r *syncer.Runner, stop func()) {
	t.Helper()
	if opts.PollInterval == 0 {
		opts.PollInterval = 200 * time.Millisecond
	}
	if opts.LeaseRetry == 0 {
		opts.LeaseRetry = 200 * time.Millisecond
	}
	if opts.BackoffMin == 0 {
		opts.BackoffMin, opts.BackoffMax = 20*time.Millisecond, 500*time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = quiet()
	}
	r, err := syncer.NewRunner(store, targets, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("a runner still runs 30s after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// checkReleased is I6's database half, once every worker of the feed has
// stopped: no session holds the advisory lock of any of sinks, and no
// cursor row of the feed still names a holder.
func (e *env) checkReleased(t testing.TB, sinks ...feed.SinkName) {
	t.Helper()
	d, err := e.store.Describe(e.ctx, e.feed)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Sinks {
		if s.Lease != nil {
			t.Errorf("I6: sink %s still names holder %s after every worker stopped", s.Sink, s.Lease.Holder)
		}
	}
	keys := make([]int64, len(sinks))
	for i, s := range sinks {
		keys[i] = pgschema.LockKey("kairos/feed", "sink", e.schema, pgfeed.DefaultTablePrefix, string(e.feed), string(s))
	}
	// A lease-row take holds the sink's advisory lock for its transaction;
	// one the stop cut off ends on the server a moment after its worker has
	// returned, so the count has a few seconds to reach 0. A session that
	// kept the lock past that, an advisory lease left behind, fails.
	var held int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if held, err = advisoryHeld(e.ctx, e.pool, keys); err != nil {
			t.Fatal(err)
		}
		if held == 0 || time.Now().After(deadline) {
			break
		}
	}
	if held != 0 {
		t.Errorf("I6: %d sessions still hold a sink's advisory lock 5s after every worker stopped", held)
	}
}

// advisoryHeld counts the granted session advisory locks on keys (a bigint
// key shows in pg_locks as its high and low halves, objsubid 1).
func advisoryHeld(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, keys []int64) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND ((classid::bigint << 32) | objid::bigint) = ANY ($1::bigint[])`, keys).Scan(&n)
	return n, err
}

// holders is the holder each sink's cursor row names now ("" for none).
func (e *env) holders() map[feed.SinkName]feed.LeaseHolder {
	d, err := e.store.Describe(e.ctx, e.feed)
	if err != nil {
		e.t.Errorf("describe: %v", err)
		return nil
	}
	m := map[feed.SinkName]feed.LeaseHolder{}
	for _, s := range d.Sinks {
		if s.Lease != nil {
			m[s.Sink] = s.Lease.Holder
		}
	}
	return m
}

// deleted is the keys whose last change was a deletion.
func (e *env) deleted() map[feed.Key]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := map[feed.Key]bool{}
	for k, d := range e.dead {
		if d {
			m[k] = true
		}
	}
	return m
}

// rebuild moves the feed to a new generation and writes every live key
// again, stamped with it, in one transaction, as an application rebuilding
// a plain table's feed does. Call it from the goroutine that writes.
func (e *env) rebuild() feed.Generation { return e.rebuildKeeping(nil) }

// rebuildKeeping is rebuild where the new generation holds only the live
// keys keep keeps (all when nil): a projection that no longer writes some.
func (e *env) rebuildKeeping(keep func(feed.Key) bool) feed.Generation {
	e.t.Helper()
	var g feed.Generation
	err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		if g, err = e.store.ResetTx(e.ctx, tx, e.feed); err != nil {
			return err
		}
		e.mu.Lock()
		e.gen++
		keys := make([]feed.Key, 0, len(e.last))
		for k := range e.last {
			if keep == nil || keep(k) {
				keys = append(keys, k)
			} else {
				delete(e.last, k)
				e.dead[k] = true
			}
		}
		e.mu.Unlock()
		sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
		for len(keys) > 0 {
			n := min(len(keys), 1000)
			cs := make([]feed.Change, n)
			for i, k := range keys[:n] {
				cs[i] = e.change(k, false)
			}
			if _, err := e.store.Write(e.ctx, tx, e.feed, cs); err != nil {
				return err
			}
			keys = keys[n:]
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("rebuild: %v", err)
	}
	return g
}
