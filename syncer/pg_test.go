package syncer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// pgBackend runs the scenarios on PostgreSQL, in real time: a schema of the
// test's own, migrated, dropped at the end.
var pgBackend = backend{
	name: "pgfeed",
	new: func(t *testing.T) feedtest.StoreHarness {
		s, pool, _ := newPG(t, pgfeed.Options{})
		return pgHarness(s, pool)
	},
}

// pgAdvisoryBackend is pgBackend with advisory-lock leases, on a pool of
// their own.
var pgAdvisoryBackend = backend{
	name:      "pgfeed-advisory",
	leaseKind: syncer.AdvisoryLock,
	new: func(t *testing.T) feedtest.StoreHarness {
		leases := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
		s, pool, _ := newPG(t, pgfeed.Options{AdvisoryLock: leases})
		return pgHarness(s, pool)
	},
}

func init() { backends = append(backends, pgBackend, pgAdvisoryBackend) }

// newPG returns a store over a fresh migrated schema, on a pool of its own.
func newPG(t testing.TB, opts pgfeed.Options) (*pgfeed.Store, *pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pgfeed.Migrate(ctx, pool, schema, ""); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	opts.Schema = schema
	s, err := pgfeed.New(ctx, pool, opts)
	if err != nil {
		t.Fatalf("pgfeed.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s, pool, schema
}

func pgHarness(s *pgfeed.Store, pool *pgxpool.Pool) feedtest.StoreHarness {
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
	}
}
