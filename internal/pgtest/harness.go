package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// Harness adapts a pgfeed store over pool to feedtest's StoreHarness: writes
// commit at once, and a rebuild is ResetTx in a transaction of its own.
func Harness(s *pgfeed.Store, pool *pgxpool.Pool) feedtest.StoreHarness {
	return feedtest.StoreHarness{
		Store:  s,
		Reader: s,
		Write:  s.WriteCommitted,
		Rebuild: func(ctx context.Context, f feed.FeedName) (feed.Generation, error) {
			var g feed.Generation
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				g, err = s.ResetTx(ctx, tx, f)
				return err
			})
			return g, err
		},
		SetMode: s.SetWriteMode,
		Seal:    s.SealRound,
	}
}

// FeedStore is a migrated pgfeed store in a schema of the test's own, on a
// pool of its own, closed at cleanup: the feed side of a test that drives a
// sink end to end. opts' Schema is filled in.
func FeedStore(t testing.TB, ctx context.Context, opts pgfeed.Options) (*pgfeed.Store, *pgxpool.Pool) {
	t.Helper()
	pool := Pool(t, URL(), pgx.QueryExecModeCacheStatement)
	opts.Schema = Schema(t)
	if _, err := pgfeed.Migrate(ctx, pool, opts); err != nil {
		t.Fatal(err)
	}
	store, err := pgfeed.New(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	return store, pool
}
