package syncer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// pgBackend runs the scenarios on PostgreSQL, in real time: a schema of the
// test's own, migrated, dropped at the end.
var pgBackend = backend{
	name: "pgfeed",
	new: func(t *testing.T) feedtest.StoreHarness {
		s, pool, _ := newPG(t, pgfeed.Options{})
		return pgtest.Harness(s, pool)
	},
}

// pgAdvisoryBackend is pgBackend with advisory-lock leases, on a pool of
// their own.
var pgAdvisoryBackend = backend{
	name: "pgfeed-advisory",
	new: func(t *testing.T) feedtest.StoreHarness {
		leases := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
		s, pool, _ := newPG(t, pgfeed.Options{AdvisoryLock: leases})
		return pgtest.Harness(s, pool)
	},
}

func init() {
	backends = append(backends, pgBackend, pgAdvisoryBackend)
	concurrentBackends = append(concurrentBackends, inConcurrentMode(pgBackend))
}

// newPG returns a store over a fresh migrated schema, on a pool of its own.
func newPG(t testing.TB, opts pgfeed.Options) (*pgfeed.Store, *pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	opts.Schema = schema
	s, err := pgfeed.New(ctx, pool, opts)
	if err != nil {
		t.Fatalf("pgfeed.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s, pool, schema
}

// namedPool opens a pool whose sessions carry application_name app, so a test
// can terminate its own backends and nobody else's.
func namedPool(t testing.TB, app string) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolWith(t, pgtest.URL(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	})
}

// TestTerminatedBackends kills every database session of the worker's store
// again and again while changes are written (its pool's, its listener's, its
// advisory lock's): the worker reconnects, takes its lease again where it
// lost it, and ends with the feed's documents, no key going back.
func TestTerminatedBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("terminates backends: not in -short")
	}
	for _, advisory := range []bool{false, true} {
		t.Run(fmt.Sprintf("advisory=%v", advisory), func(t *testing.T) {
			t.Parallel()
			var b [6]byte
			_, _ = rand.Read(b[:])
			app := "kairos_syncer_" + hex.EncodeToString(b[:])
			pool := namedPool(t, app)
			schema := pgtest.Schema(t)
			ctx := t.Context()
			if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}); err != nil {
				t.Fatal(err)
			}
			opts := pgfeed.Options{Schema: schema, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}
			if advisory {
				opts.AdvisoryLock = namedPool(t, app)
			}
			store, err := pgfeed.New(ctx, pool, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(store.Close)
			e := &env{t: t, ctx: ctx, b: backend{name: "pgfeed"}, h: pgtest.Harness(store, pool), feed: "terminated"}
			w := newWorld(e, "s")
			w.checkLease = false // a killed advisory session leaves its holder recorded until the next take
			o := testOptions(t, e)
			run, _ := one(t, e, w, "A", o)
			e.waitCaughtUp(w.id)

			kill := func() int {
				var n int
				// A fresh connection of its own, which the terminations spare.
				conn, err := pgx.Connect(ctx, pgtest.URL())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			killed := 0
			for i := range 40 {
				for {
					_, err := store.WriteCommitted(ctx, e.feed, []feed.Change{feed.Put(key(i%15), doc(`{"i":%d}`, i)), feed.Delete(key((i + 7) % 15))})
					if err == nil {
						break
					}
					time.Sleep(10 * time.Millisecond) // our own pool lost its sessions too
				}
				if i%8 == 3 {
					killed += kill()
				}
				time.Sleep(20 * time.Millisecond)
			}
			if killed == 0 {
				t.Fatal("no backend was terminated: the test proves nothing")
			}
			e.waitCaughtUp(w.id)
			want, _ := e.liveDocs()
			sameDocs(t, "sink", w.docs(), want)
			noProblems(t, w)
			st := run.r.States()[0]
			t.Logf("%d backends terminated; last fault: %v", killed, st.LastError)
		})
	}
}

// lockedBuffer is a log destination the test reads while the worker writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestListenerDown points the store's LISTEN connection at a wake-up source
// that is down: a Listen that blocks until its ctx ends, a closed port, and
// a socket that accepts and never answers. The worker must not wait for it:
// writes reach the sink on the poll (the worker's clock is a manual one, so
// polls happen only when the test moves it), the State and the log show the
// fault; and once the listener is reachable again, the worker subscribes on
// a later poll and a write then reaches the sink on its wake-up, the clock
// standing still.
func TestListenerDown(t *testing.T) {
	silent := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu    sync.Mutex
			conns []net.Conn
			wg    sync.WaitGroup
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c) // held open, never read nor written
				mu.Unlock()
			}
		}()
		t.Cleanup(func() {
			ln.Close()
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		})
		return ln.Addr().String()
	}
	connectTo := func(addr string) func(ctx context.Context) (*pgx.Conn, error) {
		return func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable")
		}
	}
	for _, c := range []struct {
		name string
		down func(t *testing.T) func(ctx context.Context) (*pgx.Conn, error)
	}{
		{"blocks", func(*testing.T) func(ctx context.Context) (*pgx.Conn, error) {
			return func(ctx context.Context) (*pgx.Conn, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}
		}},
		{"closed port", func(t *testing.T) func(ctx context.Context) (*pgx.Conn, error) {
			return connectTo(pgtest.ClosedPort(t))
		}},
		{"never answers", func(t *testing.T) func(ctx context.Context) (*pgx.Conn, error) { return connectTo(silent(t)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var up atomic.Bool
			down := c.down(t)
			listen := func(ctx context.Context) (*pgx.Conn, error) {
				if up.Load() {
					return pgx.Connect(ctx, pgtest.URL())
				}
				return down(ctx)
			}
			store, pool, _ := newPG(t, pgfeed.Options{Listen: listen, ListenTimeout: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			e := &env{t: t, ctx: t.Context(), b: backend{name: "pgfeed"}, h: pgtest.Harness(store, pool), feed: "down"}
			w := newWorld(e, "s")
			clock := feedtest.NewManualClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			logs := &lockedBuffer{}
			opts := testOptions(t, e)
			opts.Clock, opts.PollInterval = clock, time.Minute
			opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			const limit = 20 * time.Second
			var run *running
			in := func(k feed.Key) func() bool { return func() bool { _, ok := w.docs()[k]; return ok } }
			// polled waits for cond while moving the worker's clock a poll
			// interval at a time.
			polled := func(what string, cond func() bool) {
				t.Helper()
				deadline := time.Now().Add(limit)
				for !cond() {
					if time.Now().After(deadline) {
						t.Fatalf("%s: not within %v of polls (state %+v)", what, limit, run.r.States()[0])
					}
					clock.Advance(opts.PollInterval)
					time.Sleep(10 * time.Millisecond)
				}
			}

			e.write(feed.Put("k0", doc(`{"i":0}`)))
			run, _ = one(t, e, w, "A", opts)
			e.eventually("the first write in the sink, the wake-ups down", limit, in("k0"))
			st := run.r.States()[0]
			if st.WakeUps || !errors.Is(st.WakeUpError, feed.ErrUnreadable) || !errors.Is(st.LastError, feed.ErrUnreadable) {
				t.Fatalf("State.WakeUps %v, WakeUpError %v, LastError %v; want no wake-ups and the listener's fault", st.WakeUps, st.WakeUpError, st.LastError)
			}
			if l := logs.String(); !strings.Contains(l, "subscribing to the feed") {
				t.Fatalf("the log does not show the failed subscription:\n%s", l)
			}
			for i := 1; i <= 3; i++ {
				k := feed.Key(fmt.Sprintf("k%d", i))
				e.write(feed.Put(k, doc(`{"i":%d}`, i)))
				polled("a write reaching the sink by polling", in(k))
			}

			up.Store(true)
			polled("the worker subscribed once the listener is back", func() bool { return run.r.States()[0].WakeUps })
			if st := run.r.States()[0]; st.WakeUpError != nil {
				t.Fatalf("WakeUpError %v once subscribed; want nil", st.WakeUpError)
			}
			e.write(feed.Put("woken", doc(`{}`)))
			e.eventually("a write reaching the sink on its wake-up, the clock standing still", limit, in("woken"))
		})
	}
}
