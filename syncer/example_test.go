package syncer_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/syncer"
)

// A runner keeps a sink in step with a feed: it resyncs the sink first, then
// sends each commit as it lands, and releases its leases when its context
// ends.
func ExampleRunner() {
	ctx := context.Background()
	store, _ := memfeed.New(memfeed.Options{})
	orders := feed.FeedName("orders")
	search := memfeed.NewSink(memfeed.SinkOptions{})
	id := feed.SinkID{Feed: orders, Sink: "search"}

	_, _ = store.WriteCommitted(ctx, orders, []feed.Change{
		feed.Put("o1", []byte(`{"total":10}`)),
		feed.Put("o2", []byte(`{"total":20}`)),
	})

	runner, err := syncer.NewRunner(store, []syncer.Target{{ID: id, Sink: search}}, syncer.Options{
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = runner.Run(runCtx) }()

	waitFor := func(seq feed.Seq) {
		for runner.States()[0].Cursor.Seq < seq {
			time.Sleep(time.Millisecond)
		}
	}
	waitFor(2)
	res, _ := store.WriteCommitted(ctx, orders, []feed.Change{feed.Delete("o1"), feed.Put("o3", []byte(`{"total":30}`))})
	waitFor(res.Last)

	stop()
	<-done
	docs := search.Documents()
	for _, k := range slices.Sorted(maps.Keys(docs)) {
		fmt.Printf("%s %s\n", k, docs[k])
	}
	st := runner.States()[0]
	fmt.Println(st.Phase, st.Cursor, st.Resyncs, st.LeaseHeld)
	// Output:
	// o2 {"total":20}
	// o3 {"total":30}
	// stopped g1@4 1 false
}
