package pgfeed_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// TestQueueWrite: a write queued on the application's own batch commits and
// rolls back with the application's statements, in a transaction and
// outside any (where the batch is one implicit transaction), in every exec
// mode and both write modes, and its result says what Write's would.
func TestQueueWrite(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			d := setup(t, pgtest.URL(), m.mode)
			for _, wm := range writeModes {
				t.Run(string(wm), func(t *testing.T) { queueWrite(t, d, wm) })
			}
		})
	}
}

// TestQueueWriteThroughPgBouncer runs the same through PgBouncer in
// transaction mode, in the two exec modes a transaction pooler allows: a
// batch outside a transaction is one implicit transaction, which the pooler
// keeps on one server connection.
func TestQueueWriteThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := pgbouncerURL(t)
	for _, m := range modes[1:] {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			d := setup(t, url, m.mode)
			for _, wm := range writeModes {
				t.Run(string(wm), func(t *testing.T) { queueWrite(t, d, wm) })
			}
		})
	}
}

// sealedOrUnsealed reads f whole: sealed rows after sealing everything in
// the concurrent mode, key → document ("" for a tombstone).
func settled(t *testing.T, s *pgfeed.Store, f feed.FeedName, wm feed.WriteMode) map[feed.Key]string {
	t.Helper()
	if wm == feed.WriteConcurrent {
		sealAll(t, s, f)
	}
	return feedDocs(t, s, f)
}

func queueWrite(t *testing.T, d db, wm feed.WriteMode) {
	ctx := t.Context()
	s := newStore(t, d, pgfeed.Options{})
	f := feed.FeedName("queued_" + string(wm))
	if wm == feed.WriteConcurrent {
		concurrentFeed(t, s, f)
	}
	orders := pgx.Identifier{d.schema, "orders_" + string(wm)}.Sanitize()
	if _, err := d.pool.Exec(ctx, `CREATE TABLE `+orders+` (id text PRIMARY KEY, total int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	checkResult := func(what string, res feed.WriteResult, called bool, keys ...feed.Key) {
		t.Helper()
		if !called {
			t.Fatalf("%s: done was not called", what)
		}
		if res.Generation != 1 {
			t.Fatalf("%s: result %+v; want generation 1", what, res)
		}
		switch wm {
		case feed.WriteConcurrent:
			if res.First != 0 || res.Last != 0 || !slices.Equal(res.Unsealed, keys) {
				t.Fatalf("%s: concurrent result %+v; want unsealed %v and no seqs", what, res, keys)
			}
		default:
			if res.Unsealed != nil || res.First < 1 || res.Last-res.First+1 != feed.Seq(len(keys)) {
				t.Fatalf("%s: locked result %+v; want %d seqs and nothing unsealed", what, res, len(keys))
			}
			if head, err := s.Head(ctx, f); err != nil || head != res.Last {
				t.Fatalf("%s: head %d, %v; want the result's last seq %d", what, head, err, res.Last)
			}
		}
	}

	// In the caller's transaction, beside the application's own insert.
	var res feed.WriteResult
	var called bool
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO ` + orders + ` (id, total) VALUES ('a', 1), ('b', 2)`)
		if err := s.QueueWrite(b, f, []feed.Change{feed.Put("a", []byte(`{"total":1}`)), feed.Put("b", []byte(`{"total":2}`))},
			func(r feed.WriteResult) { res, called = r, true }); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		t.Fatalf("batch in a transaction: %v", err)
	}
	checkResult("batch in a transaction", res, called, "a", "b")
	want := map[feed.Key]string{"a": `{"total": 1}`, "b": `{"total": 2}`}
	if got := settled(t, s, f, wm); !maps.Equal(got, want) {
		t.Fatalf("after a batch in a transaction: feed %v; want %v", got, want)
	}
	head, err := s.Head(ctx, f)
	if err != nil {
		t.Fatal(err)
	}

	// Outside a transaction, a statement after the write fails: the batch
	// is one implicit transaction, so the write goes with it.
	b := &pgx.Batch{}
	b.Queue(`UPDATE ` + orders + ` SET total = 10 WHERE id = 'a'`)
	called = false
	if err := s.QueueWrite(b, f, []feed.Change{feed.Put("a", []byte(`{"total":10}`)), feed.Put("c", []byte(`{"total":3}`))},
		func(feed.WriteResult) { called = true }); err != nil {
		t.Fatal(err)
	}
	b.Queue(`SELECT 1 / 0`)
	if err := d.pool.SendBatch(ctx, b).Close(); err == nil {
		t.Fatal("a batch ending in a division by zero succeeded")
	}
	if wm == feed.WriteConcurrent {
		if desc, err := s.Describe(ctx, f); err != nil || desc.Unsealed != 0 {
			t.Fatalf("a queued write outlived the failed batch it was sent in: %d unsealed, %v", desc.Unsealed, err)
		}
	}
	if got := settled(t, s, f, wm); !maps.Equal(got, want) {
		t.Fatalf("a queued write outlived the failed batch it was sent in: %v", got)
	}
	if h, err := s.Head(ctx, f); err != nil || h != head {
		t.Fatalf("the failed batch moved the head from %d to %d (%v)", head, h, err)
	}
	var total int
	if err := d.pool.QueryRow(ctx, `SELECT total FROM `+orders+` WHERE id = 'a'`).Scan(&total); err != nil || total != 1 {
		t.Fatalf("the application's update outlived the failed batch: total %d, %v", total, err)
	}

	// Outside a transaction and succeeding, with a delete: a tombstone.
	b = &pgx.Batch{}
	b.Queue(`DELETE FROM ` + orders + ` WHERE id = 'b'`)
	b.Queue(`INSERT INTO ` + orders + ` (id, total) VALUES ('c', 3)`)
	called = false
	if err := s.QueueWrite(b, f, []feed.Change{feed.Delete("b"), feed.Put("c", []byte(`{"total":3}`))},
		func(r feed.WriteResult) { res, called = r, true }); err != nil {
		t.Fatal(err)
	}
	if err := d.pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatalf("batch outside a transaction: %v", err)
	}
	checkResult("batch outside a transaction", res, called, "b", "c")
	want = map[feed.Key]string{"a": `{"total": 1}`, "b": "", "c": `{"total": 3}`}
	if got := settled(t, s, f, wm); !maps.Equal(got, want) {
		t.Fatalf("after a batch outside a transaction: feed %v; want %v", got, want)
	}

	// A transaction rolled back after its batch was sent leaves nothing.
	head, _ = s.Head(ctx, f)
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		if err := s.QueueWrite(b, f, []feed.Change{feed.Put("d", []byte(`{"total":4}`))}, nil); err != nil {
			return err
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("rolled-back transaction: %v", err)
	}
	if got := settled(t, s, f, wm); !maps.Equal(got, want) {
		t.Fatalf("a rolled-back write reached the feed: %v", got)
	}
	if h, _ := s.Head(ctx, f); h != head {
		t.Fatalf("a rolled-back write moved the head from %d to %d", head, h)
	}

	// A write that fails (here it cannot get the feed's lock in time) comes
	// back from the batch's Close as a WriteFailedError.
	hold, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
	// A reset holds the feed's write lock exclusive and its row FOR
	// UPDATE, which holds back a writer of either mode.
	if _, err := s.ResetTx(ctx, hold, f); err != nil {
		t.Fatalf("ResetTx: %v", err)
	}
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`SET LOCAL lock_timeout = '200ms'`)
		if err := s.QueueWrite(b, f, []feed.Change{feed.Put("e", []byte(`1`))}, nil); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	var wf *feed.WriteFailedError
	if !errors.As(err, &wf) || !errors.Is(err, feed.ErrWriteFailed) {
		t.Fatalf("a write that timed out on the feed's lock returned %v; want a *feed.WriteFailedError", err)
	}
}

// errRollback makes pgx.BeginFunc roll back.
var errRollback = errors.New("roll back")

// TestQueueWriteFollowsModeSwitch: a store that cached one write mode queues
// a write after another store switched the feed to the other mode; the
// write lands in the mode the feed's row records, and says so.
func TestQueueWriteFollowsModeSwitch(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	a, other := newStore(t, d, pgfeed.Options{}), newStore(t, d, pgfeed.Options{})
	const f = feed.FeedName("switch")
	queue := func(key feed.Key) feed.WriteResult {
		t.Helper()
		var res feed.WriteResult
		b := &pgx.Batch{}
		if err := a.QueueWrite(b, f, []feed.Change{feed.Put(key, []byte(`1`))}, func(r feed.WriteResult) { res = r }); err != nil {
			t.Fatal(err)
		}
		if err := d.pool.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("queued write of %s: %v", key, err)
		}
		return res
	}
	if res := queue("one"); res.Last != 1 || res.Unsealed != nil {
		t.Fatalf("first write, locked mode: %+v; want seq 1", res)
	}
	if err := other.SetWriteMode(ctx, f, feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	if res := queue("two"); res.Last != 0 || !slices.Equal(res.Unsealed, []feed.Key{"two"}) {
		t.Fatalf("write after the switch to concurrent: %+v; want two unsealed", res)
	}
	if d, err := a.Describe(ctx, f); err != nil || d.Unsealed != 1 || d.Head != 1 {
		t.Fatalf("after the switch to concurrent: %+v, %v; want 1 unsealed, head 1", d, err)
	}
	sealAll(t, a, f)
	if err := other.SetWriteMode(ctx, f, feed.WriteLocked); err != nil {
		t.Fatal(err)
	}
	if res := queue("three"); res.Last != 3 || res.Unsealed != nil {
		t.Fatalf("write after the switch back to locked: %+v; want seq 3", res)
	}
	if got := feedDocs(t, a, f); len(got) != 3 {
		t.Fatalf("feed after both switches: %v; want one, two, three", got)
	}
}

// TestQueueWriteBadInput: every mistake is refused before anything is
// queued, and an empty write queues nothing and is done at once.
func TestQueueWriteBadInput(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ok := []feed.Change{feed.Put("k", []byte(`1`))}
	if err := s.QueueWrite(nil, "f", ok, nil); !errors.Is(err, feed.ErrInvalid) {
		t.Errorf("nil batch: %v; want an invalid-input error", err)
	}
	for _, c := range []struct {
		name    string
		f       feed.FeedName
		changes []feed.Change
	}{
		{"bad feed name", "", ok},
		{"empty key", "f", []feed.Change{feed.Put("", []byte(`1`))}},
		{"bad JSON", "f", []feed.Change{feed.Put("k", []byte(`{`))}},
	} {
		b := &pgx.Batch{}
		called := false
		err := s.QueueWrite(b, c.f, c.changes, func(feed.WriteResult) { called = true })
		if !errors.Is(err, feed.ErrInvalid) || b.Len() != 0 || called {
			t.Errorf("%s: %v, %d queued, done called %v; want an invalid-input error and nothing queued", c.name, err, b.Len(), called)
		}
	}
	b := &pgx.Batch{}
	called := false
	if err := s.QueueWrite(b, "f", nil, func(r feed.WriteResult) { called = r.Generation == 0 && r.Last == 0 && r.Unsealed == nil }); err != nil || b.Len() != 0 || !called {
		t.Errorf("empty write: %v, %d queued, done called with the zero result %v; want nil, nothing, true", err, b.Len(), called)
	}
}
