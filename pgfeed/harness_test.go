package pgfeed_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// modes are the three pgx exec modes every suite runs in: cached prepared
// statements (the default), unprepared extended protocol, and the simple
// protocol a transaction pooler needs.
var modes = []struct {
	name string
	mode pgx.QueryExecMode
}{
	{"cache", pgx.QueryExecModeCacheStatement},
	{"exec", pgx.QueryExecModeExec},
	{"simple", pgx.QueryExecModeSimpleProtocol},
}

// db is one migrated schema on one pool.
type db struct {
	pool   *pgxpool.Pool
	schema string
}

// setup returns a fresh migrated schema on a pool in mode.
func setup(t *testing.T, url string, mode pgx.QueryExecMode) db {
	t.Helper()
	pool := pgtest.Pool(t, url, mode)
	schema := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db{pool: pool, schema: schema}
}

// quiet drops the warnings fault tests provoke on purpose.
var quiet = slog.New(slog.DiscardHandler)

// newStore builds a store on d, closed at cleanup.
func newStore(t testing.TB, d db, opts pgfeed.Options) *pgfeed.Store {
	t.Helper()
	opts.Schema = d.schema
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	s, err := pgfeed.New(t.Context(), d.pool, opts)
	if err != nil {
		t.Fatalf("pgfeed.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// suiteStores returns a feedtest.NewStore over one schema shared by every
// subtest (each uses feed names of its own).
func suiteStores(t *testing.T, url string, mode pgx.QueryExecMode, base pgfeed.Options) feedtest.NewStore {
	d := setup(t, url, mode)
	return func(st *testing.T, opts feedtest.StoreOptions) feedtest.StoreHarness {
		o := base
		o.Lease, o.Clock = opts.Lease, opts.Clock
		h := pgtest.Harness(newStore(st, d, o), d.pool)
		h.Store = armedStore{h.Store, opts.Clock}
		return h
	}
}

// armedStore waits, after each lease taken, until the lease's heartbeat has
// armed its first timer on the manual clock. leaserow.Start arms it from its
// goroutine, so without this a suite that skips the clock right after
// AcquireLease races the goroutine: one that computes its first wait after
// the skip renews at once (as a worker that fell behind does), and the lease
// outlives the skip. This is a wart of the engine (reported), not of pgfeed.
type armedStore struct {
	feed.SyncStore
	clock *feedtest.ManualClock
}

// SealedRange passes through, so the suites' concurrent runs find it.
func (s armedStore) SealedRange(ctx context.Context, f feed.FeedName, keys []feed.Key) (feed.Generation, feed.Seq, feed.Seq, bool, error) {
	return s.SyncStore.(*pgfeed.Store).SealedRange(ctx, f, keys)
}

func (s armedStore) AcquireLease(ctx context.Context, id feed.SinkID) (feed.Lease, error) {
	l, err := s.SyncStore.AcquireLease(ctx, id)
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if werr := s.clock.WaitForTimers(wctx, 1); werr != nil {
			return l, werr
		}
	}
	return l, err
}

func TestFeedSuite(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			feedtest.RunFeed(t, suiteStores(t, pgtest.URL(), m.mode, pgfeed.Options{}))
		})
	}
}

func TestSyncStoreSuite(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			feedtest.RunSyncStore(t, suiteStores(t, pgtest.URL(), m.mode, pgfeed.Options{}))
		})
	}
}
