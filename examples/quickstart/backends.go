package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/pgfeed"
)

// schema is the quickstart's own: dropped and created again at every run.
// Its test runs in one of its own, so that two runs at once cannot meet.
var schema = "kairos_quickstart"

// pgBackend is the products table in PostgreSQL, with the feed beside it in
// the same schema.
type pgBackend struct {
	pool  *pgxpool.Pool
	feeds *pgfeed.Store
}

// openPostgres connects, within a few seconds, and lays out the schema.
func openPostgres(ctx context.Context, url string) (*pgBackend, error) {
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, err
	}
	b := &pgBackend{pool: pool}
	if err := b.setUp(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	fmt.Fprintf(out, "running on PostgreSQL, in schema %s\n\n", schema)
	return b, nil
}

func (b *pgBackend) setUp(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		return err
	}
	opts := pgfeed.Options{Schema: schema}
	if _, err := pgfeed.Migrate(ctx, b.pool, opts); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+schema+`.products (
	id    text PRIMARY KEY,
	name  text NOT NULL,
	price numeric NOT NULL
)`); err != nil {
		return err
	}
	var err error
	b.feeds, err = pgfeed.New(ctx, b.pool, opts)
	return err
}

func (b *pgBackend) store() feed.Store { return b.feeds }

func (b *pgBackend) save(ctx context.Context, put []product, del []string) error {
	ch, err := changes(put, del)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for _, p := range put {
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.products (id, name, price) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE SET name = excluded.name, price = excluded.price`, p.ID, p.Name, p.Price); err != nil {
				return err
			}
		}
		if len(del) > 0 {
			if _, err := tx.Exec(ctx, `DELETE FROM `+schema+`.products WHERE id = ANY($1)`, del); err != nil {
				return err
			}
		}
		// The feed rows join the same transaction: they commit with the
		// table's rows, or not at all.
		_, err := b.feeds.Write(ctx, tx, feedName, ch)
		return err
	})
}

// rebuild is the rebuild of a plain table's feed: in one transaction, ResetTx
// moves the feed to a new generation and empties it, and every row of the
// table is written into it again. Writers of the table wait on the feed lock
// ResetTx takes, so none is lost between the two.
func (b *pgBackend) rebuild(ctx context.Context) (feed.Generation, error) {
	var gen feed.Generation
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		if gen, err = b.feeds.ResetTx(ctx, tx, feedName); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT id, name, price::float8 FROM `+schema+`.products ORDER BY id`)
		if err != nil {
			return err
		}
		all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (product, error) {
			var p product
			return p, r.Scan(&p.ID, &p.Name, &p.Price)
		})
		if err != nil {
			return err
		}
		ch, err := changes(all, nil)
		if err != nil {
			return err
		}
		_, err = b.feeds.Write(ctx, tx, feedName, ch)
		return err
	})
	return gen, err
}

func (b *pgBackend) close() {
	b.feeds.Close()
	b.pool.Close()
}

// memBackend is the same table and feed in memory.
type memBackend struct {
	feeds *memfeed.Store
	mu    sync.Mutex
	table map[string]product
}

func newMemory() *memBackend {
	s, _ := memfeed.New(memfeed.Options{}) // zero options cannot be refused
	return &memBackend{feeds: s, table: map[string]product{}}
}

func (b *memBackend) store() feed.Store { return b.feeds }

func (b *memBackend) save(ctx context.Context, put []product, del []string) error {
	ch, err := changes(put, del)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	tx := b.feeds.Begin()
	if _, err := b.feeds.Write(ctx, tx, feedName, ch); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	for _, p := range put {
		b.table[p.ID] = p
	}
	for _, id := range del {
		delete(b.table, id)
	}
	return nil
}

func (b *memBackend) rebuild(ctx context.Context) (feed.Generation, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	tx := b.feeds.Begin()
	gen, err := tx.ResetFeed(ctx, feedName)
	if err != nil {
		tx.Rollback()
		return 0, err
	}
	all := make([]product, 0, len(b.table))
	for _, p := range b.table {
		all = append(all, p)
	}
	ch, err := changes(all, nil)
	if err == nil {
		_, err = b.feeds.Write(ctx, tx, feedName, ch)
	}
	if err != nil {
		tx.Rollback()
		return 0, err
	}
	return gen, tx.Commit()
}

func (b *memBackend) close() {}
