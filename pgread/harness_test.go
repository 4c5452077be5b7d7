package pgread_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/pgread"
	"github.com/kairos-es/kairos/read"
)

var quiet = slog.New(slog.DiscardHandler)

// env is one migrated schema (pgfeed's and pgread's tables, and a view table
// "view"(key text PK, doc jsonb)) with a store, an event log and a feed store
// over one pool.
type env struct {
	pool   *pgxpool.Pool
	schema string
	store  *pgread.Store
	log    *pgread.EventLog
	feeds  *pgfeed.Store
	view   string // the quoted view table
}

func setup(t *testing.T) env {
	t.Helper()
	return setupMode(t, pgx.QueryExecModeCacheStatement)
}

func setupMode(t *testing.T, mode pgx.QueryExecMode) env {
	t.Helper()
	return setupURL(t, pgtest.URL(), mode)
}

func setupURL(t *testing.T, url string, mode pgx.QueryExecMode) env {
	t.Helper()
	pool := pgtest.Pool(t, url, mode)
	schema := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}); err != nil {
		t.Fatalf("pgfeed.Migrate: %v", err)
	}
	if _, err := pgread.Migrate(ctx, pool, pgread.Options{Schema: schema}); err != nil {
		t.Fatalf("pgread.Migrate: %v", err)
	}
	view := `"` + schema + `"."view"`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+view+` (key text PRIMARY KEY, doc jsonb NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return env{pool: pool, schema: schema, store: newStore(t, pool, schema), log: newLog(t, pool, schema), feeds: newFeeds(t, pool, schema), view: view}
}

func newStore(t *testing.T, db pgread.DBTX, schema string) *pgread.Store {
	t.Helper()
	s, err := pgread.NewStore(t.Context(), db, pgread.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newLog(t *testing.T, db pgread.DBTX, schema string) *pgread.EventLog {
	t.Helper()
	l, err := pgread.NewEventLog(t.Context(), db, pgread.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newFeeds(t *testing.T, pool *pgxpool.Pool, schema string) *pgfeed.Store {
	t.Helper()
	s, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Schema: schema, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// viewRows reads the view table as key → doc text.
func (e env) viewRows(t *testing.T) map[string]string {
	t.Helper()
	rows, err := e.pool.Query(t.Context(), `SELECT key, doc::text FROM `+e.view)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var k, d string
		if err := rows.Scan(&k, &d); err != nil {
			t.Fatal(err)
		}
		out[k] = d
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// feedRows reads every row of f, tombstones included.
func (e env) feedRows(t *testing.T, f feed.FeedName) feed.Batch {
	t.Helper()
	b, err := e.feeds.ReadBatch(t.Context(), f, 0, feed.BatchLimit{Records: feed.MaxBatchLimit})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkpoint reads key's checkpoint, failing the test on an error.
func checkpoint(t *testing.T, s read.ProjectionStore[pgx.Tx], key read.CheckpointKey) read.Checkpoint {
	t.Helper()
	at, err := s.ReadCheckpoint(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// ckpt is the checkpoint at position p in epoch epoch.
func ckpt(p read.Position, epoch int64) read.Checkpoint {
	return read.Checkpoint{Position: p, Epoch: epoch}
}

// putView is an apply that writes key=doc to the view and the feed.
func (e env) putView(f feed.FeedName, key, doc string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.view+` (key, doc) VALUES ($1, $2::jsonb) ON CONFLICT (key) DO UPDATE SET doc = excluded.doc`, key, doc); err != nil {
			return err
		}
		_, err := e.feeds.Write(ctx, tx, f, []feed.Change{feed.Put(feed.Key(key), json.RawMessage(doc))})
		return err
	}
}

// backendPID returns tx's server process id.
func backendPID(ctx context.Context, tx pgx.Tx) (int32, error) {
	var pid int32
	err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	return pid, err
}

// waitBound bounds every wait of a test on another goroutine or session, so
// a test whose premise breaks fails with its message instead of hanging to
// the package timeout.
const waitBound = 15 * time.Second

// gate parks a goroutine inside its transaction until the test opens it. The
// parked goroutine also leaves when its context ends, and t's cleanup opens
// the gate before the pool closes (cleanups run last-registered first): a
// test that fails while a transaction is parked never leaves it holding a
// connection the pool's Close would wait for.
type gate struct {
	pid  chan int32
	open chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{pid: make(chan int32, 1), open: make(chan struct{})}
	t.Cleanup(g.release)
	return g
}

// release lets the parked goroutine go on; it may be called more than once.
func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// park, called inside tx, reports tx's backend pid and waits for release or
// ctx's end (then it returns ctx's error, which rolls tx back).
func (g *gate) park(ctx context.Context, tx pgx.Tx) error {
	pid, err := backendPID(ctx, tx)
	if err != nil {
		return err
	}
	g.pid <- pid
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// parked waits, within waitBound, for the goroutine to reach park, and
// returns its transaction's backend pid.
func (g *gate) parked(t *testing.T) int32 {
	t.Helper()
	return recv(t, g.pid, "waiting for a transaction to park")
}

// recv receives from ch within waitBound, or fails the test saying what it
// waited for.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(waitBound)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s: nothing within %v", what, waitBound)
		panic("unreachable")
	}
}

// waitBlockedBy waits until some session waits for a lock pid holds: the
// proof that a concurrent transaction reached the lock and queued behind it.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, pid int32) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session queued behind backend %d", pid)
		}
		time.Sleep(5 * time.Millisecond) // polling an observable condition, not timing logic
	}
}

func mustf(t *testing.T, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}
