package pgread_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

func TestStoreCommitGuard(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"cache", pgx.QueryExecModeCacheStatement}, {"simple", pgx.QueryExecModeSimpleProtocol}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := setupMode(t, m.mode)
			ctx := ctxFor(t, 30*time.Second)
			s := e.store
			if s.Durability() != read.Durable {
				t.Fatal("the Postgres store must say it is durable")
			}
			if at := checkpoint(t, s, keyEU); at != ckpt(0, 0) {
				t.Fatalf("fresh checkpoint at %v", at)
			}
			mustf(t, s.Commit(ctx, keyEU, ckpt(0, 0), 5, e.putView(orders, "a", `{"v":1}`)), "commit from Origin")
			// A rival that read Origin loses, and its view and feed writes roll back.
			err := s.Commit(ctx, keyEU, ckpt(0, 0), 3, e.putView(orders, "b", `{"v":2}`))
			var sup *read.CheckpointSupersededError
			if !errors.As(err, &sup) || sup.Actual != ckpt(5, 0) || sup.Expected != ckpt(0, 0) || sup.Key != keyEU {
				t.Fatalf("rival from Origin: err = %v, want superseded at 5", err)
			}
			// A rival that read a stale position loses too.
			if err := s.Commit(ctx, keyEU, ckpt(4, 0), 9, e.putView(orders, "b", `{"v":2}`)); !errors.Is(err, read.ErrCheckpointSuperseded) {
				t.Fatalf("rival from 4: err = %v", err)
			}
			if v := e.viewRows(t); len(v) != 1 {
				t.Fatalf("view after lost commits: %v", v)
			}
			if b := e.feedRows(t, orders); len(b.Records) != 1 || b.Head != 1 {
				t.Fatalf("feed after lost commits: %+v", b)
			}
			// A failing apply leaves everything where it was and is returned as is.
			boom := errors.New("view write failed")
			err = s.Commit(ctx, keyEU, ckpt(5, 0), 9, func(ctx context.Context, tx pgx.Tx) error {
				if err := e.putView(orders, "c", `{}`)(ctx, tx); err != nil {
					return err
				}
				return boom
			})
			if err != boom {
				t.Fatalf("err = %v, want apply's own error", err)
			}
			if at := checkpoint(t, s, keyEU); at != ckpt(5, 0) || len(e.viewRows(t)) != 1 || len(e.feedRows(t, orders).Records) != 1 {
				t.Fatalf("a failed apply left a trace: checkpoint %v", at)
			}
			mustf(t, s.Commit(ctx, keyEU, ckpt(5, 0), 9, nil), "commit 5→9")
			// Reset moves one key back to the origin of its next epoch.
			mustf(t, s.Commit(ctx, keyUS, ckpt(0, 0), 2, nil), "commit us")
			mustf(t, s.ResetCheckpoint(ctx, keyEU), "reset")
			if checkpoint(t, s, keyEU) != ckpt(0, 1) || checkpoint(t, s, keyUS) != ckpt(2, 0) {
				t.Fatal("reset moved the wrong checkpoint")
			}
			// The origin of epoch 0 is not the origin of epoch 1.
			if err := s.Commit(ctx, keyEU, ckpt(0, 0), 1, nil); !errors.As(err, &sup) || sup.Actual != ckpt(0, 1) {
				t.Fatalf("commit from the origin before the reset: err = %v, want superseded at the origin of epoch 1", err)
			}
			// A key that never moved gets its first epoch from its first reset.
			fresh := read.CheckpointKey{Projection: "fresh"}
			mustf(t, s.ResetCheckpoint(ctx, fresh), "reset a key that never moved")
			if at := checkpoint(t, s, fresh); at != ckpt(0, 1) {
				t.Fatalf("a key that never moved, reset: %v, want the origin of epoch 1", at)
			}
			// Nor the origin of epoch 1 that of epoch 2.
			mustf(t, s.ResetCheckpoint(ctx, keyEU), "reset at the origin")
			if err := s.Commit(ctx, keyEU, ckpt(0, 1), 1, nil); !errors.As(err, &sup) || sup.Actual != ckpt(0, 2) {
				t.Fatalf("commit from the origin of epoch 1 after a second reset: err = %v, want superseded at the origin of epoch 2", err)
			}
			mustf(t, s.Commit(ctx, keyEU, ckpt(0, 2), 1, nil), "commit after reset")
			if at := checkpoint(t, s, keyEU); at != ckpt(1, 2) {
				t.Fatalf("checkpoint %v after a commit in epoch 2", at)
			}
			// ResetCheckpointTx joins the caller's transaction: rolled back, it did nothing.
			tx, err := s.Begin(ctx)
			mustf(t, err, "begin")
			mustf(t, s.ResetCheckpointTx(ctx, tx, keyEU), "reset tx")
			mustf(t, tx.Rollback(ctx), "rollback")
			if at := checkpoint(t, s, keyEU); at != ckpt(1, 2) {
				t.Fatalf("a rolled back reset moved the checkpoint to %v", at)
			}
		})
	}
}

// Eight commits from the same checkpoint at once: exactly one lands, from
// the origin of a key that never moved, from a position, and from the origin
// after a reset.
func TestStoreConcurrentCommits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	for round := range 3 {
		// Round 0 starts from the zero checkpoint, round 1 from where round
		// 0's commit landed, round 2 from the origin of epoch 1.
		if round == 2 {
			mustf(t, e.store.ResetCheckpoint(ctx, keyUS), "reset")
		}
		from := checkpoint(t, e.store, keyUS)
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() {
				errs[i] = e.store.Commit(ctx, keyUS, from, from.Position+read.Position(i)+1, nil)
			})
		}
		wg.Wait()
		landed := 0
		for i, err := range errs {
			switch {
			case err == nil:
				landed++
				if at := checkpoint(t, e.store, keyUS); at != ckpt(from.Position+read.Position(i)+1, from.Epoch) {
					t.Fatalf("from %v: commit %d landed but the checkpoint is at %v", from, i, at)
				}
			case !errors.Is(err, read.ErrCheckpointSuperseded):
				t.Fatalf("from %v: commit %d: %v", from, i, err)
			}
		}
		if landed != 1 {
			t.Fatalf("from %v: %d commits landed, want exactly 1", from, landed)
		}
	}
}

func TestStoreTableDropped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 10*time.Second)
	s, err := pgread.NewStore(ctx, e.pool, pgread.Options{Schema: e.schema})
	mustf(t, err, "NewStore")
	// NewStore refuses a schema without the tables (startup_test.go); a table
	// dropped under a running store is an infrastructure fault like any other.
	_, err = e.pool.Exec(ctx, `DROP TABLE "`+e.schema+`"."read_checkpoints"`)
	mustf(t, err, "dropping the checkpoints")
	if _, err := s.ReadCheckpoint(ctx, keyEU); !errors.Is(err, feed.ErrUnreadable) {
		t.Fatalf("reading a table that does not exist: %v, want an UnreadableError", err)
	}
	if err := s.Commit(ctx, keyEU, ckpt(0, 0), 1, nil); !errors.Is(err, feed.ErrWriteFailed) {
		t.Fatalf("committing to a table that does not exist: %v, want a WriteFailedError", err)
	}
}
