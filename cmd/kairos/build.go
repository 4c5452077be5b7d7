package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"

	"github.com/blevesearch/bleve/v2/mapping"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	kbleve "github.com/kairos-es/kairos/sinks/bleve"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/sinks/kafka"
	"github.com/kairos-es/kairos/sinks/mysql"
	knats "github.com/kairos-es/kairos/sinks/nats"
	"github.com/kairos-es/kairos/sinks/pgtable"
	kredis "github.com/kairos-es/kairos/sinks/redis"
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
	"kafka": func(ctx context.Context, s config.Sink, id feed.SinkID, _ *slog.Logger) (builtSink, error) {
		c := s.Options.(*kafkaConfig)
		switch {
		case c.Partitions < 0 || c.Partitions > math.MaxInt32:
			return builtSink{}, fmt.Errorf("%s.partitions: is %d; want 1 to %d, or leave it out for the broker's default", s.Path, c.Partitions, math.MaxInt32)
		case c.ReplicationFactor < 0 || c.ReplicationFactor > math.MaxInt16:
			return builtSink{}, fmt.Errorf("%s.replication_factor: is %d; want 1 to %d, or leave it out for the broker's default", s.Path, c.ReplicationFactor, math.MaxInt16)
		}
		client, err := kafkaClient(s, c)
		if err != nil {
			return builtSink{}, err
		}
		sink, err := kafka.New(ctx, kafka.Options{Brokers: c.Brokers, Feed: id.Feed, Topic: c.Topic, Create: c.Create,
			Partitions: int32(c.Partitions), ReplicationFactor: int16(c.ReplicationFactor), MaxMessageBytes: c.MaxMessageBytes, ClientOptions: client})
		if err != nil {
			return builtSink{}, sinkErr(s, "", redactSecret(err, c.SASL.Password))
		}
		return builtSink{sink: sink, close: sink.Close}, nil
	},
	"bleve": func(ctx context.Context, s config.Sink, _ feed.SinkID, _ *slog.Logger) (builtSink, error) {
		c := s.Options.(*bleveConfig)
		opts := kbleve.Options{Dir: c.Dir, MaxDocumentBytes: c.MaxDocumentBytes, LockTimeout: c.LockTimeout}
		if c.MappingFile != "" {
			b, err := os.ReadFile(c.MappingFile)
			if err != nil {
				return builtSink{}, fmt.Errorf("%s.mapping_file: %w", s.Path, err)
			}
			m := mapping.NewIndexMapping()
			if err := json.Unmarshal(b, m); err != nil {
				return builtSink{}, fmt.Errorf("%s.mapping_file: not a bleve index mapping: %w", s.Path, err)
			}
			if err := m.Validate(); err != nil {
				return builtSink{}, fmt.Errorf("%s.mapping_file: %w", s.Path, err)
			}
			opts.Mapping = m
		}
		sink, err := kbleve.New(ctx, opts)
		if err != nil {
			return builtSink{}, sinkErr(s, "", err)
		}
		return builtSink{sink: sink, close: func() { _ = sink.Close() }}, nil
	},
	"nats": func(ctx context.Context, s config.Sink, id feed.SinkID, _ *slog.Logger) (builtSink, error) {
		c := s.Options.(*natsConfig)
		var nopts []nats.Option
		if c.CredsFile != "" {
			// The client reads the file only while it connects, and its
			// error then names neither the key nor the section: read it
			// here first.
			if _, err := os.ReadFile(c.CredsFile); err != nil {
				return builtSink{}, sinkErr(s, "creds_file", err)
			}
			nopts = append(nopts, nats.UserCredentials(c.CredsFile))
		}
		sink, err := knats.Connect(ctx, c.URL, knats.Options{Bucket: c.Bucket, Feed: string(id.Feed), Window: c.Window,
			AckTimeout: c.AckTimeout, Replicas: c.Replicas, MemoryStorage: c.MemoryStorage}, nopts...)
		if err != nil {
			return builtSink{}, sinkErr(s, "", redactErr(err, c.URL))
		}
		return builtSink{sink: sink, close: sink.Close}, nil
	},
	"file": func(_ context.Context, s config.Sink, _ feed.SinkID, _ *slog.Logger) (builtSink, error) {
		c := s.Options.(*fileConfig)
		sink, err := file.New(file.Options{Path: c.Path, MaxDocumentBytes: c.MaxDocumentBytes, CompactRatio: c.CompactRatio, CompactMinLines: c.CompactMinLines})
		if err != nil {
			return builtSink{}, sinkErr(s, "", err)
		}
		return builtSink{sink: sink, close: func() { _ = sink.Close() }}, nil
	},
	"redis": func(ctx context.Context, s config.Sink, _ feed.SinkID, _ *slog.Logger) (builtSink, error) {
		c := s.Options.(*redisConfig)
		sink, err := kredis.Open(ctx, c.URL, kredis.Options{Prefix: c.Prefix, Encoding: c.Encoding, TTL: c.TTL,
			TombstoneTTL: c.TombstoneTTL, MaxDocumentBytes: c.MaxDocumentBytes, ClientName: c.ClientName})
		if err != nil {
			return builtSink{}, sinkErr(s, "", redactErr(err, c.URL))
		}
		return builtSink{sink: sink, close: sink.Close}, nil
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

// kafkaClient is the client options a Kafka section asks for: TLS and SASL.
func kafkaClient(s config.Sink, c *kafkaConfig) ([]kgo.Opt, error) {
	var client []kgo.Opt
	if c.TLS {
		client = append(client, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	switch c.SASL.Mechanism {
	case "":
	case "plain":
		client = append(client, kgo.SASL(plain.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsMechanism()))
	case "scram-sha-256":
		client = append(client, kgo.SASL(scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha256Mechanism()))
	case "scram-sha-512":
		client = append(client, kgo.SASL(scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha512Mechanism()))
	default:
		return nil, fmt.Errorf("%s.sasl.mechanism: is not one of the choices; want plain, scram-sha-256 or scram-sha-512", s.Path)
	}
	return client, nil
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
