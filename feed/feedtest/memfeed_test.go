package feedtest_test

import (
	"context"
	"encoding/json"
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
		SetMode: s.SetWriteMode,
		Seal:    s.SealRound,
	}
}

func TestRunFeedOnMemfeed(t *testing.T) { feedtest.RunFeed(t, newMemStore) }

func TestRunSyncStoreOnMemfeed(t *testing.T) { feedtest.RunSyncStore(t, newMemStore) }

func TestRunSinkOnMemfeed(t *testing.T) {
	feedtest.RunSink(t, func(t *testing.T) feedtest.SinkHarness {
		const reject = "reject me"
		s := memfeed.NewSink(memfeed.SinkOptions{Reject: func(r feed.Record) string {
			if r.Key == reject {
				return "refused by the test"
			}
			return ""
		}})
		return feedtest.SinkHarness{
			Sink: s,
			Contents: func(context.Context) (map[feed.Key]json.RawMessage, error) {
				return s.Documents(), nil
			},
			ConditionalOnSeq: true,
			RejectKey:        reject,
			AtomicPublish:    true, // Publish swaps one map for another
			// No MaxDocumentBytes, Fault or Reopen: memfeed has no size
			// limit, no server to lose and nothing outlives the process.
		}
	})
}
