package main

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

// demoBackend is where the demo's event log, read model and feed live:
// PostgreSQL, or memory when no server answers.
type demoBackend interface {
	store() feed.Store
	// appendOrders appends the orders' events to the log, in one
	// transaction.
	appendOrders(ctx context.Context, orders []orderEvents) error
	// projection is a runner of the projection's given version.
	projection(version int) (demoRunner, error)
	// rebuild empties the read model, resets the projection's checkpoint and
	// moves the feed to its next generation, at once.
	rebuild(ctx context.Context) (feed.Generation, error)
	describe(ctx context.Context) ([]feedView, error)
	close(ctx context.Context) error
}

type demoRunner interface {
	Run(ctx context.Context) error
	CatchUp(ctx context.Context) (int, error)
}

var demoKey = read.CheckpointKey{Projection: "orders"}

// pgDemo keeps everything in one schema of its own: pgfeed's and pgread's
// tables and the read model's, orders(id, doc).
type pgDemo struct {
	pool   *pgxpool.Pool
	schema string
	keep   bool
	feeds  *pgfeed.Store
	events *pgread.EventLog
	bound  *pgread.FeedStore
}

// openPGDemo connects within timeout and lays the schema out afresh.
func openPGDemo(ctx context.Context, url, schema string, keep bool, timeout time.Duration) (*pgDemo, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.ConnectTimeout = timeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, err
	}
	b := &pgDemo{pool: pool, schema: schema, keep: keep}
	if err := b.setUp(ctx); err != nil {
		b.feeds.Close()
		pool.Close()
		return nil, err
	}
	return b, nil
}

func (b *pgDemo) view() string { return pgx.Identifier{b.schema, "orders"}.Sanitize() }

func (b *pgDemo) setUp(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{b.schema}.Sanitize()+` CASCADE`); err != nil {
		return err
	}
	if _, err := pgfeed.Migrate(ctx, b.pool, pgfeed.Options{Schema: b.schema}); err != nil {
		return err
	}
	if _, err := pgread.Migrate(ctx, b.pool, pgread.Options{Schema: b.schema}); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+b.view()+` (id text PRIMARY KEY, doc jsonb NOT NULL)`); err != nil {
		return err
	}
	var err error
	if b.feeds, err = pgfeed.New(ctx, b.pool, pgfeed.Options{Schema: b.schema}); err != nil {
		return err
	}
	if b.events, err = pgread.NewEventLog(ctx, b.pool, pgread.Options{Schema: b.schema}); err != nil {
		return err
	}
	st, err := pgread.NewStore(ctx, b.pool, pgread.Options{Schema: b.schema})
	if err != nil {
		return err
	}
	b.bound, err = pgread.WithFeed(ctx, st, b.feeds, demoFeed, demoKey)
	return err
}

func (b *pgDemo) store() feed.Store { return b.feeds }

func (b *pgDemo) appendOrders(ctx context.Context, orders []orderEvents) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for _, o := range orders {
			evs := make([]pgread.EventData, len(o.events))
			for i, e := range o.events {
				evs[i] = pgread.EventData{Type: e.Type, Data: e.Data}
			}
			if _, err := b.events.Append(ctx, tx, o.stream, pgread.AnyVersion, evs); err != nil {
				return err
			}
		}
		return nil
	})
}

// projection reads the documents a batch touches, folds the batch into
// them, and writes the read model and the feed in the commit's transaction,
// which also moves the checkpoint.
func (b *pgDemo) projection(version int) (demoRunner, error) {
	apply := func(ctx context.Context, tx pgx.Tx, batch []read.Event) error {
		ids := streams(batch)
		rows, err := tx.Query(ctx, `SELECT id, doc FROM `+b.view()+` WHERE id = ANY($1::text[])`, ids)
		if err != nil {
			return err
		}
		current := map[string]*order{}
		for rows.Next() {
			var id string
			var doc []byte
			if err := rows.Scan(&id, &doc); err != nil {
				rows.Close()
				return err
			}
			o := new(order)
			if err := json.Unmarshal(doc, o); err != nil {
				rows.Close()
				return err
			}
			current[id] = o
		}
		if err := rows.Err(); err != nil {
			return err
		}
		next, touched, err := fold(batch, version, current)
		if err != nil {
			return err
		}
		ch, err := changesOf(next, touched)
		if err != nil {
			return err
		}
		var putIDs, putDocs, delIDs []string
		for i, id := range touched {
			if next[id] == nil {
				delIDs = append(delIDs, id)
			} else {
				putIDs, putDocs = append(putIDs, id), append(putDocs, string(ch[i].Doc))
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+b.view()+` (id, doc) SELECT * FROM unnest($1::text[], $2::jsonb[])
ON CONFLICT (id) DO UPDATE SET doc = excluded.doc`, putIDs, putDocs); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+b.view()+` WHERE id = ANY($1::text[])`, delIDs); err != nil {
			return err
		}
		_, err = b.feeds.Write(ctx, tx, demoFeed, ch)
		return err
	}
	return read.NewRunner[pgx.Tx](b.events, b.bound, demoKey, apply, read.RunnerOptions{Poll: 50 * time.Millisecond, Logger: discard})
}

func (b *pgDemo) rebuild(ctx context.Context) (feed.Generation, error) {
	return b.bound.Rebuild(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM `+b.view())
		return err
	})
}

func (b *pgDemo) describe(ctx context.Context) ([]feedView, error) {
	return describe(ctx, pgStore{Store: b.feeds, pool: b.pool}, demoFeed)
}

// close drops the schema unless told to keep it.
func (b *pgDemo) close(ctx context.Context) error {
	b.feeds.Close()
	defer b.pool.Close()
	if b.keep {
		return nil
	}
	_, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{b.schema}.Sanitize()+` CASCADE`)
	return err
}

// memDemo is the same story in memory: a slice for the log, a map for the
// read model, memfeed for the feed and read.MemoryStore for the checkpoint.
type memDemo struct {
	feeds *memfeed.Store
	ckpt  *read.MemoryStore

	mu     sync.Mutex
	log    []read.Event
	stream map[string]int64
	view   map[string]*order
}

func newMemDemo() *memDemo {
	s, _ := memfeed.New(memfeed.Options{}) // zero options cannot be refused
	return &memDemo{feeds: s, ckpt: read.NewMemoryStore(), stream: map[string]int64{}, view: map[string]*order{}}
}

func (b *memDemo) store() feed.Store { return b.feeds }

func (b *memDemo) appendOrders(_ context.Context, orders []orderEvents) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range orders {
		for _, e := range o.events {
			b.stream[o.stream]++
			b.log = append(b.log, read.Event{Position: read.Position(len(b.log) + 1), Stream: o.stream, Version: b.stream[o.stream], Type: e.Type, Data: e.Data, RecordedAt: time.Now()})
		}
	}
	return nil
}

// ReadAll makes memDemo the projection's event source.
func (b *memDemo) ReadAll(_ context.Context, after read.Position, limit int) ([]read.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	from := min(int(after), len(b.log))
	return slices.Clone(b.log[from:min(from+limit, len(b.log))]), nil
}

// projection writes the feed in a memfeed transaction inside the store's
// commit, and the map only once that transaction committed.
func (b *memDemo) projection(version int) (demoRunner, error) {
	apply := func(ctx context.Context, _ read.NoTx, batch []read.Event) error {
		b.mu.Lock()
		defer b.mu.Unlock()
		next, touched, err := fold(batch, version, b.view)
		if err != nil {
			return err
		}
		ch, err := changesOf(next, touched)
		if err != nil {
			return err
		}
		tx := b.feeds.Begin()
		if _, err := b.feeds.Write(ctx, tx, demoFeed, ch); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		for _, id := range touched {
			if next[id] == nil {
				delete(b.view, id)
			} else {
				b.view[id] = next[id]
			}
		}
		return nil
	}
	return read.NewRunner[read.NoTx](b, b.ckpt, demoKey, apply, read.RunnerOptions{Poll: 50 * time.Millisecond, Logger: discard})
}

// rebuild runs with the projection stopped, so the three steps need no
// transaction of their own.
func (b *memDemo) rebuild(ctx context.Context) (feed.Generation, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.ckpt.ResetCheckpoint(ctx, demoKey); err != nil {
		return 0, err
	}
	b.view = map[string]*order{}
	tx := b.feeds.Begin()
	gen, err := tx.ResetFeed(ctx, demoFeed)
	if err != nil {
		tx.Rollback()
		return 0, err
	}
	return gen, tx.Commit()
}

func (b *memDemo) describe(ctx context.Context) ([]feedView, error) {
	d, err := b.feeds.Describe(ctx, demoFeed)
	if err != nil {
		return nil, err
	}
	return []feedView{view(d, time.Now())}, nil
}

func (b *memDemo) close(context.Context) error { return nil }

func streams(batch []read.Event) []string {
	var ids []string
	seen := map[string]bool{}
	for _, e := range batch {
		if !seen[e.Stream] {
			seen[e.Stream] = true
			ids = append(ids, e.Stream)
		}
	}
	return ids
}
