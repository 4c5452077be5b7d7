package faults_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/kafka"
	"github.com/kairos-es/kairos/sinks/mysql"
	natssink "github.com/kairos-es/kairos/sinks/nats"
	"github.com/kairos-es/kairos/sinks/webhook"
)

// The MySQL driver logs every connection a test ends; the tests read
// errors from the worker's states instead.
func init() { _ = mysqldriver.SetLogger(log.New(io.Discard, "", 0)) }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// mysqlTarget mirrors into a table of the test MariaDB's database, of a
// name of the test's own; every table of that name (the live one, and a
// resync's shadows) is dropped at cleanup. Each worker opens its own
// connection pool, as a process would.
func mysqlTarget(t testing.TB, ctx context.Context) *target {
	dsn := envOr("KAIROS_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test")
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.PingContext(ctx); err != nil {
		pgtest.Unavailable(t, "the test MariaDB", err)
	}
	table := "kf_" + randHex()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rows, err := db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?`, table+"%")
		if err != nil {
			t.Errorf("listing the test's tables: %v", err)
			return
		}
		var names []string
		for rows.Next() {
			var n string
			if rows.Scan(&n) == nil {
				names = append(names, n)
			}
		}
		rows.Close()
		for _, n := range names {
			if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+n+"`"); err != nil {
				t.Errorf("dropping %s: %v", n, err)
			}
		}
	})
	return &target{
		name: "mysql",
		open: func(t testing.TB) feed.Sink {
			s, err := mysql.Open(ctx, dsn, mysql.Options{Table: table, Create: true})
			if err != nil {
				t.Fatalf("mysql.Open: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
			rows, err := db.QueryContext(ctx, "SELECT `key`, doc FROM `"+table+"` WHERE doc IS NOT NULL")
			if err != nil {
				t.Fatalf("reading the MariaDB table: %v", err)
			}
			defer rows.Close()
			m := map[feed.Key]json.RawMessage{}
			for rows.Next() {
				var k, d []byte
				if err := rows.Scan(&k, &d); err != nil {
					t.Fatal(err)
				}
				m[feed.Key(k)] = d
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			return m
		},
		probe: func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error) {
			args := make([]any, len(keys))
			for i, k := range keys {
				args[i] = []byte(k)
			}
			marks := strings.TrimSuffix(strings.Repeat("?,", len(keys)), ",")
			rows, err := db.QueryContext(ctx, "SELECT `key`, seq FROM `"+table+"` WHERE `key` IN ("+marks+")", args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			m := map[feed.Key]feed.Seq{}
			for rows.Next() {
				var k []byte
				var s int64
				if err := rows.Scan(&k, &s); err != nil {
					return nil, err
				}
				m[feed.Key(k)] = feed.Seq(s)
			}
			return m, rows.Err()
		},
	}
}

// natsTarget mirrors into JetStream key-value buckets of a name of the
// test's own, removed at cleanup. Each worker connects on its own. The
// probe reads each key's last message in the live copy's stream, a delete
// marker's included, and the seq its header carries: what the sink's guard
// compares.
func natsTarget(t testing.TB, ctx context.Context) *target {
	url := envOr("KAIROS_TEST_NATS_URL", "nats://127.0.0.1:4222")
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		pgtest.Unavailable(t, "the test NATS", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket := "kf_" + randHex()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var mine []string
		for b := range js.KeyValueStoreNames(ctx).Name() {
			if b == bucket || strings.HasPrefix(b, bucket+"-g") {
				mine = append(mine, b)
			}
		}
		for _, b := range mine {
			if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				t.Errorf("removing the bucket %s: %v", b, err)
			}
		}
	})
	var rmu sync.Mutex
	var r *natssink.Reader
	reader := func(ctx context.Context) (*natssink.Reader, error) {
		rmu.Lock()
		defer rmu.Unlock()
		if r == nil {
			var err error
			if r, err = natssink.NewReader(ctx, nc, bucket); err != nil {
				return nil, err
			}
		}
		return r, nil
	}
	return &target{
		name: "kv",
		open: func(t testing.TB) feed.Sink {
			s, err := natssink.Connect(ctx, url, natssink.Options{Bucket: bucket})
			if err != nil {
				t.Fatalf("nats.Connect: %v", err)
			}
			t.Cleanup(s.Close)
			return s
		},
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
			r, err := reader(ctx)
			if err != nil {
				t.Fatalf("nats.NewReader: %v", err)
			}
			docs, err := r.Documents(ctx)
			if err != nil {
				t.Fatalf("reading the bucket: %v", err)
			}
			return docs
		},
		probe: func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error) {
			r, err := reader(ctx)
			if err != nil {
				return nil, err
			}
			live, err := r.Bucket(ctx)
			if err != nil {
				return nil, err
			}
			st, err := js.Stream(ctx, "KV_"+live)
			if err != nil {
				return nil, err
			}
			m := map[feed.Key]feed.Seq{}
			for _, k := range keys {
				msg, err := st.GetLastMsgForSubject(ctx, "$KV."+live+"."+natssink.EncodeKey(k))
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					continue
				}
				if err != nil {
					return nil, err
				}
				s, err := strconv.ParseInt(msg.Header.Get(natssink.HeaderSeq), 10, 64)
				if err != nil {
					return nil, err
				}
				m[k] = feed.Seq(s)
			}
			return m, nil
		},
	}
}

// hookReceiver is a webhook receiver behind the package's own
// webhook.NewHandler that keeps what it is sent as a receiver with a seq
// guard must (see the webhook package's Guarantees): per copy, each key's
// seq beside its document, a deletion's too, and a record older than the
// seq kept ignored.
type hookReceiver struct {
	mu     sync.Mutex
	live   map[feed.Key]hookEntry
	copies map[string]map[feed.Key]hookEntry
}

type hookEntry struct {
	seq feed.Seq
	doc json.RawMessage // nil: deleted
}

func (r *hookReceiver) receive(_ context.Context, d webhook.Delivery) ([]webhook.Rejected, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	apply := func(m map[feed.Key]hookEntry) {
		for _, rec := range d.Records {
			if e, ok := m[rec.Key]; ok && e.seq > rec.Seq {
				continue
			}
			m[rec.Key] = hookEntry{seq: rec.Seq, doc: slices.Clone(rec.Doc)}
		}
	}
	switch d.Type {
	case webhook.TypeApply:
		apply(r.live)
	case webhook.TypeResyncBegin:
		r.copies[d.Resync] = map[feed.Key]hookEntry{}
	case webhook.TypeResyncApply:
		if c := r.copies[d.Resync]; c != nil {
			apply(c)
		}
	case webhook.TypeResyncPublish:
		if c := r.copies[d.Resync]; c != nil {
			r.live = c
			delete(r.copies, d.Resync)
		}
	case webhook.TypeResyncAbort:
		delete(r.copies, d.Resync)
	}
	return nil, nil
}

// webhookTarget delivers to a real HTTP server on the loopback running a
// hookReceiver; each worker has a webhook sink of its own, as a process
// would.
func webhookTarget(t testing.TB, ctx context.Context, f feed.FeedName) *target {
	var k [32]byte
	_, _ = rand.Read(k[:])
	secret := webhook.SecretPrefix + base64.StdEncoding.EncodeToString(k[:])
	rcv := &hookReceiver{live: map[feed.Key]hookEntry{}, copies: map[string]map[feed.Key]hookEntry{}}
	h, err := webhook.NewHandler([]string{secret}, webhook.HandlerOptions{}, rcv.receive)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	const name = "hook"
	return &target{
		name: name,
		open: func(t testing.TB) feed.Sink {
			s, err := webhook.New(ctx, webhook.Options{URL: srv.URL + "/hook", Secrets: []string{secret}, Feed: f, Sink: name, AllowLoopback: true, Logger: quiet()})
			if err != nil {
				t.Fatalf("webhook.New: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
			rcv.mu.Lock()
			defer rcv.mu.Unlock()
			m := map[feed.Key]json.RawMessage{}
			for k, e := range rcv.live {
				if e.doc != nil {
					m[k] = e.doc
				}
			}
			return m
		},
		probe: func(_ context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error) {
			rcv.mu.Lock()
			defer rcv.mu.Unlock()
			m := map[feed.Key]feed.Seq{}
			for _, k := range keys {
				if e, ok := rcv.live[k]; ok {
					m[k] = e.seq
				}
			}
			return m, nil
		},
	}
}

// kafkaTarget mirrors into a compacted topic of a one-broker kfake cluster
// (franz-go's in-process Kafka; no Kafka broker can run where these tests
// do), as the kafka sink's own tests do. Each worker has a sink, and so a
// client, of its own. Kafka keeps whatever is produced: the seq guard is
// the consumer's, so what the target serves and probes is what the sink's
// Reader builds, each key at the record of its highest seq.
func kafkaTarget(t testing.TB, ctx context.Context, f feed.FeedName) *target {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("starting a kfake cluster: %v", err)
	}
	t.Cleanup(c.Close)
	const topic = "orders"
	// The reader is made at its first use: it needs the topics a sink's
	// New creates.
	var rmu sync.Mutex
	var r *kafka.Reader
	t.Cleanup(func() {
		rmu.Lock()
		defer rmu.Unlock()
		if r != nil {
			r.Close()
		}
	})
	snapshot := func(ctx context.Context) (kafka.Snapshot, error) {
		rmu.Lock()
		if r == nil {
			var err error
			if r, err = kafka.NewReader(ctx, kafka.ReaderOptions{Brokers: c.ListenAddrs(), Topic: topic}); err != nil {
				rmu.Unlock()
				return kafka.Snapshot{}, err
			}
		}
		rd := r
		rmu.Unlock()
		return rd.Read(ctx)
	}
	return &target{
		name: "topic",
		open: func(t testing.TB) feed.Sink {
			s, err := kafka.New(ctx, kafka.Options{Brokers: c.ListenAddrs(), Feed: f, Topic: topic, Create: true, Partitions: 3})
			if err != nil {
				t.Fatalf("kafka.New: %v", err)
			}
			t.Cleanup(s.Close)
			return s
		},
		read: func(t testing.TB) map[feed.Key]json.RawMessage {
			snap, err := snapshot(ctx)
			if err != nil {
				t.Fatalf("reading the topic: %v", err)
			}
			return snap.Docs
		},
		probe: func(ctx context.Context, keys []feed.Key) (map[feed.Key]feed.Seq, error) {
			snap, err := snapshot(ctx)
			if err != nil {
				return nil, err
			}
			m := map[feed.Key]feed.Seq{}
			for _, k := range keys {
				if s, ok := snap.Seqs[k]; ok {
					m[k] = s
				}
			}
			return m, nil
		},
	}
}
