package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/sinks/mysql"
	"github.com/kairos-es/kairos/sinks/pgtable"
	"github.com/kairos-es/kairos/sinks/webhook"
)

// builtSink is a sink the daemon built from its section, and how to let go
// of what it opened for it.
type builtSink struct {
	sink  feed.Sink
	close func()
}

// builders build each sink type from its decoded section; a type of
// sinkTypes without a builder is a programming error, caught by a test.
var builders = map[string]func(ctx context.Context, s config.Sink, id feed.SinkID, log *slog.Logger) (builtSink, error){
	"pgtable": func(ctx context.Context, s config.Sink, _ feed.SinkID, _ *slog.Logger) (builtSink, error) {
		c := s.Options.(*pgtableConfig)
		pool, err := pgxpool.New(ctx, c.URL)
		if err != nil {
			return builtSink{}, sinkErr(s, "url", redactErr(err, c.URL))
		}
		opts := pgtable.Options{Schema: c.Schema, Table: c.Table, KeyColumn: c.KeyColumn, SeqColumn: c.SeqColumn, DocColumn: c.DocColumn, Create: c.Create}
		for _, col := range c.Columns {
			opts.Columns = append(opts.Columns, pgtable.Column{Name: col.Name, Path: col.Path, Type: col.Type})
		}
		sink, err := pgtable.New(ctx, pool, opts)
		if err != nil {
			pool.Close()
			return builtSink{}, sinkErr(s, "", redactErr(err, c.URL))
		}
		return builtSink{sink: sink, close: func() { sink.Close(); pool.Close() }}, nil
	},
	"mysql": func(ctx context.Context, s config.Sink, _ feed.SinkID, _ *slog.Logger) (builtSink, error) {
		c := s.Options.(*mysqlConfig)
		sink, err := mysql.Open(ctx, c.DSN, mysql.Options{Table: c.Table, Create: c.Create, NoJSONCheck: c.NoJSONCheck})
		if err != nil {
			return builtSink{}, sinkErr(s, "", redactErr(err, c.DSN))
		}
		return builtSink{sink: sink, close: func() { _ = sink.Close() }}, nil
	},
	"webhook": func(ctx context.Context, s config.Sink, id feed.SinkID, log *slog.Logger) (builtSink, error) {
		c := s.Options.(*webhookConfig)
		sink, err := webhook.New(ctx, webhook.Options{URL: c.URL, Secrets: c.Secrets, Feed: id.Feed, Sink: id.Sink,
			Timeout: c.Timeout, MaxBodyBytes: c.MaxBodyBytes, AllowLoopback: c.AllowLoopback, AllowPrivate: c.AllowPrivate, Logger: log})
		if err != nil {
			return builtSink{}, sinkErr(s, "", err)
		}
		return builtSink{sink: sink, close: func() { _ = sink.Close() }}, nil
	},
}

// sinkErr places a sink's refusal in the file: an *feed.InvalidError's field
// (options.table, or the sink package's own name for it) becomes the key
// under the sink's section, so the operator reads
// feeds.orders.sinks.cache.table.
func sinkErr(s config.Sink, key string, err error) error {
	var inv *feed.InvalidError
	if errors.As(err, &inv) {
		field := inv.Field
		if i := strings.IndexByte(field, '.'); i >= 0 {
			field = field[i+1:]
		}
		msg := inv.Reason
		if inv.Err != nil {
			msg += ": " + inv.Err.Error()
		}
		return fmt.Errorf("%s.%s: %s", s.Path, field, msg)
	}
	if key != "" {
		return fmt.Errorf("%s.%s: %w", s.Path, key, err)
	}
	return fmt.Errorf("%s (type %s): %w", s.Path, s.Type, err)
}
