package pgfeed_test

import (
	"context"
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
