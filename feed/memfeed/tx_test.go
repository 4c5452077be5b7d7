package memfeed_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
)

// Leases start heartbeat goroutines; none may outlive its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T) *memfeed.Store {
	t.Helper()
	s, err := memfeed.New(memfeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func doc(s string) json.RawMessage { return json.RawMessage(s) }

// An open transaction holds the feed lock: a second writer of the same feed
// waits until it ends, and then gets the seqs after it, so seq order is commit
// order. Other feeds are not blocked.
func TestOpenTransactionHoldsFeedLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	first := s.Begin()
	if _, err := s.Write(ctx, first, "f", []feed.Change{feed.Put("a", doc(`1`))}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteCommitted(ctx, "other", []feed.Change{feed.Put("x", doc(`1`))}); err != nil {
		t.Fatalf("another feed was blocked: %v", err)
	}
	done := make(chan feed.WriteResult)
	go func() {
		res, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("b", doc(`2`))})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case <-done:
		t.Fatal("a second writer went ahead while the first transaction held the feed lock")
	case <-time.After(50 * time.Millisecond):
	}
	if err := first.Commit(); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.First != 2 {
		t.Fatalf("second writer got seq %d, want 2", res.First)
	}

	// Waiting for the lock honours the caller's context.
	blocker := s.Begin()
	defer blocker.Rollback()
	if _, err := s.Write(ctx, blocker, "f", []feed.Change{feed.Put("c", doc(`3`))}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := s.WriteCommitted(short, "f", []feed.Change{feed.Put("d", doc(`4`))}); !errors.Is(err, feed.ErrWriteFailed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a write failure caused by the deadline", err)
	}
}

// A rolled-back transaction leaves nothing, releases the lock, and its seqs
// are handed out again (they were never visible).
func TestRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	tx := s.Begin()
	if _, err := s.Write(ctx, tx, "f", []feed.Change{feed.Put("a", doc(`1`))}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	tx.Rollback()
	if err := tx.Commit(); !errors.Is(err, feed.ErrInvalid) {
		t.Fatalf("commit after rollback = %v, want ErrInvalid", err)
	}
	if _, err := s.Write(ctx, tx, "f", []feed.Change{feed.Put("a", doc(`1`))}); !errors.Is(err, feed.ErrInvalid) {
		t.Fatalf("write in an ended transaction = %v, want ErrInvalid", err)
	}
	b, _ := s.ReadBatch(ctx, "f", 0, feed.BatchLimit{Records: 10})
	if len(b.Records) != 0 || b.Head != 0 {
		t.Fatalf("after rollback: %+v", b)
	}
	res, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("b", doc(`2`))})
	if err != nil || res.First != 1 {
		t.Fatalf("after rollback: %+v, %v", res, err)
	}
}

// A transaction of another store is refused before anything is written.
func TestForeignTransaction(t *testing.T) {
	t.Parallel()
	a, b := newStore(t), newStore(t)
	if _, err := a.Write(context.Background(), b.Begin(), "f", []feed.Change{feed.Put("k", doc(`1`))}); !errors.Is(err, feed.ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	if _, err := a.Write(context.Background(), nil, "f", nil); !errors.Is(err, feed.ErrInvalid) {
		t.Fatalf("nil tx: err = %v, want ErrInvalid", err)
	}
}

// ResetFeed and writes in the same transaction: the rows before it go, the
// rows after it stay, in the new generation, above the old head.
func TestResetFeedThenWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("a", doc(`1`)), feed.Put("b", doc(`2`))}); err != nil {
		t.Fatal(err)
	}
	tx := s.Begin()
	gen, err := tx.ResetFeed(ctx, "f")
	if err != nil || gen != 2 {
		t.Fatalf("ResetFeed = %d, %v", gen, err)
	}
	res, err := s.Write(ctx, tx, "f", []feed.Change{feed.Put("c", doc(`3`))})
	if err != nil || res.Generation != 2 || res.First != 3 {
		t.Fatalf("write after reset = %+v, %v", res, err)
	}
	// Not visible before commit.
	if g, _ := s.Generation(ctx, "f"); g != 1 {
		t.Fatalf("generation %d visible before commit", g)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	b, _ := s.ReadBatch(ctx, "f", 0, feed.BatchLimit{Records: 10})
	if b.Generation != 2 || len(b.Records) != 1 || b.Records[0].Key != "c" || b.Records[0].Seq != 3 || b.Head != 3 {
		t.Fatalf("after reset: %+v", b)
	}
}

func TestOptionsRefused(t *testing.T) {
	t.Parallel()
	_, err := memfeed.New(memfeed.Options{Lease: feed.LeaseOptions{TTL: time.Second, Heartbeat: time.Second}})
	var inv *feed.InvalidError
	if !errors.As(err, &inv) || inv.Field != "lease.heartbeat" {
		t.Fatalf("err = %v, want an InvalidError naming lease.heartbeat", err)
	}
}

// RetryParked takes the feed lock as a writer does: while a writer's
// transaction is open it waits (here until its short context ends), and
// after the commit its restamp lands above the writer's seqs, never beside
// them.
func TestRetryParkedWaitsForTheFeedLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	id := feed.SinkID{Feed: "f", Sink: "s"}
	if _, err := s.WriteCommitted(ctx, id.Feed, []feed.Change{feed.Put("p", doc(`1`))}); err != nil {
		t.Fatal(err)
	}
	l, err := s.AcquireLease(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	if err := s.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: 1},
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{{Key: "p", Seq: 1, Reason: "no", ParkedAt: time.Now()}}}}); err != nil {
		t.Fatal(err)
	}
	tx := s.Begin()
	defer tx.Rollback()
	w, err := s.Write(ctx, tx, id.Feed, []feed.Change{feed.Put("w", doc(`2`))})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if ok, err := s.RetryParked(short, id, "p"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RetryParked while a writer's transaction is open = %v, %v; want it to wait for the feed lock until its context ends", ok, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.RetryParked(ctx, id, "p"); err != nil || !ok {
		t.Fatalf("RetryParked after the commit = %v, %v; want true", ok, err)
	}
	b, err := s.ReadBatch(ctx, id.Feed, w.Last, feed.BatchLimit{Records: 10})
	if err != nil || len(b.Records) != 1 || b.Records[0].Key != "p" || b.Records[0].Seq <= w.Last {
		t.Fatalf("after the writer's seq %d the feed holds %+v (%v); want the retried p above it", w.Last, b.Records, err)
	}
}

// A rebuild's commit wakes the feed's subscribers, as a write's does, so an
// idle worker starts its resync at once.
func TestResetWakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("a", doc(`1`))}); err != nil {
		t.Fatal(err)
	}
	sub, err := s.Subscribe(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	select {
	case <-sub.C():
	default:
	}
	tx := s.Begin()
	defer tx.Rollback()
	if _, err := tx.ResetFeed(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
	default:
		t.Fatal("a rebuild's commit woke no subscriber")
	}
}
