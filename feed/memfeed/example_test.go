package memfeed_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
)

// A walkthrough of one sink's life, with no worker in the way: write changes
// in a transaction, read them after the sink's cursor, move the cursor with a
// fenced compare-and-set that parks what the sink refused, then retry the
// parked record and see it come back after the cursor.
func Example() {
	ctx := context.Background()
	store, err := memfeed.New(memfeed.Options{})
	if err != nil {
		panic(err)
	}
	orders := feed.FeedName("orders")
	search := feed.SinkID{Feed: orders, Sink: "search"}

	// The application writes feed rows in the same transaction as its read
	// model: they become visible at commit, in commit order.
	tx := store.Begin()
	res, err := store.Write(ctx, tx, orders, []feed.Change{
		feed.Put("order-1", json.RawMessage(`{"total":10}`)),
		feed.Put("order-2", json.RawMessage(`{"total":-5}`)),
		feed.Put("order-3", json.RawMessage(`{"total":7}`)),
	})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	fmt.Printf("wrote seqs %d..%d in generation %d\n", res.First, res.Last, res.Generation)

	// A worker takes the sink's lease; only its holder can move the cursor.
	lease, err := store.AcquireLease(ctx, search)
	if err != nil {
		panic(err)
	}
	defer lease.Release(ctx)

	// The sink has no cursor yet, so everything after seq 0 is new to it.
	cursor, _ := store.ReadCursor(ctx, search)
	batch, _ := store.ReadBatch(ctx, orders, cursor.Seq, feed.BatchLimit{Records: 100})
	for _, r := range batch.Records {
		fmt.Printf("read %s@%d %s\n", r.Key, r.Seq, r.Doc)
	}

	// Suppose the sink refused order-2 (a negative total): the cursor moves
	// past it and the record is parked, in one atomic step.
	last := batch.Records[len(batch.Records)-1]
	err = store.CASCursor(ctx, feed.CursorMove{
		ID:       search,
		Holder:   lease.Holder(),
		Expected: cursor,
		Next:     feed.Cursor{Generation: batch.Generation, Seq: last.Seq},
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{{
			Key: "order-2", Seq: 2, Reason: "total must not be negative", ParkedAt: time.Now(),
		}}},
	})
	if err != nil {
		panic(err)
	}
	cursor, _ = store.ReadCursor(ctx, search)
	parked, _ := store.ReadParked(ctx, search)
	fmt.Printf("cursor %v, parked %s: %s\n", cursor, parked[0].Key, parked[0].Reason)

	// A move that names the wrong expected cursor loses, and changes nothing.
	err = store.CASCursor(ctx, feed.CursorMove{ID: search, Holder: lease.Holder(), Next: feed.Cursor{Generation: 1, Seq: 1}})
	fmt.Println("stale move superseded:", err != nil && errors.Is(err, feed.ErrCursorSuperseded))

	// An operator fixes the cause and retries: the row gets a fresh seq, so
	// it shows up again after the sink's cursor.
	retried, _ := store.RetryParked(ctx, search, "order-2")
	batch, _ = store.ReadBatch(ctx, orders, cursor.Seq, feed.BatchLimit{Records: 100})
	fmt.Printf("retried %v; after the cursor now: %s@%d\n", retried, batch.Records[0].Key, batch.Records[0].Seq)

	// Output:
	// wrote seqs 1..3 in generation 1
	// read order-1@1 {"total":10}
	// read order-2@2 {"total":-5}
	// read order-3@3 {"total":7}
	// cursor g1@3, parked order-2: total must not be negative
	// stale move superseded: true
	// retried true; after the cursor now: order-2@4
}
