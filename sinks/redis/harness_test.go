package redis_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/redis"
)

// addr is the test server: KAIROS_TEST_REDIS_ADDR, default the local Redis.
func addr() string {
	if a := os.Getenv("KAIROS_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// unavailable fails the test in CI and skips it elsewhere.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("Redis at %s is unavailable (CI is set, so this is a failure): %v", addr(), err)
	}
	t.Skipf("Redis at %s is unavailable: %v", addr(), err)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// target is one test's corner of the shared server: a prefix of its own,
// whose keys are removed at cleanup, a client name the sink's connections
// carry (so the test can kill them and nobody else's), and an admin client
// that reads what readers are served.
type target struct {
	prefix string
	name   string
	admin  *goredis.Client
	down   *atomic.Bool
	closed string

	mu      sync.Mutex
	clients []*goredis.Client // the sinks'
}

func newTarget(t testing.TB) *target {
	t.Helper()
	tg := &target{prefix: "kt:" + randHex(6) + ":", name: "kairos-test-" + randHex(6), down: new(atomic.Bool)}
	tg.admin = goredis.NewClient(&goredis.Options{Addr: addr(), ContextTimeoutEnabled: true, PoolSize: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tg.admin.Ping(ctx).Err(); err != nil {
		tg.admin.Close()
		unavailable(t, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg.closed = l.Addr().String()
	l.Close()
	t.Cleanup(func() {
		defer tg.admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if n, err := tg.removeAll(ctx); err != nil {
			t.Errorf("removing the test's keys under %s: %v (%d removed)", tg.prefix, err, n)
		}
	})
	return tg
}

// removeAll removes every key under the test's prefix (and only those).
func (tg *target) removeAll(ctx context.Context) (int, error) {
	var cursor uint64
	n := 0
	for {
		keys, next, err := tg.admin.Scan(ctx, cursor, tg.prefix+"*", 1000).Result()
		if err != nil {
			return n, err
		}
		if len(keys) > 0 {
			if err := tg.admin.Unlink(ctx, keys...).Err(); err != nil {
				return n, err
			}
			n += len(keys)
		}
		if cursor = next; cursor == 0 {
			return n, nil
		}
	}
}

// client is a client for a sink, named tg.name, which dials a closed port
// while the target is down.
func (tg *target) client(t testing.TB) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{
		Addr: addr(), ClientName: tg.name, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 4,
		Dialer: func(ctx context.Context, network, a string) (net.Conn, error) {
			if tg.down.Load() {
				a = tg.closed
			}
			var d net.Dialer
			return d.DialContext(ctx, network, a)
		},
	})
	t.Cleanup(func() { c.Close() })
	tg.mu.Lock()
	tg.clients = append(tg.clients, c)
	tg.mu.Unlock()
	return c
}

// sink is a sink under the test's prefix over a client of its own.
func (tg *target) sink(t testing.TB, opts redis.Options) *redis.Sink {
	t.Helper()
	opts.Prefix = tg.prefix
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := redis.New(ctx, tg.client(t), opts)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// reader is a Reader of the test's prefix.
func (tg *target) reader(t testing.TB, encoding string) *redis.Reader {
	t.Helper()
	r, err := redis.NewReader(tg.admin, redis.Options{Prefix: tg.prefix, Encoding: encoding})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// killSink ends every connection named tg.name, by CLIENT KILL ID, and
// returns how many it ended.
func (tg *target) killSink(ctx context.Context) (int, error) {
	list, err := tg.admin.ClientList(ctx).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(list))
	for sc.Scan() {
		var id, name string
		for _, f := range strings.Fields(sc.Text()) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			} else if v, ok := strings.CutPrefix(f, "name="); ok {
				name = v
			}
		}
		if name != tg.name || id == "" {
			continue
		}
		if err := tg.admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil && !strings.Contains(err.Error(), "No such client") {
			return n, err
		}
		n++
	}
	return n, sc.Err()
}

// fault makes the server unreachable for the sink: new connections dial a
// closed port and its open ones are killed.
func (tg *target) fault(t testing.TB) (restore func()) {
	t.Helper()
	tg.down.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A connection dialled just before the fault may still be in its
	// handshake, not yet named, when the first CLIENT LIST runs, and would
	// survive one kill (a CI run once saw Apply succeed under the fault):
	// kill until three lists in a row, 30 ms apart, find none left.
	for quiet := 0; quiet < 3; {
		n, err := tg.killSink(ctx)
		if err != nil {
			t.Fatalf("killing the sink's connections: %v", err)
		}
		if n == 0 {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(30 * time.Millisecond)
	}
	return func() {
		tg.down.Store(false)
		// go-redis stops dialling after a pool's worth of failed dials and
		// probes once a second until one succeeds: the server is back for
		// the sink once its clients can reach it again.
		tg.mu.Lock()
		clients := append([]*goredis.Client(nil), tg.clients...)
		tg.mu.Unlock()
		deadline := time.Now().Add(10 * time.Second)
		for _, c := range clients {
			for c.Ping(context.Background()).Err() != nil && !errors.Is(c.Ping(context.Background()).Err(), goredis.ErrClosed) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// The layout as doc.go gives it for readers outside Go, written out again
// here so that the tests hold the sink to its documentation.
func (tg *target) meta() string { return tg.prefix + "meta" }

func escape(k string) string {
	return strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(k)
}

func unescape(s string) string {
	return strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}").Replace(s)
}

func (tg *target) docKey(ns string, k feed.Key) string {
	return tg.prefix + ns + ":{" + escape(string(k)) + "}"
}

// live is the namespace the pointer names.
func (tg *target) live(ctx context.Context) (string, error) {
	return tg.admin.HGet(ctx, tg.meta(), "live").Result()
}

// nsKeys lists the document keys of namespace ns.
func (tg *target) nsKeys(ctx context.Context, ns string) ([]string, error) {
	var out []string
	var cursor uint64
	for {
		keys, next, err := tg.admin.Scan(ctx, cursor, tg.prefix+ns+":{*}", 1000).Result()
		if err != nil {
			return nil, err
		}
		out = append(out, keys...)
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

// contents reads the live copy by the documented layout: the pointer, the
// namespace's document keys, their values, and the pointer again; a read
// the pointer moved under is done again. skip is a key the test planted.
func (tg *target) contents(ctx context.Context, hash bool, skip feed.Key) (map[feed.Key]json.RawMessage, error) {
	for range 20 {
		ns, err := tg.live(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the pointer: %w", err)
		}
		keys, err := tg.nsKeys(ctx, ns)
		if err != nil {
			return nil, err
		}
		pipe := tg.admin.Pipeline()
		cmds := make([]goredis.Cmder, len(keys))
		for i, k := range keys {
			if hash {
				cmds[i] = pipe.HGetAll(ctx, k)
			} else {
				cmds[i] = pipe.Get(ctx, k)
			}
		}
		check := pipe.HGet(ctx, tg.meta(), "live")
		_, _ = pipe.Exec(ctx)
		if after, err := check.Result(); err != nil || after != ns {
			continue
		}
		out := map[feed.Key]json.RawMessage{}
		for i, k := range keys {
			key := feed.Key(unescape(strings.TrimSuffix(strings.TrimPrefix(k, tg.prefix+ns+":{"), "}")))
			if key == skip {
				continue
			}
			switch c := cmds[i].(type) {
			case *goredis.StringCmd:
				b, err := c.Bytes()
				if errors.Is(err, goredis.Nil) {
					continue // deleted between SCAN and GET
				}
				if err != nil {
					return nil, fmt.Errorf("GET %s: %w", k, err)
				}
				out[key] = b
			case *goredis.MapStringStringCmd:
				m, err := c.Result()
				if err != nil {
					return nil, fmt.Errorf("HGETALL %s: %w", k, err)
				}
				obj := map[string]json.RawMessage{}
				for f, v := range m {
					obj[f] = json.RawMessage(v)
				}
				b, err := json.Marshal(obj)
				if err != nil {
					return nil, fmt.Errorf("%s: a field is not JSON: %w", k, err)
				}
				out[key] = b
			}
		}
		return out, nil
	}
	return nil, errors.New("the pointer kept moving")
}

func rec(key string, seq feed.Seq, doc string) feed.Record {
	r := feed.Record{Key: feed.Key(key), Seq: seq}
	if doc != "" {
		r.Doc = json.RawMessage(doc)
	}
	return r
}

func applyOK(t testing.TB, s interface {
	Apply(context.Context, []feed.Record) ([]feed.Rejection, error)
}, records ...feed.Record) {
	t.Helper()
	rej, err := s.Apply(t.Context(), records)
	if err != nil || len(rej) != 0 {
		t.Fatalf("Apply = %v, %v; want no rejection and no error", rej, err)
	}
}

func wantInvalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	var inv *feed.InvalidError
	switch {
	case err == nil:
		t.Errorf("%s: no error, want one naming %q", what, field)
	case !errors.As(err, &inv) || !errors.Is(err, feed.ErrInvalid):
		t.Errorf("%s: %v (%T), want an *feed.InvalidError", what, err, err)
	case inv.Field != field:
		t.Errorf("%s: the error names %q (%v), want %q", what, inv.Field, err, field)
	}
}
