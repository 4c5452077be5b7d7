package pgfeed_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// concurrentFeed makes f a feed of the concurrent write mode on s.
func concurrentFeed(t *testing.T, s *pgfeed.Store, f feed.FeedName) {
	t.Helper()
	if err := s.SetWriteMode(t.Context(), f, feed.WriteConcurrent); err != nil {
		t.Fatalf("SetWriteMode: %v", err)
	}
}

// sealAll runs rounds until one seals nothing, and returns how many rows
// the rounds sealed.
func sealAll(t *testing.T, s *pgfeed.Store, f feed.FeedName) int {
	t.Helper()
	total := 0
	for {
		n, err := s.SealRound(t.Context(), f)
		if err != nil {
			t.Fatalf("SealRound: %v", err)
		}
		if n == 0 {
			return total
		}
		total += n
	}
}

// feedDocs reads every sealed row of f: key → document (nil: tombstone),
// failing on a key that appears twice.
func feedDocs(t *testing.T, s *pgfeed.Store, f feed.FeedName) map[feed.Key]string {
	t.Helper()
	out := map[feed.Key]string{}
	var after feed.Seq
	for {
		b, err := s.ReadBatch(t.Context(), f, after, feed.BatchLimit{Records: 500})
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		for _, r := range b.Records {
			if _, dup := out[r.Key]; dup {
				t.Fatalf("key %q appears twice in the feed", r.Key)
			}
			out[r.Key] = string(r.Doc)
			after = r.Seq
		}
		if !b.More {
			return out
		}
	}
}

// TestConcurrentModeBasics: a concurrent-mode write is unsealed (no seq, not
// read, counted by describe, shown by trace) until a round seals it; the
// sealed version stays readable while a newer write waits; a delete seals
// as a tombstone; a round that seals nothing moves nothing.
func TestConcurrentModeBasics(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			concurrentBasics(t, setup(t, pgtest.URL(), m.mode))
		})
	}
}

// TestConcurrentModeThroughPgBouncer runs the same through PgBouncer in
// transaction mode, in the two exec modes a transaction pooler allows: the
// sealer's round is a batch, one implicit transaction, which a pooler keeps
// on one server connection.
func TestConcurrentModeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := pgbouncerURL(t)
	for _, m := range modes[1:] {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			concurrentBasics(t, setup(t, url, m.mode))
		})
	}
}

func concurrentBasics(t *testing.T, d db) {
	s := newStore(t, d, pgfeed.Options{})
	ctx := t.Context()
	const f = feed.FeedName("conc")
	concurrentFeed(t, s, f)
	res, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("a", []byte(`{"v":1}`)), feed.Put("b", []byte(`{"v":1}`))})
	if err != nil {
		t.Fatal(err)
	}
	if res.Generation != 1 || res.First != 0 || res.Last != 0 || !slices.Equal(res.Unsealed, []feed.Key{"a", "b"}) {
		t.Fatalf("concurrent write's result = %+v; want generation 1, no seqs, keys a b unsealed", res)
	}
	if b, _ := s.ReadBatch(ctx, f, 0, feed.BatchLimit{Records: 10}); len(b.Records) != 0 || b.Head != 0 {
		t.Fatalf("before sealing: read %v head %d; want nothing, head 0", b.Records, b.Head)
	}
	desc, err := s.Describe(ctx, f)
	if err != nil || desc.Mode != feed.WriteConcurrent || desc.Unsealed != 2 {
		t.Fatalf("Describe = %+v, %v; want mode concurrent, 2 unsealed", desc, err)
	}
	tr, err := s.Trace(ctx, f, "a")
	if err != nil || tr.Found || !tr.Unsealed || string(tr.UnsealedDoc) != `{"v": 1}` {
		t.Fatalf("Trace(a) = %+v, %v; want not found, unsealed {\"v\": 1}", tr, err)
	}
	if n := sealAll(t, s, f); n != 2 {
		t.Fatalf("sealed %d rows; want 2", n)
	}
	if got := feedDocs(t, s, f); len(got) != 2 || got["a"] != `{"v": 1}` {
		t.Fatalf("after sealing: %v", got)
	}
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("a", []byte(`{"v":2}`)), feed.Delete("b"), feed.Delete("c")}); err != nil {
		t.Fatal(err)
	}
	if got := feedDocs(t, s, f); got["a"] != `{"v": 1}` || got["b"] != `{"v": 1}` {
		t.Fatalf("the sealed versions must stay readable while newer writes wait: %v", got)
	}
	tr, _ = s.Trace(ctx, f, "a")
	if !tr.Found || tr.Seq == 0 || !tr.Unsealed || string(tr.UnsealedDoc) != `{"v": 2}` {
		t.Fatalf("Trace(a) = %+v; want the sealed version and the unsealed {\"v\": 2}", tr)
	}
	if n := sealAll(t, s, f); n != 3 {
		t.Fatalf("sealed %d rows; want 3", n)
	}
	got := feedDocs(t, s, f)
	if got["a"] != `{"v": 2}` || got["b"] != "" || got["c"] != "" || len(got) != 3 {
		t.Fatalf("after the second seal: %v; want a {\"v\": 2}, b and c tombstones", got)
	}
	head, _ := s.Head(ctx, f)
	if head != 5 {
		t.Fatalf("head %d; want 5 (two rounds, 2 and 3 rows)", head)
	}
	if n := sealAll(t, s, f); n != 0 {
		t.Fatalf("an idle round sealed %d", n)
	}
	if h, _ := s.Head(ctx, f); h != head {
		t.Fatalf("an idle round moved the head to %d", h)
	}
	desc, _ = s.Describe(ctx, f)
	if desc.Unsealed != 0 {
		t.Fatalf("Describe after sealing: %d unsealed", desc.Unsealed)
	}
}

// TestConcurrentCommitOrder is guarantee 2 in the concurrent mode, under a
// held-open writer: 15 writers commit single-key changes to 60 shared keys,
// each in the same transaction as a row of a plain table, while a 16th holds
// a transaction that wrote three keys (one shared) open for two seconds, and
// two sealing loops run at once (as when the sealer lease changes hands while
// the old holder's round is in flight), each round held open up to 3 ms
// before its commit, beside RunSealer. A reader tails the
// sealed rows all along. No seq may ever appear below one already read; a
// commit made while the slow writer is open must be sealed before it
// commits (a round must not wait for an open writer); and once everything
// is sealed, the feed, and what the reader holds, equal the plain table: the
// last committed value of every key.
func TestConcurrentCommitOrder(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{}) // the reader's and the sealers' pool
	// The writers' own pool, one connection each and some to spare, so
	// that writers blocked on a held key never starve the reader.
	writers := pgtest.PoolWith(t, pgtest.URL(), func(c *pgxpool.Config) { c.MaxConns = 24 })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const f = feed.FeedName("order")
	concurrentFeed(t, s, f)
	app := pgx.Identifier{d.schema, "app"}.Sanitize()
	if _, err := d.pool.Exec(ctx, `CREATE TABLE `+app+` (key text PRIMARY KEY, v bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var counter atomic.Int64
	commit := func(ctx context.Context, keys []string, hold func() error) error {
		return pgx.BeginFunc(ctx, writers, func(tx pgx.Tx) error {
			var changes []feed.Change
			for _, k := range keys {
				v := counter.Add(1)
				if _, err := tx.Exec(ctx, `INSERT INTO `+app+` (key, v) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET v = excluded.v`, k, v); err != nil {
					return err
				}
				changes = append(changes, feed.Put(feed.Key(k), []byte(fmt.Sprintf(`{"v": %d}`, v))))
			}
			if _, err := s.Write(ctx, tx, f, changes); err != nil {
				return err
			}
			if hold != nil {
				return hold()
			}
			return nil
		})
	}

	var wg sync.WaitGroup
	errs := make(chan error, 32)
	run := func(fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil && ctx.Err() == nil {
				errs <- err
			}
		}()
	}
	sealCtx, stopSealing := context.WithCancel(ctx)
	defer stopSealing()
	run(func() error { return s.RunSealer(sealCtx, f) })
	for range 2 {
		run(func() error {
			for sealCtx.Err() == nil {
				if _, err := pgfeed.SealRoundHeld(sealCtx, s, f, time.Duration(rand.N(3000))*time.Microsecond); err != nil && sealCtx.Err() == nil {
					return err
				}
			}
			return nil
		})
	}

	// The writers stop between commits, never inside one: a statement
	// cancelled under it can still commit on the server after the driver
	// has returned, and a commit landing after the final check would
	// change the table under it, unsealed.
	stopping := make(chan struct{})
	var writing sync.WaitGroup
	for w := range 15 {
		writing.Add(1)
		run(func() error {
			defer writing.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-stopping:
					return nil
				default:
				}
				if err := commit(ctx, []string{fmt.Sprintf("k%02d", r.IntN(60))}, nil); err != nil {
					return err
				}
			}
		})
	}
	// The slow writer, and the commit made while it is open.
	probeSealed := make(chan struct{})
	var probeKey atomic.Value
	slowDone := make(chan error, 1)
	gens := pgx.Identifier{d.schema, "feed_generations"}.Sanitize()
	go func() {
		time.Sleep(300 * time.Millisecond)
		// Rounds are held off (the feed lock, as a round takes it) while
		// "held" commits, so that it is still unsealed when the slow writer
		// rewrites it: a round then finds a visible unsealed row that an
		// open writer holds.
		blocker, err := writers.Begin(ctx)
		if err != nil {
			slowDone <- err
			return
		}
		defer func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := blocker.Exec(ctx, `SELECT 1 FROM `+gens+` WHERE feed = $1 FOR NO KEY UPDATE`, string(f)); err != nil {
			slowDone <- err
			return
		}
		if err := commit(ctx, []string{"held"}, nil); err != nil {
			slowDone <- err
			return
		}
		slowDone <- commit(ctx, []string{"slow-a", "held", "k07", "slow-b"}, func() error {
			if err := blocker.Rollback(ctx); err != nil {
				return err
			}
			if err := commit(ctx, []string{"probe"}, nil); err != nil {
				return err
			}
			probeKey.Store(true)
			select {
			case <-probeSealed:
			case <-time.After(10 * time.Second):
				return errors.New("a commit made while the slow writer was open was not sealed before it committed: a round waits for open writers")
			}
			time.Sleep(2 * time.Second) // the slow writer's rows stay locked, unsealed
			return nil
		})
	}()

	seen := map[feed.Key]string{}
	seenSeq := map[feed.Seq]bool{}
	var last feed.Seq
	read := func() {
		// Rows below the reader move away (a key sealed again leaves its
		// old seq) but must never appear: a window below the reader's
		// place is read again, and any seq in it the reader never saw is a
		// row that became visible below one it had read.
		below, err := s.ReadBatch(ctx, f, max(0, last-200), feed.BatchLimit{Records: 200})
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		for _, r := range below.Records {
			if r.Seq <= last && !seenSeq[r.Seq] {
				t.Fatalf("seq %d (key %s) appeared below seq %d, which the reader had read", r.Seq, r.Key, last)
			}
		}
		b, err := s.ReadBatch(ctx, f, last, feed.BatchLimit{Records: 50})
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		for _, r := range b.Records {
			if r.Seq <= last {
				t.Fatalf("the reader at seq %d was handed seq %d: a row appeared below one already read", last, r.Seq)
			}
			last = r.Seq
			seenSeq[r.Seq] = true
			seen[r.Key] = string(r.Doc)
			if r.Key == "probe" && probeKey.Load() != nil {
				select {
				case <-probeSealed:
				default:
					close(probeSealed)
				}
			}
		}
	}
	var slowErr error
	slowFinished := false
	for !slowFinished {
		select {
		case err := <-errs:
			t.Fatalf("writer or sealer: %v", err)
		case slowErr = <-slowDone:
			slowFinished = true
		default:
			read()
			time.Sleep(time.Millisecond)
		}
	}
	if slowErr != nil {
		t.Fatalf("slow writer: %v", slowErr)
	}
	// A little more traffic after the slow commit, then quiet.
	time.Sleep(300 * time.Millisecond)
	close(stopping)
	writing.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if time.Now().After(deadline) {
			desc, _ := s.Describe(ctx, f)
			t.Fatalf("30 s after the writers stopped: %d rows unsealed, the reader at %d, head %d", desc.Unsealed, last, desc.Head)
		}
		desc, err := s.Describe(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		before := last
		read()
		if desc.Unsealed == 0 && last == before {
			break
		}
		select {
		case err := <-errs:
			t.Fatalf("writer or sealer: %v", err)
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopSealing()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer or sealer: %v", err)
	}
	want := map[feed.Key]string{}
	rows, err := d.pool.Query(ctx, `SELECT key, v FROM `+app)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		want[feed.Key(k)] = fmt.Sprintf(`{"v": %d}`, v)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if got := feedDocs(t, s, f); !maps.Equal(got, want) {
		t.Errorf("the sealed feed differs from the plain table:\n feed  %v\n table %v", got, want)
	}
	if !maps.Equal(seen, want) {
		t.Errorf("what the tailing reader holds differs from the plain table:\n reader %v\n table  %v", seen, want)
	}
	if len(want) < 60 {
		t.Errorf("only %d keys written; the writers did too little to prove anything", len(want))
	}
	t.Logf("%d commits, head %d", counter.Load(), last)
}

// TestConcurrentResetWaitsForOpenWriters: a reset while a writer holds an
// unsealed write open waits for that writer, and removes what it committed,
// so nothing of the old generation is sealed into the new one; a write after
// the reset lands in the new generation. A reset that took only the lock its
// upsert takes (NO KEY UPDATE) would let the open writer through, and its
// row would be sealed in the new generation.
func TestConcurrentResetWaitsForOpenWriters(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	// The open writer writes through Write, or through QueueWrite on a
	// batch of its own: both take the write lock before their upsert.
	for _, queued := range []bool{false, true} {
		t.Run(map[bool]string{false: "Write", true: "QueueWrite"}[queued], func(t *testing.T) {
			t.Parallel()
			resetWaitsForOpenWriters(t, d, queued)
		})
	}
}

func resetWaitsForOpenWriters(t *testing.T, d db, queued bool) {
	s := newStore(t, d, pgfeed.Options{})
	ctx := t.Context()
	f := feed.FeedName(fmt.Sprintf("reset_%v", queued))
	concurrentFeed(t, s, f)
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("sealed", []byte(`1`)), feed.Put("unsealed", []byte(`1`))}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SealRound(ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("unsealed", []byte(`2`))}); err != nil {
		t.Fatal(err)
	}
	open, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(context.WithoutCancel(ctx)) }()
	old := []feed.Change{feed.Put("old", []byte(`"old generation"`))}
	if queued {
		b := &pgx.Batch{}
		if err := s.QueueWrite(b, f, old, nil); err != nil {
			t.Fatal(err)
		}
		if err := open.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
	} else if _, err := s.Write(ctx, open, f, old); err != nil {
		t.Fatal(err)
	}
	reset := make(chan error, 1)
	var resetAt atomic.Int64
	go func() {
		reset <- pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			if _, err := s.ResetTx(ctx, tx, f); err != nil {
				return err
			}
			_, err := s.Write(ctx, tx, f, []feed.Change{feed.Put("rebuilt", []byte(`"new"`))})
			resetAt.Store(time.Now().UnixNano())
			return err
		})
	}()
	time.Sleep(300 * time.Millisecond) // the reset, if it does not wait, is done by now
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committedAt := time.Now().UnixNano()
	if err := <-reset; err != nil {
		t.Fatalf("reset: %v", err)
	}
	if resetAt.Load() < committedAt {
		t.Errorf("the reset went on while a writer of the old generation was open")
	}
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("after", []byte(`"new"`))}); err != nil {
		t.Fatal(err)
	}
	sealAll(t, s, f)
	b, err := s.ReadBatch(ctx, f, 0, feed.BatchLimit{Records: 100})
	if err != nil {
		t.Fatal(err)
	}
	got := map[feed.Key]string{}
	for _, r := range b.Records {
		got[r.Key] = string(r.Doc)
	}
	want := map[feed.Key]string{"rebuilt": `"new"`, "after": `"new"`}
	if b.Generation != 2 || !maps.Equal(got, want) {
		t.Fatalf("after the reset: generation %d, feed %v; want generation 2, %v", b.Generation, got, want)
	}
}

// TestConcurrentCollectKeepsPendingPut: a tombstone every sink has passed is
// not collected while a put of its key waits unsealed (collecting it would
// drop the put with the row); once sealed, the put is in the feed.
func TestConcurrentCollectKeepsPendingPut(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx := t.Context()
	const f = feed.FeedName("collect")
	concurrentFeed(t, s, f)
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("k", []byte(`1`)), feed.Put("other", []byte(`1`))}); err != nil {
		t.Fatal(err)
	}
	sealAll(t, s, f)
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Delete("k")}); err != nil {
		t.Fatal(err)
	}
	sealAll(t, s, f)
	head, _ := s.Head(ctx, f)
	id := feed.SinkID{Feed: f, Sink: "s"}
	l, err := s.AcquireLease(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(context.WithoutCancel(ctx)) }()
	if err := s.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: head}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("k", []byte(`2`))}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.CollectTombstones(ctx, f); err != nil || n != 0 {
		t.Fatalf("CollectTombstones = %d, %v; want 0: the tombstone's key has an unsealed put", n, err)
	}
	sealAll(t, s, f)
	if got := feedDocs(t, s, f); got["k"] != `2` {
		t.Fatalf("after sealing: k = %q; want the put 2", got["k"])
	}
	// Retrying a parked key that was never sealed restamps nothing.
	if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("fresh", []byte(`1`))}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{d.schema, "feed_parked"}.Sanitize()+` (feed, sink, key, seq, reason, parked_at) VALUES ($1, 's', 'fresh', 1, 'r', now())`, string(f)); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Head(ctx, f)
	if _, err := s.RetryParked(ctx, id, "fresh"); err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Head(ctx, f); h != before {
		t.Fatalf("RetryParked of a never-sealed key moved the head from %d to %d", before, h)
	}
	if n := sealAll(t, s, f); n != 1 {
		t.Fatalf("sealed %d; want the one fresh row", n)
	}
	if got := feedDocs(t, s, f); got["fresh"] != `1` {
		t.Fatalf("fresh = %q after sealing; want 1", got["fresh"])
	}
}

// TestSealerChild is not a test: TestSealerKilledMidRound runs the test
// binary again with KAIROS_TEST_SEALER_SCHEMA set, and this becomes the
// sealer process it kills.
func TestSealerChild(t *testing.T) {
	schema := os.Getenv("KAIROS_TEST_SEALER_SCHEMA")
	if schema == "" {
		t.Skip("the child process of TestSealerKilledMidRound")
	}
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s, err := pgfeed.New(context.Background(), pool, pgfeed.Options{Schema: schema, Lease: sealerLease, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.RunSealer(context.Background(), "killed")
}

// sealerLease is short, so that a killed holder's lease lapses within the
// test.
var sealerLease = feed.LeaseOptions{TTL: 2 * time.Second, Heartbeat: 400 * time.Millisecond}

// TestSealerKilledMidRound: the sealer, a process of its own, holds the
// lease and is caught inside a round (its feed lock waits behind the test's);
// the process is SIGKILLed and its backend terminated; another sealer takes
// the lease over once it lapses. Writers commit all along, each value once.
// Nothing is lost (the feed ends equal to a plain table written in the same
// transactions) and nothing is sealed twice (no value is read at two seqs,
// and no seq below one read appears).
func TestSealerKilledMidRound(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{Lease: sealerLease})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const f = feed.FeedName("killed")
	concurrentFeed(t, s, f)
	app := pgx.Identifier{d.schema, "app"}.Sanitize()
	gens := pgx.Identifier{d.schema, "feed_generations"}.Sanitize()
	if _, err := d.pool.Exec(ctx, `CREATE TABLE `+app+` (key text PRIMARY KEY, v bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	writers := pgtest.PoolWith(t, pgtest.URL(), func(c *pgxpool.Config) { c.MaxConns = 8 })

	child := exec.Command(os.Args[0], "-test.run=^TestSealerChild$", "-test.count=1")
	child.Env = append(os.Environ(), "KAIROS_TEST_SEALER_SCHEMA="+d.schema)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("30 s without %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	var childHolder feed.LeaseHolder
	waitUntil("the child taking the sealer lease", func() bool {
		desc, err := s.Describe(ctx, f)
		if err == nil && desc.Sealer != nil {
			childHolder = desc.Sealer.Holder
		}
		return childHolder != ""
	})

	var counter atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	// The writers stop between commits (see TestConcurrentCommitOrder).
	stopping := make(chan struct{})
	stopWriting := sync.OnceFunc(func() { close(stopping) })
	defer stopWriting()
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stopping:
					return
				default:
				}
				k, v := fmt.Sprintf("k%02d", (w*7+int(counter.Load()))%40), counter.Add(1)
				err := pgx.BeginFunc(ctx, writers, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO `+app+` (key, v) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET v = excluded.v`, k, v); err != nil {
						return err
					}
					_, err := s.Write(ctx, tx, f, []feed.Change{feed.Put(feed.Key(k), []byte(fmt.Sprintf(`{"v": %d}`, v)))})
					return err
				})
				if err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
			}
		}()
	}

	seen := map[feed.Key]string{}
	values := map[string]feed.Seq{}
	var last feed.Seq
	read := func() {
		b, err := s.ReadBatch(ctx, f, last, feed.BatchLimit{Records: 100})
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		for _, r := range b.Records {
			if r.Seq <= last {
				t.Fatalf("the reader at seq %d was handed seq %d", last, r.Seq)
			}
			if at, twice := values[string(r.Doc)]; twice {
				t.Fatalf("%s of key %s sealed twice, at seqs %d and %d", r.Doc, r.Key, at, r.Seq)
			}
			values[string(r.Doc)] = r.Seq
			last, seen[r.Key] = r.Seq, string(r.Doc)
		}
	}
	for range 20 {
		read()
		time.Sleep(10 * time.Millisecond)
	}

	// Catch the child inside a round: hold the feed lock, and wait for its
	// backend to wait for it.
	blocker, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM `+gens+` WHERE feed = $1 FOR NO KEY UPDATE`, string(f)); err != nil {
		t.Fatal(err)
	}
	var pid int
	waitUntil("the child's round waiting for the feed lock", func() bool {
		err := d.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%' AND query LIKE '%`+d.schema+`%'`).Scan(&pid)
		return err == nil
	})
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	if _, err := d.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// The successor: it takes over once the child's lease lapses.
	sealCtx, stopSealing := context.WithCancel(ctx)
	defer stopSealing()
	sealed := make(chan error, 1)
	go func() { sealed <- s.RunSealer(sealCtx, f) }()
	waitUntil("a successor taking the lease", func() bool {
		read()
		desc, err := s.Describe(ctx, f)
		return err == nil && desc.Sealer != nil && desc.Sealer.Holder != childHolder
	})
	for range 30 {
		read()
		time.Sleep(10 * time.Millisecond)
	}
	stopWriting()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("writer: %v", err)
	default:
	}
	waitUntil("everything sealed and read", func() bool {
		desc, err := s.Describe(ctx, f)
		before := last
		read()
		return err == nil && desc.Unsealed == 0 && last == before
	})
	stopSealing()
	if err := <-sealed; err != nil {
		t.Fatalf("RunSealer: %v", err)
	}
	want := map[feed.Key]string{}
	rows, _ := d.pool.Query(ctx, `SELECT key, v FROM `+app)
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		want[feed.Key(k)] = fmt.Sprintf(`{"v": %d}`, v)
	}
	if got := feedDocs(t, s, f); !maps.Equal(got, want) || !maps.Equal(seen, want) {
		t.Fatalf("after the takeover:\n feed   %v\n reader %v\n table  %v", got, seen, want)
	}
	t.Logf("%d commits, %d values read, head %d", counter.Load(), len(values), last)
}

// TestConcurrentRunnerSealsAndWaits: a syncer.Runner over the store seals a
// concurrent-mode feed with no sealer of the test's own, and WaitApplied on
// a concurrent write's result (keys, no seqs) waits for the sealing and
// then for the sink, which then holds the write.
func TestConcurrentRunnerSealsAndWaits(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const f = feed.FeedName("waited")
	concurrentFeed(t, s, f)
	sink := memfeed.NewSink(memfeed.SinkOptions{})
	id := feed.SinkID{Feed: f, Sink: "mem"}
	r, err := syncer.NewRunner(s, []syncer.Target{{ID: id, Sink: sink}}, syncer.Options{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for i := range 5 {
		res, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("a", []byte(fmt.Sprintf(`{"i": %d}`, i))), feed.Put(feed.Key(fmt.Sprintf("k%d", i)), []byte(`1`))})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := syncer.WaitApplied(wctx, s, id, res, syncer.WaitOptions{})
		wcancel()
		if err != nil || out.Outcome != syncer.OutcomeApplied {
			t.Fatalf("WaitApplied = %+v, %v; want applied", out, err)
		}
		if got := string(sink.Documents()["a"]); got != fmt.Sprintf(`{"i": %d}`, i) {
			t.Fatalf("after WaitApplied the sink has a = %s; want write %d's", got, i)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentLockTxHoldsResetBack: in the concurrent mode LockTx takes
// the write lock a concurrent writer takes, so two projections' commits
// holding it do not wait for each other, and a reset waits for both.
func TestConcurrentLockTxHoldsResetBack(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx := t.Context()
	const f = feed.FeedName("locktx")
	concurrentFeed(t, s, f)
	var held []pgx.Tx
	for range 2 {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = s.LockTx(lctx, tx, f)
		cancel()
		if err != nil {
			t.Fatalf("LockTx beside another holder: %v", err)
		}
		held = append(held, tx)
	}
	reset := make(chan error, 1)
	go func() {
		reset <- pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			_, err := s.ResetTx(ctx, tx, f)
			return err
		})
	}()
	select {
	case err := <-reset:
		t.Fatalf("the reset ended (%v) while two LockTx holders were open", err)
	case <-time.After(300 * time.Millisecond):
	}
	for _, tx := range held {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-reset; err != nil {
		t.Fatal(err)
	}
}

// TestSealRoundFailedOnConnection: a store given a single connection (not
// a pool) runs its rounds as one batch that opens its own transaction. A
// round that fails (here its feed lock times out behind another
// transaction's lock of the feed's row) must leave that connection out of
// the aborted transaction, or every statement after it, the next round's
// included, fails until the connection is dropped.
func TestSealRoundFailedOnConnection(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	const f = feed.FeedName("oneconn")
	w := newStore(t, d, pgfeed.Options{})
	concurrentFeed(t, w, f)
	if err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, f, []feed.Change{feed.Put("k", []byte(`{"v": 1}`))})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `SET lock_timeout = '100ms'`); err != nil {
		t.Fatal(err)
	}
	s, err := pgfeed.New(ctx, conn, pgfeed.Options{Schema: d.schema, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	holder, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT 1 FROM "`+d.schema+`".feed_generations WHERE feed = $1 FOR UPDATE`, string(f)); err != nil {
		t.Fatal(err)
	}
	_, err = s.SealRound(ctx, f)
	_ = holder.Rollback(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("SealRound behind the feed's locked row: %v; want its lock to time out (55P03)", err)
	}
	if st := conn.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("after the failed round the connection's transaction status is %q; want idle", st)
	}
	if n, err := s.SealRound(ctx, f); err != nil || n != 1 {
		t.Fatalf("the round after it: sealed %d, %v; want the one write sealed", n, err)
	}
	if docs := feedDocs(t, w, f); docs["k"] != `{"v": 1}` {
		t.Fatalf("the feed holds %q", docs)
	}
}
