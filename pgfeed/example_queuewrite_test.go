package pgfeed_test

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// A request handler of an outbox-style application writes its row and the
// feed's in one batch, one round trip, outside an explicit transaction: the
// batch is one implicit transaction, so the two commit together or not at
// all. The upsert locks the order's row before the feed write, as the rule
// for writing the feed yourself asks.
func ExampleStore_QueueWrite() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		panic(err)
	}
	feeds, err := pgfeed.New(ctx, pool, pgfeed.Options{})
	if err != nil {
		panic(err)
	}
	placeOrder := func(ctx context.Context, id string, total int) (feed.WriteResult, error) {
		doc, err := json.Marshal(map[string]any{"id": id, "total": total})
		if err != nil {
			return feed.WriteResult{}, err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO orders (id, total) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET total = excluded.total`, id, total)
		var res feed.WriteResult
		if err := feeds.QueueWrite(b, "orders", []feed.Change{feed.Put(feed.Key(id), doc)},
			func(r feed.WriteResult) { res = r }); err != nil {
			return feed.WriteResult{}, err // a bad key or document: nothing was sent
		}
		if err := pool.SendBatch(ctx, b).Close(); err != nil {
			return feed.WriteResult{}, err // neither the row nor the feed write committed
		}
		return res, nil // for syncer.WaitApplied, to read one's own write
	}
	_, _ = placeOrder(ctx, "order-1", 42)
}
