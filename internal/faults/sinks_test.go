package faults_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/bleve"
	"github.com/kairos-es/kairos/sinks/file"
	"github.com/kairos-es/kairos/sinks/pgtable"
	kredis "github.com/kairos-es/kairos/sinks/redis"
)

// target is one real sink a test mirrors the feed into: open makes the sink
// value a worker process uses (a new one per call where the sink allows
// several processes, the one shared value where it is single-process), read
// is what readers are served, probe the seq the live copy holds per key
// (tombstones kept as seqs count), for the recorder.
type target struct {
	name  feed.SinkName
	open  func(t testing.TB) feed.Sink
	read  func(t testing.TB) map[feed.Key]json.RawMessage
	probe func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error)
	// file is the file sink's file: its own lines are a log of what reached
	// it (checkFileLines). Empty for other sinks.
	file string
}

func randHex() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// pgtableTarget mirrors into a table of a schema of the test's own.
func pgtableTarget(t testing.TB, ctx context.Context) *target {
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	table := `"` + schema + `".orders`
	return &target{
		name: "table",
		open: func(t testing.TB) feed.Sink {
			s, err := pgtable.New(ctx, pool, pgtable.Options{Schema: schema, Table: "orders", Create: true, Columns: []pgtable.Column{{Name: "v", Type: pgtable.TypeInteger}}})
			if err != nil {
				t.Fatalf("pgtable.New: %v", err)
			}
			t.Cleanup(s.Close)
			return s
		},
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
			rows, _ := pool.Query(ctx, `SELECT key, doc::text FROM `+table+` WHERE doc IS NOT NULL`)
			m := map[feed.Key]json.RawMessage{}
			var k, d string
			if _, err := pgx.ForEachRow(rows, []any{&k, &d}, func() error { m[feed.Key(k)] = json.RawMessage(d); return nil }); err != nil {
				t.Fatalf("reading the table: %v", err)
			}
			return m
		},
		probe: func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error) {
			ks := make([]string, len(keys))
			for i, k := range keys {
				ks[i] = string(k)
			}
			rows, _ := pool.Query(ctx, `SELECT key, seq FROM `+table+` WHERE key = ANY ($1)`, ks)
			m := map[feed.Key]feed.Seq{}
			var k string
			var s int64
			_, err := pgx.ForEachRow(rows, []any{&k, &s}, func() error { m[feed.Key(k)] = feed.Seq(s); return nil })
			return m, err
		},
	}
}

func redisAddr() string {
	if a := os.Getenv("KAIROS_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// redisTarget mirrors into the test Redis under a prefix of the test's own,
// removed at cleanup. keys lists every key the test may have written, for
// read to find extras.
func redisTarget(t testing.TB, ctx context.Context, keys func() []feed.Key) *target {
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 8})
	t.Cleanup(func() { client.Close() })
	if err := client.Ping(ctx).Err(); err != nil {
		pgtest.Unavailable(t, "the test Redis", err)
	}
	prefix := "kfaults:" + randHex() + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Unlink(ctx, iter.Val())
		}
	})
	opts := kredis.Options{Prefix: prefix}
	return &target{
		name: "cache",
		open: func(t testing.TB) feed.Sink {
			s, err := kredis.New(ctx, client, opts)
			if err != nil {
				t.Fatalf("redis.New: %v", err)
			}
			t.Cleanup(s.Close)
			return s
		},
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
			r, err := kredis.NewReader(client, opts)
			if err != nil {
				t.Fatal(err)
			}
			ks := keys()
			docs, err := r.MGet(ctx, ks...)
			if err != nil {
				t.Fatalf("reading Redis: %v", err)
			}
			m := map[feed.Key]json.RawMessage{}
			for i, d := range docs {
				if d != nil {
					m[ks[i]] = d
				}
			}
			return m
		},
		probe: func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error) {
			ns, err := client.HGet(ctx, prefix+"meta", "live").Result()
			if err == goredis.Nil {
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			sk := make([]string, len(keys))
			for i, k := range keys {
				sk[i] = prefix + ns + ":{" + string(k) + "}:seq"
			}
			vals, err := client.MGet(ctx, sk...).Result()
			if err != nil {
				return nil, err
			}
			m := map[feed.Key]feed.Seq{}
			for i, v := range vals {
				if s, ok := v.(string); ok {
					n, _ := strconv.ParseInt(s, 10, 64)
					m[keys[i]] = feed.Seq(n)
				}
			}
			return m, nil
		},
	}
}

// fileTarget mirrors into a JSON-lines file in dir (a temporary one when
// empty).
func fileTarget(t testing.TB, dir string) *target {
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, "orders.jsonl")
	return &target{
		file: path,
		name: "export",
		open: func(t testing.TB) feed.Sink {
			s, err := file.New(file.Options{Path: path})
			if err != nil {
				t.Fatalf("file.New: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
			docs, err := file.Read(path)
			if err != nil {
				t.Fatalf("reading the file: %v", err)
			}
			return docs
		},
		probe: func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error) {
			s, err := file.Load(path)
			if err != nil {
				return nil, err
			}
			m := map[feed.Key]feed.Seq{}
			for _, k := range keys {
				if q, ok := s.Seqs[k]; ok {
					m[k] = q
				}
			}
			return m, nil
		},
	}
}

// bleveTarget mirrors into an index in dir (a temporary one when empty).
// The index is a single-process store: every worker of the test shares the
// one sink value, as workers of one process do.
func bleveTarget(t testing.TB, ctx context.Context, dir string, keys func() []feed.Key) *target {
	if dir == "" {
		dir = t.TempDir()
	}
	var once sync.Once
	var s *bleve.Sink
	open := func(t testing.TB) *bleve.Sink {
		once.Do(func() {
			var err error
			s, err = bleve.New(ctx, bleve.Options{Dir: dir})
			if err != nil {
				t.Fatalf("bleve.New: %v", err)
			}
			t.Cleanup(func() { s.Close() })
		})
		return s
	}
	return &target{
		name: "search",
		open: func(t testing.TB) feed.Sink { return open(t) },
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
			open(t)
			sr, err := bleve.NewSearcher(dir)
			if err != nil {
				t.Fatalf("bleve.NewSearcher: %v", err)
			}
			defer sr.Close()
			m := map[feed.Key]json.RawMessage{}
			for _, k := range keys() {
				d, ok, err := sr.Document(ctx, k)
				if err != nil {
					t.Fatalf("reading the index: %v", err)
				}
				if ok {
					m[k] = d
				}
			}
			if n, err := sr.DocCount(); err != nil || int(n) != len(m) {
				t.Errorf("the index counts %d documents (%v), %d found by key", n, err, len(m))
			}
			return m
		},
	}
}

// allKeys is every key the env ever wrote.
func (e *env) allKeys() []feed.Key {
	e.mu.Lock()
	defer e.mu.Unlock()
	ks := make([]feed.Key, 0, len(e.versions))
	for k := range e.versions {
		ks = append(ks, k)
	}
	return ks
}

// checkSinks is I1 over targets, once every worker has caught up.
func (e *env) checkSinks(t testing.TB, targets ...*target) {
	t.Helper()
	want, _ := live(e.ctx, t, e.store, e.feed)
	for _, tg := range targets {
		sameDocs(t, string(tg.name), tg.read(t), want, e.parked(tg.name))
	}
}

// readTable is the live documents of the orders table in schema, on the
// env's database.
func readTable(t testing.TB, e *env, schema string) map[feed.Key]json.RawMessage {
	t.Helper()
	rows, _ := e.pool.Query(e.ctx, `SELECT key, doc::text FROM "`+schema+`".orders WHERE doc IS NOT NULL`)
	m := map[feed.Key]json.RawMessage{}
	var k, d string
	if _, err := pgx.ForEachRow(rows, []any{&k, &d}, func() error { m[feed.Key(k)] = json.RawMessage(d); return nil }); err != nil {
		t.Fatalf("reading the table: %v", err)
	}
	return m
}
