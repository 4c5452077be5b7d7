package pgread_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

// Rebuilding a read model: a projection of product events writes a view and
// a feed in one transaction per batch; a new version of the projection ships,
// and the rebuild empties the view, resets the checkpoint and moves the feed
// to its next generation in one transaction; the runner replays from the
// origin, and every sink's worker resyncs from the new generation.
func Example_rebuild() {
	// Bounded, as a job's context would be: a runner that can no longer
	// commit retries at once, and must not do so for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	url := os.Getenv("KAIROS_TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + hex.EncodeToString(b[:])
	defer pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)

	// Once per deployment: both packages' tables, and the application's view.
	if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pgread.Migrate(ctx, pool, pgread.Options{Schema: schema}); err != nil {
		fmt.Println(err)
		return
	}
	view := `"` + schema + `".products`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+view+` (id text PRIMARY KEY, doc jsonb NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}

	feeds, _ := pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema})
	defer feeds.Close()
	store, _ := pgread.NewStore(ctx, pool, pgread.Options{Schema: schema})
	events, _ := pgread.NewEventLog(ctx, pool, pgread.Options{Schema: schema})
	key := read.CheckpointKey{Projection: "products"}
	const products = feed.FeedName("products")
	bound, err := pgread.WithFeed(ctx, store, feeds, products, key)
	if err != nil {
		fmt.Println(err)
		return
	}

	// The projection: view rows and feed rows, in the commit's transaction.
	// Version 2 leaves discontinued products out of the view entirely.
	project := func(version int) read.Apply[pgx.Tx] {
		return func(ctx context.Context, tx pgx.Tx, batch []read.Event) error {
			var changes []feed.Change
			for _, e := range batch {
				if e.Type == "Discontinued" && version >= 2 {
					if _, err := tx.Exec(ctx, `DELETE FROM `+view+` WHERE id = $1`, e.Stream); err != nil {
						return err
					}
					changes = append(changes, feed.Delete(feed.Key(e.Stream)))
					continue
				}
				var doc string
				err := tx.QueryRow(ctx, `INSERT INTO `+view+` AS v (id, doc) VALUES ($1, $2::jsonb)
ON CONFLICT (id) DO UPDATE SET doc = v.doc || excluded.doc RETURNING doc::text`, e.Stream, string(e.Data)).Scan(&doc)
				if err != nil {
					return err
				}
				changes = append(changes, feed.Put(feed.Key(e.Stream), json.RawMessage(doc)))
			}
			_, err := feeds.Write(ctx, tx, products, changes)
			return err
		}
	}

	_, _ = events.AppendCommitted(ctx, "lamp", pgread.NoStream, []pgread.EventData{{Type: "Listed", Data: []byte(`{"price":30}`)}})
	_, _ = events.AppendCommitted(ctx, "stool", pgread.NoStream, []pgread.EventData{
		{Type: "Listed", Data: []byte(`{"price":12}`)},
		{Type: "Discontinued", Data: []byte(`{"discontinued":true}`)},
	})

	v1, _ := read.NewRunner[pgx.Tx](events, bound, key, project(1), read.RunnerOptions{})
	n, err := v1.CatchUp(ctx)
	fmt.Println("version 1 applied", n, "events", err)
	printFeed(ctx, feeds, products)

	// The rebuild: empty the view, reset the checkpoint, move the feed on.
	gen, err := bound.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM `+view)
		return err
	})
	fmt.Println("rebuilt to generation", gen, err)

	v2, _ := read.NewRunner[pgx.Tx](events, bound, key, project(2), read.RunnerOptions{})
	n, err = v2.CatchUp(ctx)
	fmt.Println("version 2 replayed", n, "events", err)
	printFeed(ctx, feeds, products)

	// Output:
	// version 1 applied 3 events <nil>
	// generation 1: lamp {"price": 30}
	// generation 1: stool {"price": 12, "discontinued": true}
	// rebuilt to generation 2 <nil>
	// version 2 replayed 3 events <nil>
	// generation 2: lamp {"price": 30}
	// generation 2: stool deleted
}

func printFeed(ctx context.Context, feeds *pgfeed.Store, f feed.FeedName) {
	batch, err := feeds.ReadBatch(ctx, f, 0, feed.BatchLimit{Records: 100})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range batch.Records {
		if r.Deleted() {
			fmt.Printf("generation %d: %s deleted\n", batch.Generation, r.Key)
			continue
		}
		fmt.Printf("generation %d: %s %s\n", batch.Generation, r.Key, r.Doc)
	}
}
