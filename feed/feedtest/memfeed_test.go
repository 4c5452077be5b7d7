package feedtest_test

import (
	"context"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/feed/memfeed"
)

// newMemStore is the suites' harness for the in-memory oracle, which must pass
// every subtest.
func newMemStore(t *testing.T, opts feedtest.StoreOptions) feedtest.StoreHarness {
	s, err := memfeed.New(memfeed.Options{Lease: opts.Lease, Clock: opts.Clock})
	if err != nil {
		t.Fatalf("memfeed.New: %v", err)
	}
	return feedtest.StoreHarness{
		Store:  s,
		Reader: s,
		Write:  s.WriteCommitted,
		Rebuild: func(ctx context.Context, f feed.FeedName) (feed.Generation, error) {
			tx := s.Begin()
			defer tx.Rollback()
			g, err := tx.ResetFeed(ctx, f)
			if err != nil {
				return 0, err
			}
			return g, tx.Commit()
		},
	}
}

func TestRunFeedOnMemfeed(t *testing.T) { feedtest.RunFeed(t, newMemStore) }

func TestRunSyncStoreOnMemfeed(t *testing.T) { feedtest.RunSyncStore(t, newMemStore) }
