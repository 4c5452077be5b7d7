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
			if at := checkpoint(t, s, keyEU); at != read.Origin {
				t.Fatalf("fresh checkpoint at %d", at)
			}
			mustf(t, s.Commit(ctx, keyEU, read.Origin, 5, e.putView(orders, "a", `{"v":1}`)), "commit from Origin")
			// A rival that read Origin loses, and its view and feed writes roll back.
			err := s.Commit(ctx, keyEU, read.Origin, 3, e.putView(orders, "b", `{"v":2}`))
			var sup *read.CheckpointSupersededError
			if !errors.As(err, &sup) || sup.Actual != 5 || sup.Expected != read.Origin || sup.Key != keyEU {
				t.Fatalf("rival from Origin: err = %v, want superseded at 5", err)
			}
			// A rival that read a stale position loses too.
			if err := s.Commit(ctx, keyEU, 4, 9, e.putView(orders, "b", `{"v":2}`)); !errors.Is(err, read.ErrCheckpointSuperseded) {
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
			err = s.Commit(ctx, keyEU, 5, 9, func(ctx context.Context, tx pgx.Tx) error {
				if err := e.putView(orders, "c", `{}`)(ctx, tx); err != nil {
					return err
				}
				return boom
			})
			if err != boom {
				t.Fatalf("err = %v, want apply's own error", err)
			}
			if at := checkpoint(t, s, keyEU); at != 5 || len(e.viewRows(t)) != 1 || len(e.feedRows(t, orders).Records) != 1 {
				t.Fatalf("a failed apply left a trace: checkpoint %d", at)
			}
			mustf(t, s.Commit(ctx, keyEU, 5, 9, nil), "commit 5→9")
			// Reset moves one key back to Origin.
			mustf(t, s.Commit(ctx, keyUS, read.Origin, 2, nil), "commit us")
			mustf(t, s.ResetCheckpoint(ctx, keyEU), "reset")
			if checkpoint(t, s, keyEU) != read.Origin || checkpoint(t, s, keyUS) != 2 {
				t.Fatal("reset moved the wrong checkpoint")
			}
			mustf(t, s.Commit(ctx, keyEU, read.Origin, 1, nil), "commit after reset")
			// ResetCheckpointTx joins the caller's transaction: rolled back, it did nothing.
			tx, err := s.Begin(ctx)
			mustf(t, err, "begin")
			mustf(t, s.ResetCheckpointTx(ctx, tx, keyEU), "reset tx")
			mustf(t, tx.Rollback(ctx), "rollback")
			if at := checkpoint(t, s, keyEU); at != 1 {
				t.Fatalf("a rolled back reset moved the checkpoint to %d", at)
			}
		})
	}
}

// Eight commits from the same position at once: exactly one lands.
func TestStoreConcurrentCommits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 30*time.Second)
	for _, from := range []read.Position{read.Origin, 10} {
		if from != read.Origin {
			mustf(t, e.store.Commit(ctx, keyUS, read.Origin, from, nil), "setup")
		}
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() {
				errs[i] = e.store.Commit(ctx, keyUS, from, from+read.Position(i)+1, nil)
			})
		}
		wg.Wait()
		landed := 0
		for i, err := range errs {
			switch {
			case err == nil:
				landed++
				if at := checkpoint(t, e.store, keyUS); at != from+read.Position(i)+1 {
					t.Fatalf("from %d: commit %d landed but the checkpoint is at %d", from, i, at)
				}
			case !errors.Is(err, read.ErrCheckpointSuperseded):
				t.Fatalf("from %d: commit %d: %v", from, i, err)
			}
		}
		if landed != 1 {
			t.Fatalf("from %d: %d commits landed, want exactly 1", from, landed)
		}
		mustf(t, e.store.ResetCheckpoint(ctx, keyUS), "reset")
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
	if err := s.Commit(ctx, keyEU, 0, 1, nil); !errors.Is(err, feed.ErrWriteFailed) {
		t.Fatalf("committing to a table that does not exist: %v, want a WriteFailedError", err)
	}
}
