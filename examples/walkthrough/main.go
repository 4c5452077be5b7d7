// Command walkthrough walks through one feed and one sink on the in-memory
// backend, printing each step: the application writes changes in its
// transaction, a worker takes the sink's lease, reads what is new after the
// sink's cursor, sends it, moves the cursor past a record the sink refused
// (parking it), and an operator retries the parked record once its cause is
// fixed. No server is needed.
//
//	go run ./examples/walkthrough
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	store, err := memfeed.New(memfeed.Options{})
	if err != nil {
		return err
	}
	products := feed.FeedName("products")
	id := feed.SinkID{Feed: products, Sink: "search-index"}

	// The sink refuses documents without a name: the kind of record-level
	// refusal that parks one record and lets the rest through.
	fixed := false
	sink := memfeed.NewSink(memfeed.SinkOptions{Reject: func(r feed.Record) string {
		var doc struct{ Name string }
		if r.Doc != nil && json.Unmarshal(r.Doc, &doc) == nil && doc.Name == "" && !fixed {
			return "a product needs a name to be indexed"
		}
		return ""
	}})

	step("1. the application commits three products and their feed rows in one transaction")
	tx := store.Begin()
	res, err := store.Write(ctx, tx, products, []feed.Change{
		feed.Put("p-1", json.RawMessage(`{"name":"lamp","price":30}`)),
		feed.Put("p-2", json.RawMessage(`{"name":"","price":12}`)),
		feed.Put("p-3", json.RawMessage(`{"name":"chair","price":80}`)),
	})
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Fprintf(out, "   seqs %d..%d, generation %d\n", res.First, res.Last, res.Generation)

	step("2. a worker takes the lease of " + id.String() + ", then syncs")
	lease, err := store.AcquireLease(ctx, id)
	if err != nil {
		return err
	}
	defer lease.Release(ctx)
	if _, err := store.AcquireLease(ctx, id); errors.Is(err, feed.ErrLeaseHeld) {
		fmt.Fprintln(out, "   a rival worker is refused:", err)
	}

	if err := syncOnce(ctx, store, sink, lease); err != nil {
		return err
	}

	step("3. the application deletes p-3 and renames p-1")
	if _, err := store.WriteCommitted(ctx, products, []feed.Change{
		feed.Delete("p-3"),
		feed.Put("p-1", json.RawMessage(`{"name":"desk lamp","price":30}`)),
	}); err != nil {
		return err
	}
	if err := syncOnce(ctx, store, sink, lease); err != nil {
		return err
	}

	step("4. the cause is fixed; an operator retries the parked record")
	fixed = true
	retried, err := store.RetryParked(ctx, id, "p-2")
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "   retried p-2:", retried)
	if err := syncOnce(ctx, store, sink, lease); err != nil {
		return err
	}

	step("5. the sink now mirrors the feed")
	for _, k := range []feed.Key{"p-1", "p-2", "p-3"} {
		if doc, ok := sink.Documents()[k]; ok {
			fmt.Fprintf(out, "   %s = %s\n", k, doc)
		} else {
			fmt.Fprintf(out, "   %s is absent\n", k)
		}
	}
	d, err := store.Describe(ctx, products)
	if err != nil {
		return err
	}
	s := d.Sinks[0]
	fmt.Fprintf(out, "   describe: head %d, cursor %v, pending %d, parked %d\n", d.Head, s.Cursor, s.Pending, len(s.Parked))
	return nil
}

// syncOnce is one incremental step of a worker, spelled out: read after the
// cursor, check the lease, send, then move the cursor, parking what the sink
// refused and unparking what it accepted, in one fenced compare-and-set. The
// syncer package runs this loop for real, with resyncs, backoff and wake-ups.
func syncOnce(ctx context.Context, store *memfeed.Store, sink *memfeed.Sink, lease feed.Lease) error {
	id := lease.ID()
	cursor, err := store.ReadCursor(ctx, id)
	if err != nil {
		return err
	}
	batch, err := store.ReadBatch(ctx, id.Feed, cursor.Seq, feed.BatchLimit{Records: 100})
	if err != nil {
		return err
	}
	step(fmt.Sprintf("   sync: read after cursor %v: %d record(s)", cursor, len(batch.Records)))
	if len(batch.Records) == 0 {
		return nil
	}
	for _, r := range batch.Records {
		if r.Deleted() {
			fmt.Fprintf(out, "   %s@%d deleted\n", r.Key, r.Seq)
		} else {
			fmt.Fprintf(out, "   %s@%d %s\n", r.Key, r.Seq, r.Doc)
		}
	}
	if err := lease.EnsureHeld(ctx); err != nil {
		return err
	}
	rejected, err := sink.Apply(ctx, batch.Records)
	if err != nil {
		return err
	}
	change := feed.ParkChange{}
	refused := map[feed.Key]bool{}
	for _, r := range rejected {
		refused[r.Key] = true
		change.Park = append(change.Park, feed.ParkedRecord{Key: r.Key, Seq: r.Seq, Reason: feed.CleanReason(r.Reason), ParkedAt: time.Now()})
		fmt.Fprintf(out, "   the sink refused %s: parked (%s)\n", r.Key, r.Reason)
	}
	for _, r := range batch.Records {
		if !refused[r.Key] {
			change.Unpark = append(change.Unpark, r.Key)
		}
	}
	next := feed.Cursor{Generation: batch.Generation, Seq: batch.Records[len(batch.Records)-1].Seq}
	if err := store.CASCursor(ctx, feed.CursorMove{ID: id, Holder: lease.Holder(), Expected: cursor, Next: next, Parked: change}); err != nil {
		return err
	}
	fmt.Fprintf(out, "   cursor moved to %v\n", next)
	return nil
}

func step(s string) { fmt.Fprintln(out, s) }

// out is where the walkthrough prints; the test swaps it for a buffer.
var out io.Writer = os.Stdout
