package pgfeed_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestRetryAndResetWaitForTheFeedLock: while a writer's transaction is open
// on a feed, RetryParked and ResetTx wait for it, and what they stamp comes
// after its commit: the retried row's new seq is above the writer's, so a
// reader past the writer's rows still sees the retry.
func TestRetryAndResetWaitForTheFeedLock(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	clock := feedtest.NewManualClock(leaseEpoch)
	s := newStore(t, d, pgfeed.Options{Clock: clock})
	ctx := t.Context()
	id := feed.SinkID{Feed: "locked", Sink: "s"}
	if _, err := s.WriteCommitted(ctx, id.Feed, []feed.Change{feed.Put("p", []byte(`{"p":1}`))}); err != nil {
		t.Fatal(err)
	}
	l := mustAcquire(t, s, ctx, id)
	if err := s.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: 1},
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{{Key: "p", Seq: 1, Reason: "no", ParkedAt: clock.Now()}}}}); err != nil {
		t.Fatal(err)
	}

	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	w, err := s.Write(ctx, tx, id.Feed, []feed.Change{feed.Put("w", []byte(`{"w":1}`))})
	if err != nil {
		t.Fatal(err)
	}
	retried := make(chan error, 1)
	go func() {
		ok, err := s.RetryParked(ctx, id, "p")
		if err == nil && !ok {
			err = errNotRetried
		}
		retried <- err
	}()
	select {
	case err := <-retried:
		t.Fatalf("RetryParked returned (%v) while a writer held the feed lock", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-retried:
		if err != nil {
			t.Fatalf("RetryParked: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RetryParked still waits 10s after the writer committed")
	}
	b, err := s.ReadBatch(ctx, id.Feed, w.Last, feed.BatchLimit{Records: 10})
	if err != nil || len(b.Records) != 1 || b.Records[0].Key != "p" || b.Records[0].Seq <= w.Last {
		t.Fatalf("after the writer's seq %d, the feed holds %+v (%v); want the retried p above it", w.Last, b.Records, err)
	}

	// ResetTx waits the same way, and a writer's rows committed before it
	// are gone after it.
	tx2, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx2.Rollback(context.Background()) }()
	if _, err := s.Write(ctx, tx2, id.Feed, []feed.Change{feed.Put("late", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	reset := make(chan feed.Generation, 1)
	go func() {
		var g feed.Generation
		_ = pgx.BeginFunc(ctx, d.pool, func(rtx pgx.Tx) error {
			var err error
			g, err = s.ResetTx(ctx, rtx, id.Feed)
			return err
		})
		reset <- g
	}()
	select {
	case <-reset:
		t.Fatal("ResetTx returned while a writer held the feed lock")
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if g := <-reset; g != 2 {
		t.Fatalf("ResetTx = generation %d; want 2", g)
	}
	b, err = s.ReadBatch(ctx, id.Feed, 0, feed.BatchLimit{Records: 10})
	if err != nil || b.Generation != 2 || len(b.Records) != 0 || b.Head <= w.Last {
		t.Fatalf("after the reset, the feed reads %+v, %v; want generation 2, empty, head kept", b, err)
	}
}

var errNotRetried = errorString("RetryParked returned false for a parked key")

type errorString string

func (e errorString) Error() string { return string(e) }

// blockedBy waits until a session waits for a lock pid's transaction holds,
// or fails t after 10s. done, when it yields first, means the call that
// should have blocked returned; nil when the caller watches that itself.
func blockedBy(t *testing.T, ctx context.Context, d db, pid int32, done <-chan error, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var blocked int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))`, pid).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked > 0 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("%s returned (%v) while a transaction held the feed lock", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not wait for the feed lock within 10s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling an observable condition
	}
}

// TestRetryWaitsForARebuildThatRewroteTheKey: a rebuild that empties the feed
// and writes the parked key again in the new generation, in one transaction,
// holds the feed lock while a retry of that key starts. The retry must come
// after the rebuild in everything: it restamps the new generation's row, at
// a seq above it, so a sink that already passed that row sees the key again.
// A retry whose restamp reads a snapshot older than the rebuild (the feed
// lock not taken first, in a statement of its own) finds the old row, gone
// by then: it hands out a seq no row gets and leaves the new row where it
// was, and the retry is lost.
func TestRetryWaitsForARebuildThatRewroteTheKey(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	clock := feedtest.NewManualClock(leaseEpoch)
	s := newStore(t, d, pgfeed.Options{Clock: clock})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	id := feed.SinkID{Feed: "rebuilt", Sink: "s"}
	if _, err := s.WriteCommitted(ctx, id.Feed, []feed.Change{feed.Put("k", []byte(`{"v":1}`)), feed.Put("other", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	l := mustAcquire(t, s, ctx, id)
	if err := s.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: 2},
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{{Key: "k", Seq: 1, Reason: "no", ParkedAt: clock.Now()}}}}); err != nil {
		t.Fatal(err)
	}

	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := s.ResetTx(ctx, tx, id.Feed); err != nil {
		t.Fatal(err)
	}
	rewrote, err := s.Write(ctx, tx, id.Feed, []feed.Change{feed.Put("k", []byte(`{"v":2}`))})
	if err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	retried := make(chan error, 1)
	go func() {
		ok, err := s.RetryParked(ctx, id, "k")
		if err == nil && !ok {
			err = errNotRetried
		}
		retried <- err
	}()
	blockedBy(t, ctx, d, pid, retried, "RetryParked")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-retried; err != nil {
		t.Fatalf("RetryParked: %v", err)
	}
	b, err := s.ReadBatch(ctx, id.Feed, 0, feed.BatchLimit{Records: 10})
	if err != nil {
		t.Fatal(err)
	}
	if b.Generation != 2 || len(b.Records) != 1 || b.Records[0].Key != "k" || string(b.Records[0].Doc) != `{"v": 2}` {
		t.Fatalf("after the rebuild and the retry the feed reads %+v; want generation 2 holding only the rebuilt k", b)
	}
	if got := b.Records[0].Seq; got <= rewrote.Last || got != b.Head {
		t.Fatalf("the rebuilt k is at seq %d, head %d; want it restamped above the rebuild's seq %d, at the head: the retry came after the rebuild", got, b.Head, rewrote.Last)
	}
}

// TestWritersAndRebuildsNeverDeadlock: writers of overlapping keys and
// rebuilds of the same feed, all at once, all succeed. Every one of them takes
// the feed lock before any row of the feed, so none waits for a row while
// holding what another waits for; a writer that locked its rows first would
// deadlock with a rebuild that empties the feed, and PostgreSQL would abort
// one of the two.
func TestWritersAndRebuildsNeverDeadlock(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const f = feed.FeedName("contended")
	keys := []feed.Key{"a", "b", "c", "d"}
	errs := make(chan error, 100)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				var changes []feed.Change
				for j := range 3 {
					changes = append(changes, feed.Put(keys[(w+i+j)%len(keys)], []byte(`{}`)))
				}
				if _, err := s.WriteCommitted(ctx, f, changes); err != nil {
					errs <- fmt.Errorf("writer %d, write %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 40 {
			err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
				_, err := s.ResetTx(ctx, tx, f)
				return err
			})
			if err != nil {
				errs <- fmt.Errorf("rebuild %d: %w", i, err)
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
