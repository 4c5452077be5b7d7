package pgread_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
	"github.com/kairos-es/kairos/syncer"
)

// orderProjection applies order events to the view and the feed in the
// commit's transaction. minTotal is the "code change" a rebuild ships: the
// second version leaves small orders out of the view entirely and deletes
// cancelled ones, so its replay never writes again keys the first version
// wrote.
func (e env) orderProjection(f feed.FeedName, minTotal int, dropCancelled bool) read.Apply[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, events []read.Event) error {
		var changes []feed.Change
		for _, ev := range events {
			switch ev.Type {
			case "OrderPlaced":
				var p struct{ Total int }
				if err := json.Unmarshal(ev.Data, &p); err != nil {
					return err
				}
				if p.Total < minTotal {
					continue
				}
				var doc string
				if err := tx.QueryRow(ctx, `INSERT INTO `+e.view+` (key, doc) VALUES ($1, jsonb_build_object('total', $2::int, 'status', 'placed'))
ON CONFLICT (key) DO UPDATE SET doc = excluded.doc RETURNING doc::text`, ev.Stream, p.Total).Scan(&doc); err != nil {
					return err
				}
				changes = append(changes, feed.Put(feed.Key(ev.Stream), json.RawMessage(doc)))
			case "OrderCancelled":
				if dropCancelled {
					tag, err := tx.Exec(ctx, `DELETE FROM `+e.view+` WHERE key = $1`, ev.Stream)
					if err != nil {
						return err
					}
					if tag.RowsAffected() > 0 {
						changes = append(changes, feed.Delete(feed.Key(ev.Stream)))
					}
					continue
				}
				// The projection reads its view back: the case where an
				// un-emptied view would leak old rows into the rebuild.
				rows, err := tx.Query(ctx, `UPDATE `+e.view+` SET doc = jsonb_set(doc, '{status}', '"cancelled"') WHERE key = $1 RETURNING doc::text`, ev.Stream)
				if err != nil {
					return err
				}
				docs, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					return err
				}
				for _, d := range docs {
					changes = append(changes, feed.Put(feed.Key(ev.Stream), json.RawMessage(d)))
				}
			default:
				return fmt.Errorf("unknown event type %q", ev.Type)
			}
		}
		_, err := e.feeds.Write(ctx, tx, f, changes)
		return err
	}
}

func appendOrders(t *testing.T, l *pgread.EventLog, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		stream := fmt.Sprintf("order-%03d", i)
		events := []pgread.EventData{{Type: "OrderPlaced", Data: json.RawMessage(fmt.Sprintf(`{"total":%d}`, i))}}
		if i%5 == 0 {
			events = append(events, pgread.EventData{Type: "OrderCancelled", Data: json.RawMessage(`{}`)})
		}
		if _, err := l.AppendCommitted(t.Context(), stream, pgread.NoStream, events); err != nil {
			t.Fatalf("append %s: %v", stream, err)
		}
	}
}

func decode(t *testing.T, docs map[string]string) map[string]any {
	t.Helper()
	out := make(map[string]any, len(docs))
	for k, d := range docs {
		var v any
		if err := json.Unmarshal([]byte(d), &v); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		out[k] = v
	}
	return out
}

func sinkDocs(t *testing.T, s *memfeed.Sink) map[string]any {
	t.Helper()
	raw := map[string]string{}
	for k, d := range s.Documents() {
		raw[string(k)] = string(d)
	}
	return decode(t, raw)
}

// Events → projection → feed → sinks through the sync driver; then a rebuild
// with a changed projection: every sink resyncs into a fresh copy of the new
// generation and publishes it, and ends equal to the rebuilt view, without the
// records the replay never wrote again.
func TestRebuildEndToEnd(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := ctxFor(t, 90*time.Second)
	fs := withFeed(t, e, orders, keyEU)

	appendOrders(t, e.log, 0, 30)
	v1, err := read.NewRunner(e.log, read.ProjectionStore[pgx.Tx](fs), keyEU, e.orderProjection(orders, 0, false), read.RunnerOptions{Batch: 7})
	mustf(t, err, "runner v1")
	if n, err := v1.CatchUp(ctxFor(t, 20*time.Second)); err != nil || n != 36 {
		t.Fatalf("v1 CatchUp = %d, %v; want the 36 events", n, err)
	}

	sinks := []*memfeed.Sink{memfeed.NewSink(memfeed.SinkOptions{}), memfeed.NewSink(memfeed.SinkOptions{})}
	targets := []syncer.Target{{ID: feed.SinkID{Feed: orders, Sink: "search"}, Sink: sinks[0]}, {ID: feed.SinkID{Feed: orders, Sink: "cache"}, Sink: sinks[1]}}
	drv, err := syncer.NewRunner(e.feeds, targets, syncer.Options{PollInterval: 200 * time.Millisecond, BackoffMin: 20 * time.Millisecond, LeaseRetry: 100 * time.Millisecond, Logger: quiet})
	mustf(t, err, "syncer")
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = drv.Run(runCtx) }()
	t.Cleanup(func() { stop(); wg.Wait() })

	waitSinks := func(gen feed.Generation) map[string]any {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			view := decode(t, e.viewRows(t))
			head, err := e.feeds.Head(ctx, orders)
			mustf(t, err, "head")
			done := true
			for i, s := range sinks {
				st := drv.States()[i]
				if s.Generation() != gen || st.Cursor != (feed.Cursor{Generation: gen, Seq: head}) || !reflect.DeepEqual(sinkDocs(t, s), view) {
					done = false
				}
			}
			if done {
				return view
			}
			if time.Now().After(deadline) {
				t.Fatalf("sinks not in step with the view at generation %d: view %d docs, sinks %d/%d docs at generations %d/%d, states %+v",
					gen, len(view), len(sinks[0].Documents()), len(sinks[1].Documents()), sinks[0].Generation(), sinks[1].Generation(), drv.States())
			}
			time.Sleep(10 * time.Millisecond) // polling an observable condition
		}
	}
	before := waitSinks(1)
	if len(before) != 30 || before["order-003"] == nil {
		t.Fatalf("the first version's view has %d orders, want all 30 with the small ones", len(before))
	}

	// The rebuild: the new version ships, the view is emptied in the reset's
	// transaction, the feed moves to generation 2, and the replay runs while
	// new events keep arriving and the workers keep running.
	gen, err := fs.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM `+e.view)
		return err
	})
	mustf(t, err, "rebuild")
	if gen != 2 {
		t.Fatalf("generation %d after the rebuild, want 2", gen)
	}
	v2, err := read.NewRunner(e.log, read.ProjectionStore[pgx.Tx](fs), keyEU, e.orderProjection(orders, 10, true), read.RunnerOptions{Batch: 5})
	mustf(t, err, "runner v2")
	appendOrders(t, e.log, 30, 35)
	if n, err := v2.CatchUp(ctxFor(t, 20*time.Second)); err != nil || n != 42 {
		t.Fatalf("v2 CatchUp = %d, %v; want all 42 events replayed", n, err)
	}
	after := waitSinks(2)
	for k := range after {
		var i int
		fmt.Sscanf(k, "order-%d", &i)
		if i < 10 || i%5 == 0 {
			t.Fatalf("rebuilt view holds %s, which the new version never writes", k)
		}
	}
	if len(after) != 20 { // 10..34 without the 5 cancelled ones
		t.Fatalf("rebuilt view has %d orders, want 20", len(after))
	}
	for i, st := range drv.States() {
		if st.Resyncs != 2 {
			t.Errorf("sink %d published %d resyncs, want 2 (the first sync and the rebuild)", i, st.Resyncs)
		}
	}
}
