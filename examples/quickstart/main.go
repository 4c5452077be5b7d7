// Command quickstart mirrors a products table into a directory of JSON files
// with Kairos, the way an application would: each change to the table writes
// the product's feed row in the same transaction, a sync runner keeps the
// directory in step, the application waits until the directory shows its
// writes, a product the directory refuses is parked and comes back once it is
// fixed, and a rebuild of the table's feed makes the runner fill a fresh
// directory and swap it in at once.
//
// It runs against PostgreSQL (KAIROS_DATABASE_URL, default
// postgres://postgres@127.0.0.1:5432/postgres), in a schema of its own,
// kairos_quickstart, which it drops and creates again. When no server answers
// it says so and runs the same steps on the in-memory store.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/syncer"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kairos-quickstart-")
	if err == nil {
		fmt.Fprintf(out, "the sink's directory: %s (removed at exit)\n", dir)
		err = run(ctx, os.Getenv("KAIROS_DATABASE_URL"), dir)
		_ = os.RemoveAll(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// product is a row of the application's table; its feed document is the row
// as JSON.
type product struct {
	ID    string  `json:"id"`
	Name  string  `json:"name"`
	Price float64 `json:"price"`
}

// backend is the application's table with its feed beside it: PostgreSQL, or
// memory when no server answers.
type backend interface {
	// store is the feed and sync store the runner works on.
	store() feed.Store
	// save writes the products and deletes the ids, in the table and the
	// feed, in one transaction.
	save(ctx context.Context, put []product, del []string) error
	// rebuild moves the feed to a new generation and writes every row of the
	// table into it again, in one transaction.
	rebuild(ctx context.Context) (feed.Generation, error)
	close()
}

const feedName feed.FeedName = "products"

func run(ctx context.Context, url, dir string) error {
	var db backend
	pg, err := openPostgres(ctx, url)
	if err != nil {
		fmt.Fprintf(out, "no PostgreSQL answered (%s);\nrunning on the in-memory store instead, which keeps nothing after exit\n\n", strings.Join(strings.Fields(err.Error()), " "))
		db = newMemory()
	} else {
		db = pg
	}
	defer db.close()

	sink, err := newDirSink(dir)
	if err != nil {
		return err
	}
	id := feed.SinkID{Feed: feedName, Sink: "files"}
	runner, err := syncer.NewRunner(db.store(), []syncer.Target{{ID: id, Sink: sink}}, syncer.Options{
		PollInterval: time.Second,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(rctx) }()
	defer func() { stop(); <-done }()

	show := func() error {
		if _, err := runner.WaitCaughtUp(ctx); err != nil {
			return err
		}
		lines, err := sink.Listing()
		if err != nil {
			return err
		}
		at, err := os.Readlink(sink.current())
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "   the directory serves (current -> %s):\n", at)
		for _, l := range lines {
			fmt.Fprintln(out, "     "+l)
		}
		d, err := db.store().Describe(ctx, feedName)
		if err != nil {
			return err
		}
		for _, s := range d.Sinks {
			fmt.Fprintf(out, "   describe %s: generation %d, head %d, cursor %v, pending %d, parked %d\n", s.Sink, d.Generation, d.Head, s.Cursor, s.Pending, len(s.Parked))
			for _, p := range s.Parked {
				fmt.Fprintf(out, "     parked %s@%d: %s\n", p.Key, p.Seq, p.Reason)
			}
		}
		fmt.Fprintln(out)
		return nil
	}

	step("1. the application saves three products; each feed row commits with its table row")
	if err := db.save(ctx, []product{{"p-1", "lamp", 30}, {"p-2", "", 12}, {"p-3", "chair", 80}}, nil); err != nil {
		return err
	}
	if err := show(); err != nil {
		return err
	}

	step("2. it renames p-1 and deletes p-3")
	if err := db.save(ctx, []product{{"p-1", "desk lamp", 30}}, []string{"p-3"}); err != nil {
		return err
	}
	if err := show(); err != nil {
		return err
	}

	step("3. it gives p-2 a name: the new version is taken and p-2 is no longer parked")
	if err := db.save(ctx, []product{{"p-2", "rug", 12}}, nil); err != nil {
		return err
	}
	if err := show(); err != nil {
		return err
	}

	step("4. the documents change shape (prices get a currency), so the feed is rebuilt from the\n   table: the runner fills a fresh directory and swaps it in")
	withCurrency = true
	gen, err := db.rebuild(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   the feed is at generation %d\n", gen)
	return show()
}

// withCurrency is the new document shape of step 4.
var withCurrency bool

// docOf is a product's feed document.
func docOf(p product) (json.RawMessage, error) {
	if withCurrency {
		return json.Marshal(struct {
			product
			Currency string `json:"currency"`
		}{p, "EUR"})
	}
	return json.Marshal(p)
}

// changes are the feed changes of a save.
func changes(put []product, del []string) ([]feed.Change, error) {
	var out []feed.Change
	for _, p := range put {
		doc, err := docOf(p)
		if err != nil {
			return nil, err
		}
		out = append(out, feed.Put(feed.Key(p.ID), doc))
	}
	for _, id := range del {
		out = append(out, feed.Delete(feed.Key(id)))
	}
	return out, nil
}

func step(s string) { fmt.Fprintln(out, s) }

// out is where the quickstart prints; the test swaps it for a buffer.
var out io.Writer = os.Stdout
