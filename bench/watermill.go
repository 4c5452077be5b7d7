package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The peer: Watermill's SQL Pub/Sub on PostgreSQL, with its default schema
// and offsets adapters over pgx, configured as its documentation shows. Only
// the table names are qualified, so its tables land in the measurement's
// fresh schema; poll interval and batch size are its defaults unless a
// measurement says otherwise.

const wmTopic = "bench"

// wm is one Watermill publisher and subscriber on a schema.
type wm struct {
	pool    *pgxpool.Pool
	counter *queryCounter
	schema  wsql.DefaultPostgreSQLSchema
	offsets wsql.DefaultPostgreSQLOffsetsAdapter
	pub     *wsql.Publisher
	sub     *wsql.Subscriber
}

// newWatermill builds the peer on s. poll 0 and batch 0 mean Watermill's
// defaults (1 s and 100).
func (e *env) newWatermill(ctx context.Context, s *schema, poll time.Duration, batch int) (*wm, error) {
	w := &wm{counter: &queryCounter{}}
	p, err := e.pool(ctx, 8, w.counter) // room for P3's pacing writers beside the subscriber
	if err != nil {
		return nil, err
	}
	w.pool = p
	w.schema = wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return pgx.Identifier{s.name, "watermill_" + topic}.Sanitize() },
		SubscribeBatchSize:        batch,
	}
	w.offsets = wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return pgx.Identifier{s.name, "watermill_offsets_" + topic}.Sanitize()
		},
	}
	db := wsql.BeginnerFromPgx(p)
	w.sub, err = wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		PollInterval:     poll,
		SchemaAdapter:    w.schema,
		OffsetsAdapter:   w.offsets,
		InitializeSchema: true,
	}, watermill.NopLogger{})
	if err != nil {
		p.Close()
		return nil, err
	}
	if err := w.sub.SubscribeInitialize(wmTopic); err != nil {
		w.close()
		return nil, fmt.Errorf("watermill: initializing the schema: %w", err)
	}
	w.pub, err = wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: w.schema}, watermill.NopLogger{})
	if err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *wm) close() {
	if w.sub != nil {
		_ = w.sub.Close()
	}
	if w.pub != nil {
		_ = w.pub.Close()
	}
	w.pool.Close()
}

// message is message number i, its index in the metadata.
func wmMessage(i int) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), doc300(i))
	m.Metadata.Set("i", strconv.Itoa(i))
	return m
}

// publishBacklog publishes n messages, 1000 per insert.
func (w *wm) publishBacklog(n int) error {
	for c := 0; c < n; c += 1000 {
		msgs := make([]*message.Message, 0, 1000)
		for i := c; i < min(n, c+1000); i++ {
			msgs = append(msgs, wmMessage(i))
		}
		if err := w.pub.Publish(wmTopic, msgs...); err != nil {
			return err
		}
	}
	return nil
}

// consume subscribes and calls got for every message delivered, acking it at
// once (a no-op handler), until ctx ends.
func (w *wm) consume(ctx context.Context, got func(i int, at time.Time)) (<-chan struct{}, error) {
	ch, err := w.sub.Subscribe(ctx, wmTopic)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			at := time.Now()
			i, _ := strconv.Atoi(m.Metadata.Get("i"))
			got(i, at)
			m.Ack()
		}
	}()
	return done, nil
}
