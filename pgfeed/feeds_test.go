package pgfeed_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// Feeds names each feed Describe knows, once, in name order: feeds written
// to and feeds that only have a registered sink; nothing else.
func TestFeedsListsWhatDescribeKnows(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if got, err := s.Feeds(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Feeds of an empty schema = %v, %v", got, err)
	}
	for _, f := range []feed.FeedName{"orders", "accounts"} {
		if _, err := s.WriteCommitted(ctx, f, []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
			t.Fatal(err)
		}
	}
	// A sink registered on a feed never written to, and one more on a
	// written feed: each feed still once.
	for _, id := range []feed.SinkID{{Feed: "zeta", Sink: "s"}, {Feed: "orders", Sink: "s"}} {
		l, err := s.AcquireLease(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Feeds(ctx)
	if want := []feed.FeedName{"accounts", "orders", "zeta"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("Feeds = %v, %v; want %v", got, err, want)
	}
	for _, f := range got {
		if _, err := s.Describe(ctx, f); err != nil {
			t.Errorf("Describe(%s) of a listed feed: %v", f, err)
		}
	}
}
