package faults_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
	// build, where set, makes a sink value of the target's own and its
	// close, for a test that closes sinks before its end (the embedded
	// sinks, whose open files keep a disk from going read-only).
	build func() (feed.Sink, func(), error)
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
		build: func() (feed.Sink, func(), error) {
			s, err := file.New(file.Options{Path: path})
			if err != nil {
				return nil, nil, err
			}
			return s, func() { s.Close() }, nil
		},
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
// The index is a single-process store: open gives every worker of the test
// the one sink value, as workers of one process share it; build makes a
// value of its own, over the same open index while another is open.
//
// The probe reads two things the index holds for each key: the seq its
// guard keeps (Searcher.Seqs, a deletion's included), and the seq of the
// document it serves, which the documents do not carry (they carry the
// test's version "v"), so the target notes, for every record that reaches
// the sink, which seq each key's version came with. A key's probed seq is
// the lower of the two: the served document's seq and the guard's each only
// ever rise, so their lower does too, and a stale document served, or a
// guard taken back, makes it fall (I2).
func bleveTarget(t testing.TB, ctx context.Context, dir string, keys func() []feed.Key) *target {
	if dir == "" {
		dir = t.TempDir()
	}
	var once sync.Once
	var s *bleve.Sink
	vs := &versionSeqs{m: map[feed.Key]map[int]feed.Seq{}}
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
		open: func(t testing.TB) feed.Sink { return &noting{Sink: open(t), vs: vs} },
		build: func() (feed.Sink, func(), error) {
			s, err := bleve.New(ctx, bleve.Options{Dir: dir})
			if err != nil {
				return nil, nil, err
			}
			return &noting{Sink: s, vs: vs}, func() { s.Close() }, nil
		},
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
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
		probe: func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error) {
			sr, err := bleve.NewSearcher(dir)
			if err != nil {
				return nil, err
			}
			defer sr.Close()
			m, err := sr.Seqs(ctx, keys...)
			if err != nil {
				return nil, err
			}
			for _, k := range keys {
				d, ok, err := sr.Document(ctx, k)
				if err != nil {
					return nil, err
				}
				if !ok {
					continue
				}
				q, err := vs.seq(k, d)
				if err != nil {
					return nil, err
				}
				if g, ok := m[k]; !ok || q < g {
					m[k] = q
				}
			}
			return m, nil
		},
	}
}

// versionSeqs is which seq each version of each key was sent with, as
// noting saw them: the test's versions are unique per key, so the version
// a document carries names the one record it came from.
type versionSeqs struct {
	mu sync.Mutex
	m  map[feed.Key]map[int]feed.Seq
}

func (vs *versionSeqs) note(recs []feed.Record) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	for _, r := range recs {
		if r.Deleted() {
			continue
		}
		var d struct{ V int }
		if json.Unmarshal(r.Doc, &d) != nil {
			continue
		}
		if vs.m[r.Key] == nil {
			vs.m[r.Key] = map[int]feed.Seq{}
		}
		vs.m[r.Key][d.V] = r.Seq
	}
}

// seq is the seq the version doc carries was sent with.
func (vs *versionSeqs) seq(k feed.Key, doc json.RawMessage) (feed.Seq, error) {
	var d struct{ V int }
	if err := json.Unmarshal(doc, &d); err != nil {
		return 0, fmt.Errorf("%s's document: %w", k, err)
	}
	vs.mu.Lock()
	defer vs.mu.Unlock()
	q, ok := vs.m[k][d.V]
	if !ok {
		return 0, fmt.Errorf("%s is served at version %d, which no record sent", k, d.V)
	}
	return q, nil
}

// noting is a sink that notes the version and seq of every record sent
// to it, its resync copies' included, before passing it on.
type noting struct {
	feed.Sink
	vs *versionSeqs
}

func (n *noting) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	n.vs.note(recs)
	return n.Sink.Apply(ctx, recs)
}

func (n *noting) OpenResync(ctx context.Context, g feed.Generation) (feed.ResyncTarget, error) {
	rt, err := n.Sink.OpenResync(ctx, g)
	if err != nil {
		return nil, err
	}
	return &notingResync{ResyncTarget: rt, vs: n.vs}, nil
}

type notingResync struct {
	feed.ResyncTarget
	vs *versionSeqs
}

func (n *notingResync) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	n.vs.note(recs)
	return n.ResyncTarget.Apply(ctx, recs)
}

// SetFloor passes the worker's floor on, so the wrapper hides nothing of
// the copy (feed.FloorSetter).
func (n *notingResync) SetFloor(ctx context.Context, floor feed.Seq) error {
	if fs, ok := n.ResyncTarget.(feed.FloorSetter); ok {
		return fs.SetFloor(ctx, floor)
	}
	return nil
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
