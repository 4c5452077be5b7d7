package syncer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
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

func init() { backends = append(backends, pgBackend, pgAdvisoryBackend) }

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
