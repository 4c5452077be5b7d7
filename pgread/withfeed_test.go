package pgread_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

var (
	orders = feed.FeedName("orders")
	keyEU  = read.CheckpointKey{Projection: "orders", Partition: "eu"}
	keyUS  = read.CheckpointKey{Projection: "orders", Partition: "us"}
)

func withFeed(t *testing.T, e env, f feed.FeedName, key read.CheckpointKey) *pgread.FeedStore {
	t.Helper()
	fs, err := pgread.WithFeed(t.Context(), e.store, e.feeds, f, key)
	if err != nil {
		t.Fatalf("WithFeed(%s, %s): %v", f, key, err)
	}
	return fs
}

// memTx adapts the in-memory store to the pgx.Tx shape WithFeed takes: it is
// the real MemoryStore underneath, ephemeral as it says.
type memTx struct{ m *read.MemoryStore }

func (s memTx) Durability() read.Durability { return s.m.Durability() }
func (s memTx) ReadCheckpoint(ctx context.Context, k read.CheckpointKey) (read.Checkpoint, error) {
	return s.m.ReadCheckpoint(ctx, k)
}
func (s memTx) Commit(ctx context.Context, k read.CheckpointKey, exp read.Checkpoint, next read.Position, apply func(context.Context, pgx.Tx) error) error {
	return s.m.Commit(ctx, k, exp, next, func(ctx context.Context, _ read.NoTx) error { return apply(ctx, nil) })
}
func (s memTx) ResetCheckpoint(ctx context.Context, k read.CheckpointKey) error {
	return s.m.ResetCheckpoint(ctx, k)
}

// opaque hides a durable store's TxStore methods.
type opaque struct{ read.ProjectionStore[pgx.Tx] }

// ephemeralTx is a TxStore that says it is ephemeral: refused for what it
// says, whatever else it implements.
type ephemeralTx struct{ *pgread.Store }

func (ephemeralTx) Durability() read.Durability { return read.Ephemeral }

func TestWithFeedBindingAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	// A feed written before it is bound keeps its rows and generation.
	mustf(t, e.store.Commit(ctx, keyEU, ckpt(0, 0), 1, e.putView(orders, "o1", `{"n":1}`)), "commit")
	withFeed(t, e, orders, keyEU)
	withFeed(t, e, orders, keyEU) // the same key again is fine

	// A second pool stands for another process: its own connections, its own
	// store values, nothing shared in memory.
	other := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeSimpleProtocol)
	store2, feeds2 := newStore(t, other, e.schema), newFeeds(t, other, e.schema)
	for _, wrong := range []read.CheckpointKey{keyUS, {Projection: "orders"}, {Projection: "invoices", Partition: "eu"}} {
		_, err := pgread.WithFeed(ctx, store2, feeds2, orders, wrong)
		var bound *pgread.FeedBoundError
		if !errors.Is(err, pgread.ErrFeedBound) || !errors.As(err, &bound) || bound.Bound != keyEU || bound.Wanted != wrong || bound.Feed != orders {
			t.Fatalf("WithFeed(%s) from a second pool: err = %v, want a FeedBoundError naming %s", wrong, err, keyEU)
		}
	}
	if _, err := pgread.WithFeed(ctx, store2, feeds2, orders, keyEU); err != nil {
		t.Fatalf("the bound key from a second pool: %v", err)
	}
	// A refused binding changed nothing: same generation, same rows.
	b := e.feedRows(t, orders)
	if b.Generation != 1 || len(b.Records) != 1 || b.Records[0].Key != "o1" {
		t.Fatalf("feed after bindings: %+v", b)
	}
	// Another feed binds to another key independently.
	withFeed(t, e, "invoices", keyUS)
	if _, err := pgread.WithFeed(ctx, store2, feeds2, "invoices", keyEU); !errors.Is(err, pgread.ErrFeedBound) {
		t.Fatalf("invoices bound to %s, rebinding to %s: err = %v", keyUS, keyEU, err)
	}
}

func TestWithFeedRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	for _, tc := range []struct {
		name  string
		store read.ProjectionStore[pgx.Tx]
		f     feed.FeedName
		key   read.CheckpointKey
		field string
	}{
		{"ephemeral store", memTx{read.NewMemoryStore()}, orders, keyEU, "with_feed.store"},
		{"ephemeral store with transactions", ephemeralTx{e.store}, orders, keyEU, "with_feed.store"},
		{"store without TxStore", opaque{e.store}, orders, keyEU, "with_feed.store"},
		{"nil store", nil, orders, keyEU, "with_feed.store"},
		{"bad feed", e.store, "bad feed", keyEU, "feed name"},
		{"bad projection", e.store, orders, read.CheckpointKey{Projection: ""}, "checkpoint.projection"},
		{"bad partition", e.store, orders, read.CheckpointKey{Projection: "p", Partition: "x/y"}, "checkpoint.partition"},
	} {
		_, err := pgread.WithFeed(ctx, tc.store, e.feeds, tc.f, tc.key)
		var inv *feed.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: err = %v, want an InvalidError naming %s", tc.name, err, tc.field)
		}
	}
	if _, err := pgread.WithFeed(ctx, e.store, nil, orders, keyEU); err == nil {
		t.Error("nil feeds accepted")
	}
	// Nothing was bound by any refusal: the feed has no generations row, so
	// another key can still bind it.
	var n int
	mustf(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".feed_generations`).Scan(&n), "count")
	if n != 0 {
		t.Fatalf("%d generations rows after refusals, want 0", n)
	}
	withFeed(t, e, orders, keyUS)
}

func TestResetOtherKeysUntouched(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	fs := withFeed(t, e, orders, keyEU)
	mustf(t, fs.Commit(ctx, keyEU, ckpt(0, 0), 5, e.putView(orders, "eu1", `{"n":1}`)), "commit eu")
	mustf(t, fs.Commit(ctx, keyUS, ckpt(0, 0), 7, nil), "commit us")

	mustf(t, fs.ResetCheckpoint(ctx, keyUS), "reset us")
	if at := checkpoint(t, fs, keyUS); at != ckpt(0, 1) {
		t.Fatalf("us at %v after its reset", at)
	}
	if at := checkpoint(t, fs, keyEU); at != ckpt(5, 0) {
		t.Fatalf("eu moved to %v by another key's reset", at)
	}
	if b := e.feedRows(t, orders); b.Generation != 1 || len(b.Records) != 1 {
		t.Fatalf("another key's reset touched the feed: %+v", b)
	}

	mustf(t, fs.Commit(ctx, keyUS, ckpt(0, 1), 3, nil), "commit us again")
	// Another key's commit does not take the bound feed's lock: it lands
	// while a transaction holds that lock.
	lockTx, err := e.pool.Begin(ctx)
	mustf(t, err, "begin")
	defer lockTx.Rollback(context.Background())
	mustf(t, e.feeds.LockTx(ctx, lockTx, orders), "lock the feed")
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	mustf(t, fs.Commit(short, keyUS, ckpt(3, 1), 4, nil), "another key's commit while the feed is locked")
	cancel()
	mustf(t, lockTx.Rollback(ctx), "rollback")
	gen, err := fs.Rebuild(ctx, nil)
	mustf(t, err, "rebuild")
	if gen != 2 {
		t.Fatalf("generation %d after the bound key's reset, want 2", gen)
	}
	if b := e.feedRows(t, orders); b.Generation != 2 || len(b.Records) != 0 {
		t.Fatalf("the bound key's reset left the feed at %+v", b)
	}
	if at := checkpoint(t, fs, keyEU); at != ckpt(0, 1) {
		t.Fatalf("eu at %v after its reset", at)
	}
	if at := checkpoint(t, fs, keyUS); at != ckpt(4, 1) {
		t.Fatalf("us moved to %v by the bound key's reset", at)
	}
	// The view is the caller's: a plain reset leaves it.
	if v := e.viewRows(t); len(v) != 1 {
		t.Fatalf("view after reset: %v", v)
	}
	// A clear function that fails rolls the whole rebuild back.
	mustf(t, fs.Commit(ctx, keyEU, ckpt(0, 1), 2, e.putView(orders, "eu2", `{"n":2}`)), "commit eu")
	boom := errors.New("clear failed")
	if _, err := fs.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM `+e.view); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Rebuild with a failing clear: %v", err)
	}
	if b := e.feedRows(t, orders); b.Generation != 2 || len(b.Records) != 1 || checkpoint(t, fs, keyEU) != ckpt(2, 1) || len(e.viewRows(t)) != 2 {
		t.Fatalf("a failed rebuild left something behind: feed %+v", b)
	}
}

// committers are the two ways a commit of the bound key can be made: through
// the decorated store (feed lock before apply) and through the plain store
// (feed lock when apply writes the feed, checkpoint after apply).
func committers(e env, fs *pgread.FeedStore) []struct {
	name string
	s    read.ProjectionStore[pgx.Tx]
} {
	return []struct {
		name string
		s    read.ProjectionStore[pgx.Tx]
	}{{"decorated", fs}, {"plain", e.store}}
}

// A commit still in flight with the old checkpoint while a reset holds the
// feed lock waits for it, then loses its guard and rolls back with its feed
// rows; a commit holding the feed lock when a reset starts finishes first, and
// the reset then deletes what it wrote.
func TestInFlightCommitAndReset(t *testing.T) {
	t.Parallel()
	for _, committer := range []string{"decorated", "plain"} {
		t.Run(committer+"/reset first", func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := ctxFor(t, 60*time.Second)
			fs := withFeed(t, e, orders, keyEU)
			c := map[string]read.ProjectionStore[pgx.Tx]{"decorated": fs, "plain": e.store}[committer]
			mustf(t, fs.Commit(ctx, keyEU, ckpt(0, 0), 5, e.putView(orders, "a", `{"v":1}`)), "first commit")

			g := newGate(t)
			resetDone := make(chan error, 1)
			go func() {
				_, err := fs.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `DELETE FROM `+e.view); err != nil {
						return err
					}
					return g.park(ctx, tx)
				})
				resetDone <- err
			}()
			resetPID := g.parked(t)
			commitDone := make(chan error, 1)
			go func() { commitDone <- c.Commit(ctx, keyEU, ckpt(5, 0), 9, e.putView(orders, "b", `{"v":2}`)) }()
			waitBlockedBy(t, e.pool, resetPID) // the commit queued on the feed lock
			g.release()
			mustf(t, recv(t, resetDone, "the reset"), "reset")
			err := recv(t, commitDone, "the commit queued behind the reset")
			var sup *read.CheckpointSupersededError
			if !errors.As(err, &sup) || sup.Actual != ckpt(0, 1) {
				t.Fatalf("commit in flight across the reset: err = %v, want superseded at the origin of epoch 1", err)
			}
			b := e.feedRows(t, orders)
			if b.Generation != 2 || len(b.Records) != 0 {
				t.Fatalf("feed after the lost commit: %+v, want generation 2 and no rows", b)
			}
			if v := e.viewRows(t); len(v) != 0 {
				t.Fatalf("view after the lost commit: %v, want empty", v)
			}
			if at := checkpoint(t, fs, keyEU); at != ckpt(0, 1) {
				t.Fatalf("checkpoint %v, want the origin of epoch 1", at)
			}
		})
		t.Run(committer+"/commit first", func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := ctxFor(t, 60*time.Second)
			fs := withFeed(t, e, orders, keyEU)
			c := map[string]read.ProjectionStore[pgx.Tx]{"decorated": fs, "plain": e.store}[committer]
			mustf(t, fs.Commit(ctx, keyEU, ckpt(0, 0), 5, e.putView(orders, "a", `{"v":1}`)), "first commit")

			g := newGate(t)
			commitDone := make(chan error, 1)
			go func() {
				commitDone <- c.Commit(ctx, keyEU, ckpt(5, 0), 9, func(ctx context.Context, tx pgx.Tx) error {
					if err := e.putView(orders, "b", `{"v":2}`)(ctx, tx); err != nil {
						return err
					}
					return g.park(ctx, tx)
				})
			}()
			commitPID := g.parked(t)
			resetDone := make(chan error, 1)
			go func() { resetDone <- fs.ResetCheckpoint(ctx, keyEU) }()
			waitBlockedBy(t, e.pool, commitPID) // the reset queued on the feed lock
			g.release()
			mustf(t, recv(t, commitDone, "the commit that held the feed lock"), "the commit that held the feed lock")
			mustf(t, recv(t, resetDone, "the reset queued behind the commit"), "reset")
			b := e.feedRows(t, orders)
			if b.Generation != 2 || len(b.Records) != 0 {
				t.Fatalf("feed after the reset: %+v, want generation 2 and no rows", b)
			}
			if at := checkpoint(t, fs, keyEU); at != ckpt(0, 1) {
				t.Fatalf("checkpoint %v, want the origin of epoch 1", at)
			}
		})
	}
}

// Commit and reset racing 100 times, through both committers, with and
// without feed rows in the commit: never a deadlock, never an error but a
// lost guard, and never a feed row left from before the reset.
func TestCommitResetRace(t *testing.T) {
	t.Parallel()
	raceCommitReset(t, setup(t), 100)
}

func raceCommitReset(t *testing.T, e env, rounds int) {
	ctx := ctxFor(t, 90*time.Second)
	fs := withFeed(t, e, orders, keyEU)
	cs := committers(e, fs)
	landed := 0
	for i := range rounds {
		c := cs[i%2]
		epoch := int64(i)
		mustf(t, fs.Commit(ctx, keyEU, ckpt(0, epoch), 1, e.putView(orders, "old", `{"i":0}`)), "iteration %d: setup commit", i)
		apply := e.putView(orders, "new", `{"i":1}`)
		if i%4 >= 2 {
			apply = func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+e.view+` (key, doc) VALUES ('viewonly', '{}') ON CONFLICT (key) DO NOTHING`)
				return err
			}
		}
		start := make(chan struct{})
		commitDone, resetDone := make(chan error, 1), make(chan error, 1)
		go func() { <-start; commitDone <- c.s.Commit(ctx, keyEU, ckpt(1, epoch), 2, apply) }()
		go func() { <-start; resetDone <- fs.ResetCheckpoint(ctx, keyEU) }()
		close(start)
		cerr, rerr := recv(t, commitDone, "the racing commit"), recv(t, resetDone, "the racing reset")
		if rerr != nil {
			t.Fatalf("iteration %d (%s): reset: %v", i, c.name, rerr)
		}
		switch {
		case cerr == nil:
			landed++
		case !errors.Is(cerr, read.ErrCheckpointSuperseded):
			t.Fatalf("iteration %d (%s): commit: %v", i, c.name, cerr)
		}
		b := e.feedRows(t, orders)
		if b.Generation != feed.Generation(i+2) || len(b.Records) != 0 {
			t.Fatalf("iteration %d (%s): feed %+v, want generation %d and no rows", i, c.name, b, i+2)
		}
		if at := checkpoint(t, fs, keyEU); at != ckpt(0, epoch+1) {
			t.Fatalf("iteration %d: checkpoint %v, want the origin of epoch %d", i, at, epoch+1)
		}
	}
	t.Logf("%d of %d commits landed before their reset", landed, rounds)
}

// The first replay batch after a rebuild commits from the origin. When a
// second rebuild takes the feed lock before that commit, the commit waits
// for it and must then lose: the origin it read is the one before the second
// reset, not the one after it, and its rows are the projection's output the
// second rebuild was run to throw away. The same holds for the first batch of
// a projection that never committed, behind the first rebuild.
func TestCommitFromOriginAcrossRebuild(t *testing.T) {
	t.Parallel()
	for _, committer := range []string{"decorated", "plain"} {
		for _, rebuilds := range []int64{1, 0} {
			t.Run(fmt.Sprintf("%s/after %d rebuilds", committer, rebuilds), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				ctx := ctxFor(t, 60*time.Second)
				fs := withFeed(t, e, orders, keyEU)
				c := map[string]read.ProjectionStore[pgx.Tx]{"decorated": fs, "plain": e.store}[committer]
				clearView := func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `DELETE FROM `+e.view)
					return err
				}
				if rebuilds > 0 {
					mustf(t, fs.Commit(ctx, keyEU, ckpt(0, 0), 5, e.putView(orders, "a", `{"v":1}`)), "the first version's commit")
					_, err := fs.Rebuild(ctx, clearView)
					mustf(t, err, "the first rebuild")
				}
				// The batch reads the checkpoint: the origin.
				at := checkpoint(t, fs, keyEU)
				if at != ckpt(0, rebuilds) {
					t.Fatalf("checkpoint %v after %d rebuilds, want the origin of epoch %d", at, rebuilds, rebuilds)
				}

				g := newGate(t)
				resetDone := make(chan error, 1)
				go func() {
					_, err := fs.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
						if err := clearView(ctx, tx); err != nil {
							return err
						}
						return g.park(ctx, tx)
					})
					resetDone <- err
				}()
				resetPID := g.parked(t)
				commitDone := make(chan error, 1)
				go func() { commitDone <- c.Commit(ctx, keyEU, at, 3, e.putView(orders, "stale", `{"v":2}`)) }()
				waitBlockedBy(t, e.pool, resetPID) // the commit queued on the feed lock
				g.release()
				mustf(t, recv(t, resetDone, "the rebuild"), "the rebuild")
				err := recv(t, commitDone, "the commit queued behind the rebuild")
				var sup *read.CheckpointSupersededError
				if !errors.As(err, &sup) || sup.Expected != at || sup.Actual != ckpt(0, rebuilds+1) {
					t.Fatalf("commit from the origin read before the rebuild: err = %v, want superseded at the origin of epoch %d", err, rebuilds+1)
				}
				if b := e.feedRows(t, orders); b.Generation != feed.Generation(rebuilds+2) || len(b.Records) != 0 {
					t.Fatalf("feed after the lost commit: %+v, want generation %d and no rows", b, rebuilds+2)
				}
				if v := e.viewRows(t); len(v) != 0 {
					t.Fatalf("view after the lost commit: %v, want empty", v)
				}
				if at := checkpoint(t, fs, keyEU); at != ckpt(0, rebuilds+1) {
					t.Fatalf("checkpoint %v, want the origin of epoch %d", at, rebuilds+1)
				}
			})
		}
	}
}

// A commit through the bound store takes the feed lock before its apply
// runs, and a Rebuild takes it before its clear function runs, so the two
// cannot deadlock whatever rows apply and clear touch, in whatever order:
// the rebuild queues on the feed lock behind the whole commit. Here apply
// locks view row b, pauses, then touches row a and writes the feed, while
// clear deletes a, then b. Were the feed lock taken only by the feed write,
// or clear run before the rebuild's feed lock, the commit would wait for a
// row the rebuild holds and the rebuild for one the commit holds, and
// PostgreSQL would abort one of them as a deadlock within a second.
func TestBoundCommitLocksFeedBeforeApply(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 60*time.Second)
	fs := withFeed(t, e, orders, keyEU)
	// a is stored before b, so the clear's sequential DELETE locks a first.
	mustf(t, fs.Commit(ctx, keyEU, ckpt(0, 0), 5, func(ctx context.Context, tx pgx.Tx) error {
		if err := e.putView(orders, "a", `{"v":1}`)(ctx, tx); err != nil {
			return err
		}
		return e.putView(orders, "b", `{"v":1}`)(ctx, tx)
	}), "first commit")

	g := newGate(t)
	commitDone := make(chan error, 1)
	go func() {
		commitDone <- fs.Commit(ctx, keyEU, ckpt(5, 0), 9, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE `+e.view+` SET doc = '{"v":2}' WHERE key = 'b'`); err != nil {
				return err
			}
			if err := g.park(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE `+e.view+` SET doc = '{"v":2}' WHERE key = 'a'`); err != nil {
				return err
			}
			_, err := e.feeds.Write(ctx, tx, orders, []feed.Change{feed.Put("a", []byte(`{"v":2}`)), feed.Put("b", []byte(`{"v":2}`))})
			return err
		})
	}()
	commitPID := g.parked(t)
	resetDone := make(chan error, 1)
	go func() {
		_, err := fs.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM `+e.view)
			return err
		})
		resetDone <- err
	}()
	waitBlockedBy(t, e.pool, commitPID) // the rebuild waits for the commit
	g.release()
	mustf(t, recv(t, commitDone, "the commit"), "the commit the rebuild waited for")
	mustf(t, recv(t, resetDone, "the rebuild"), "the rebuild that waited for the commit")
	if b := e.feedRows(t, orders); b.Generation != 2 || len(b.Records) != 0 {
		t.Fatalf("feed after the rebuild: %+v, want generation 2 and no rows", b)
	}
	if v := e.viewRows(t); len(v) != 0 {
		t.Fatalf("view after the rebuild: %v, want empty", v)
	}
	if at := checkpoint(t, fs, keyEU); at != ckpt(0, 1) {
		t.Fatalf("checkpoint %v, want the origin of epoch 1", at)
	}
}
