package faults_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/sinks/kafka"
	"github.com/kairos-es/kairos/sinks/mysql"
	natssink "github.com/kairos-es/kairos/sinks/nats"
	"github.com/kairos-es/kairos/sinks/pgtable"
	redissink "github.com/kairos-es/kairos/sinks/redis"
	"github.com/kairos-es/kairos/sinks/webhook"
)

// The MySQL driver logs every connection the faults break; the worker's
// observer counts them instead.
func init() { _ = mysqldriver.SetLogger(log.New(io.Discard, "", 0)) }

// realSink is one real sink for fault 4: how to reach its server, how to
// build the sink on a given address (the proxy's), and how to read what it
// serves straight from the server, not through the proxy.
type realSink struct {
	name     string
	upstream func(t *testing.T) string // host:port of the server
	open     func(t *testing.T, e *env, addr string) (feed.Sink, func() map[feed.Key]json.RawMessage)
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func randName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// closeAtCleanup closes s at cleanup when it has a Close method.
func closeAtCleanup(t *testing.T, s any) {
	switch c := s.(type) {
	case interface{ Close() error }:
		t.Cleanup(func() { _ = c.Close() })
	case interface{ Close() }:
		t.Cleanup(c.Close)
	}
}

var realSinks = []realSink{
	{
		name:     "pgtable",
		upstream: func(t *testing.T) string { return upstreamHost(t) },
		open: func(t *testing.T, e *env, addr string) (feed.Sink, func() map[feed.Key]json.RawMessage) {
			s, err := pgtable.New(e.ctx, e.pool(addr, pgx.QueryExecModeCacheStatement, 4), pgtable.Options{Schema: e.schema, Table: "mirror", Create: true})
			if err != nil {
				t.Fatalf("pgtable.New: %v", err)
			}
			return s, func() map[feed.Key]json.RawMessage {
				rows, err := e.direct.Query(e.ctx, `SELECT key, doc FROM "`+e.schema+`".mirror WHERE doc IS NOT NULL`)
				if err != nil {
					t.Fatalf("reading the table: %v", err)
				}
				out := map[feed.Key]json.RawMessage{}
				for rows.Next() {
					var k string
					var d []byte
					if err := rows.Scan(&k, &d); err != nil {
						t.Fatal(err)
					}
					out[feed.Key(k)] = d
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				return out
			}
		},
	},
	{
		name: "mysql",
		upstream: func(t *testing.T) string {
			cfg, err := mysqldriver.ParseDSN(getenv("KAIROS_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"))
			if err != nil {
				t.Fatal(err)
			}
			return cfg.Addr
		},
		open: func(t *testing.T, e *env, addr string) (feed.Sink, func() map[feed.Key]json.RawMessage) {
			cfg, _ := mysqldriver.ParseDSN(getenv("KAIROS_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"))
			direct := cfg.FormatDSN()
			cfg.Addr = addr
			cfg.Timeout = 2 * time.Second
			table := randName("kf_")
			db, err := sql.Open("mysql", direct)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.PingContext(e.ctx); err != nil {
				pgtest.Unavailable(t, "MariaDB", err)
			}
			t.Cleanup(func() {
				defer db.Close()
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
			s, err := mysql.Open(e.ctx, cfg.FormatDSN(), mysql.Options{Table: table, Create: true})
			if err != nil {
				t.Fatalf("mysql.Open: %v", err)
			}
			return s, func() map[feed.Key]json.RawMessage {
				rows, err := db.QueryContext(e.ctx, "SELECT `key`, doc FROM `"+table+"` WHERE doc IS NOT NULL")
				if err != nil {
					t.Fatalf("reading the table: %v", err)
				}
				defer rows.Close()
				out := map[feed.Key]json.RawMessage{}
				for rows.Next() {
					var k, d []byte
					if err := rows.Scan(&k, &d); err != nil {
						t.Fatal(err)
					}
					out[feed.Key(k)] = d
				}
				return out
			}
		},
	},
	{
		name:     "redis",
		upstream: func(t *testing.T) string { return getenv("KAIROS_TEST_REDIS_ADDR", "127.0.0.1:6379") },
		open: func(t *testing.T, e *env, addr string) (feed.Sink, func() map[feed.Key]json.RawMessage) {
			opts := redissink.Options{Prefix: randName("kf_") + ":"}
			admin := goredis.NewClient(&goredis.Options{Addr: getenv("KAIROS_TEST_REDIS_ADDR", "127.0.0.1:6379")})
			if err := admin.Ping(e.ctx).Err(); err != nil {
				pgtest.Unavailable(t, "Redis", err)
			}
			t.Cleanup(func() {
				defer admin.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var cursor uint64
				for {
					keys, next, err := admin.Scan(ctx, cursor, opts.Prefix+"*", 1000).Result()
					if err != nil {
						t.Errorf("removing the test's keys: %v", err)
						return
					}
					if len(keys) > 0 {
						admin.Unlink(ctx, keys...)
					}
					if cursor = next; cursor == 0 {
						return
					}
				}
			})
			s, err := redissink.Open(e.ctx, "redis://"+addr+"/0", opts)
			if err != nil {
				t.Fatalf("redis.Open: %v", err)
			}
			r, err := redissink.NewReader(admin, opts)
			if err != nil {
				t.Fatal(err)
			}
			return s, func() map[feed.Key]json.RawMessage {
				keys := make([]feed.Key, universe)
				for i := range keys {
					keys[i] = key(i)
				}
				docs, err := r.MGet(e.ctx, keys...)
				if err != nil {
					t.Fatalf("reading the keys: %v", err)
				}
				out := map[feed.Key]json.RawMessage{}
				for i, d := range docs {
					if d != nil {
						out[keys[i]] = d
					}
				}
				return out
			}
		},
	},
	{
		name: "nats",
		upstream: func(t *testing.T) string {
			u, err := url.Parse(getenv("KAIROS_TEST_NATS_URL", "nats://127.0.0.1:4222"))
			if err != nil {
				t.Fatal(err)
			}
			return u.Host
		},
		open: func(t *testing.T, e *env, addr string) (feed.Sink, func() map[feed.Key]json.RawMessage) {
			bucket := randName("kf_")
			direct, err := nats.Connect(getenv("KAIROS_TEST_NATS_URL", "nats://127.0.0.1:4222"), nats.Timeout(5*time.Second))
			if err != nil {
				pgtest.Unavailable(t, "NATS", err)
			}
			t.Cleanup(func() {
				defer direct.Close()
				js, _ := jetstream.New(direct)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				names := js.KeyValueStoreNames(ctx)
				var mine []string
				for b := range names.Name() {
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
			nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
				nats.ReconnectJitter(0, 0), nats.Timeout(2*time.Second), nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2),
				// The faults break the connection on purpose; the worker's
				// observer counts what that costs, nats.go need not print it.
				nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
			if err != nil {
				t.Fatalf("connecting to NATS through the proxy: %v", err)
			}
			t.Cleanup(nc.Close)
			s, err := natssink.New(e.ctx, nc, natssink.Options{Bucket: bucket, AckTimeout: time.Second})
			if err != nil {
				t.Fatalf("nats.New: %v", err)
			}
			return s, func() map[feed.Key]json.RawMessage {
				r, err := natssink.NewReader(e.ctx, direct, bucket)
				if err != nil {
					t.Fatalf("nats.NewReader: %v", err)
				}
				docs, err := r.Documents(e.ctx)
				if err != nil {
					t.Fatalf("reading the bucket: %v", err)
				}
				return docs
			}
		},
	},
	// The webhook's receiver and Kafka's kfake cluster are started by the
	// test itself, so their proxies are built with them (webhookSink,
	// kafkaSink).
	{name: "webhook"},
	{name: "kafka"},
}

// universe is how many keys the fault-4 writers change.
const universe = 300

// receiver is a webhook receiver that keeps what it is sent as a sink with
// a seq guard would: per copy, each key's seq beside its document, a record
// older than the one kept ignored.
type receiver struct {
	mu     sync.Mutex
	live   map[feed.Key]recEntry
	copies map[string]map[feed.Key]recEntry
}

type recEntry struct {
	seq feed.Seq
	doc json.RawMessage
}

func (r *receiver) receive(_ context.Context, d webhook.Delivery) ([]webhook.Rejected, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	apply := func(m map[feed.Key]recEntry) {
		for _, rec := range d.Records {
			if e, ok := m[rec.Key]; ok && e.seq > rec.Seq {
				continue
			}
			m[rec.Key] = recEntry{seq: rec.Seq, doc: slices.Clone(rec.Doc)}
		}
	}
	switch d.Type {
	case webhook.TypeApply:
		apply(r.live)
	case webhook.TypeResyncBegin:
		r.copies[d.Resync] = map[feed.Key]recEntry{}
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

func (r *receiver) docs() map[feed.Key]json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[feed.Key]json.RawMessage{}
	for k, e := range r.live {
		if e.doc != nil {
			out[k] = e.doc
		}
	}
	return out
}

// webhookSink starts a receiver and a proxy in front of it, and a webhook
// sink that delivers through the proxy.
func webhookSink(t *testing.T, e *env) (*proxy, feed.Sink, func() map[feed.Key]json.RawMessage) {
	var key [32]byte
	_, _ = rand.Read(key[:])
	secret := webhook.SecretPrefix + base64.StdEncoding.EncodeToString(key[:])
	rcv := &receiver{live: map[feed.Key]recEntry{}, copies: map[string]map[feed.Key]recEntry{}}
	h, err := webhook.NewHandler([]string{secret}, webhook.HandlerOptions{}, rcv.receive)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	p := newProxy(t, strings.TrimPrefix(srv.URL, "http://"))
	s, err := webhook.New(e.ctx, webhook.Options{
		URL: "http://" + p.addr + "/hook", Secrets: []string{secret},
		Feed: e.feed, Sink: "s", AllowLoopback: true, Timeout: time.Second, Logger: quiet(),
	})
	if err != nil {
		t.Fatalf("webhook.New: %v", err)
	}
	return p, s, rcv.docs
}

// kafkaSink starts a one-broker kfake cluster and a proxy in front of it,
// and a Kafka sink whose every connection, to the bootstrap address or to the
// broker the metadata advertises, goes through the proxy.
func kafkaSink(t *testing.T, e *env) (*proxy, feed.Sink, func() map[feed.Key]json.RawMessage) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("starting a kfake cluster: %v", err)
	}
	t.Cleanup(c.Close)
	p := newProxy(t, c.ListenAddrs()[0])
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", p.addr)
	}
	s, err := kafka.New(e.ctx, kafka.Options{
		Brokers: []string{p.addr}, Feed: e.feed, Topic: "orders", Create: true, Partitions: 3,
		// franz-go retries a produce on its own until the record's delivery
		// timeout; a short one makes a fault the sink cannot ride out a
		// failed call, which the worker must retry, never park.
		ClientOptions: []kgo.Opt{kgo.Dialer(dial), kgo.RecordDeliveryTimeout(time.Second)},
	})
	if err != nil {
		t.Fatalf("kafka.New: %v", err)
	}
	return p, s, func() map[feed.Key]json.RawMessage {
		r, err := kafka.NewReader(e.ctx, kafka.ReaderOptions{Brokers: c.ListenAddrs(), Topic: "orders"})
		if err != nil {
			t.Fatalf("kafka.NewReader: %v", err)
		}
		defer r.Close()
		snap, err := r.Read(e.ctx)
		if err != nil {
			t.Fatalf("reading the topics: %v", err)
		}
		return snap.Docs
	}
}

// faultCount counts, as the worker's Observer, the sink calls that failed,
// and those that succeeded but took at least slowCall: a client that
// rides a fault out itself (franz-go holds a produce whose answer is late
// and retries it on a new connection) turns what fails another sink's call
// into a slow one. A healthy call here takes milliseconds, and every
// no-answer phase leaves a call it held either failed, at the worker's 1 s
// sink timeout, or slow.
type faultCount struct{ n, slow atomic.Int64 }

// slowCall is the least time a sink call the faults held up took.
const slowCall = 500 * time.Millisecond

func (f *faultCount) SinkCall(_ feed.SinkID, _ string, took time.Duration, err error) {
	switch {
	case err != nil:
		f.n.Add(1)
	case took >= slowCall:
		f.slow.Add(1)
	}
}

// faultPhases are the network faults fault 4 cycles through, each on for a
// while, then a healthy pause.
var faultPhases = []struct {
	name   string
	stream string
	typ    string
	attrs  map[string]any
	on     time.Duration
}{
	// Connections reset (RST) as soon as anything moves on them.
	{"reset", "downstream", "reset_peer", map[string]any{"timeout": 0}, 300 * time.Millisecond},
	// No answer at all: what the server says goes nowhere, the connection
	// stays open; longer than the workers' 1 s sink timeout, so every call
	// that starts meanwhile fails, however hard its client retries.
	{"no-answer", "downstream", "timeout", map[string]any{"timeout": 0}, 1500 * time.Millisecond},
	// A stalled body: the answer trickles in small slices, far apart.
	{"stalled-body", "downstream", "slicer", map[string]any{"average_size": 8, "size_variation": 4, "delay": 50_000}, 700 * time.Millisecond},
	// Latency spikes, each way.
	{"latency", "upstream", "latency", map[string]any{"latency": 300, "jitter": 250}, 800 * time.Millisecond},
	// Timeouts: a connection that carries nothing for 200 ms is closed,
	// and nothing goes through meanwhile.
	{"timeout", "upstream", "timeout", map[string]any{"timeout": 200}, 600 * time.Millisecond},
}

// TestSinksThroughFaults is fault 4: each real sink sits behind the proxy
// while a worker streams a few thousand changes with deletes into it (each
// fault twice), and the proxy resets connections, stops answering, stalls
// bodies, adds latency spikes and times connections out, in turn. Every
// failed call is retried (the observer counts them, and the calls the
// faults slowed: a run with neither proves nothing and fails; none may be
// parked), nothing is lost (I1: the sink ends with the feed's live
// documents, read from the server directly), and no key is ever sent an
// older version than one sent before (I2: every call that reached the
// target is recorded with its records' keys and seqs, its worker and its
// holder).
//
// Kafka runs against kfake, franz-go's in-process cluster, with one broker.
// A Kafka client dials the bootstrap address once and then the brokers'
// advertised addresses, which kfake sets to its own listener, so the
// sink's client is given a dialer that takes every connection to the proxy.
func TestSinksThroughFaults(t *testing.T) {
	t.Parallel()
	for _, rs := range realSinks {
		t.Run(rs.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			var p *proxy
			var sink feed.Sink
			var read func() map[feed.Key]json.RawMessage
			switch rs.name {
			case "webhook":
				p, sink, read = webhookSink(t, e)
			case "kafka":
				p, sink, read = kafkaSink(t, e)
			default:
				up := rs.upstream(t)
				if c, err := net.DialTimeout("tcp", up, 2*time.Second); err != nil {
					pgtest.Unavailable(t, rs.name+" at "+up, err)
				} else {
					c.Close()
				}
				p = newProxy(t, up)
				sink, read = rs.open(t, e, p.addr)
			}
			closeAtCleanup(t, sink)
			sinkFaults(t, e, p, sink, read)
		})
	}
}

func sinkFaults(t *testing.T, e *env, p *proxy, sink feed.Sink, read func() map[feed.Key]json.RawMessage) {
	store := e.store(e.pool("", pgx.QueryExecModeCacheStatement, 4), pgfeed.Options{})
	opts := testOptions()
	opts.SinkTimeout = time.Second
	faults := &faultCount{}
	opts.Observer = faults
	mon := e.monitorI3("s")
	e.startWorker("A", store, "s", sink, opts, false)

	// The writer: commits of 10 changes over universe keys, one change in
	// five a delete, every 10 ms until the faults are over (a few thousand
	// changes), so that every fault meets calls under way.
	stop, written := make(chan struct{}), make(chan struct{})
	var changes atomic.Int64
	go func() {
		defer close(written)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			var cs []feed.Change
			for j := range 10 {
				i := (n*31 + j*17) % universe
				if (n+j)%5 == 0 {
					cs = append(cs, feed.Delete(key(i)))
				} else {
					cs = append(cs, feed.Put(key(i), doc(i, n)))
				}
			}
			if _, err := e.writer.WriteCommitted(context.Background(), e.feed, cs); err != nil {
				t.Errorf("write: %v", err)
				return
			}
			changes.Add(int64(len(cs)))
			time.Sleep(10 * time.Millisecond)
		}
	}()

	// The faults, each in turn, twice, with a healthy pause after each.
	phasesRun := map[string]int{}
	time.Sleep(300 * time.Millisecond)
	for i := range 2 * len(faultPhases) {
		f := faultPhases[i%len(faultPhases)]
		p.toxic("fault", f.typ, f.stream, f.attrs)
		time.Sleep(f.on)
		p.remove("fault")
		phasesRun[f.name]++
		time.Sleep(300 * time.Millisecond)
	}
	close(stop)
	<-written
	e.caughtUp("s", 60*time.Second)
	want, _ := e.liveDocs()
	sameDocs(t, "sink", read(), want)
	parked, err := e.writer.ReadParked(e.ctx, feed.SinkID{Feed: e.feed, Sink: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) > 0 {
		t.Errorf("%d records parked for faults that concern the sink, first %s: %s", len(parked), parked[0].Key, parked[0].Reason)
	}
	stale, _ := checkI4(t, e.rec)
	sent := checkI2(t, e.rec, stale)
	e.checkCursorAudit("s")
	if faults.n.Load()+faults.slow.Load() == 0 {
		t.Fatalf("no sink call failed or took %v: the faults never reached the sink and the test proves nothing", slowCall)
	}
	t.Logf("%d changes written, %d keys live; %d records sent; %d sink calls failed and were retried, %d took %v or more; phases %v; %d I3 checks",
		changes.Load(), len(want), sent, faults.n.Load(), faults.slow.Load(), slowCall, phasesRun, mon.checks.Load())
}
