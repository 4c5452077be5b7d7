package pgtable_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/sinks/pgtable"
)

// target is one test's target database: a schema of its own, a pool the test
// can cut off (fault), and a second pool that reads what readers are served.
type target struct {
	t      testing.TB
	schema string
	app    string
	pool   *pgxpool.Pool // the sink's
	read   *pgxpool.Pool
	down   *atomic.Bool
}

// newTarget returns a fresh target. The sink's pool dials a closed port while
// the target is down, and its sessions carry an application name of their
// own, so that fault can end them and nobody else's.
func newTarget(t testing.TB) *target {
	t.Helper()
	return newTargetAt(t, pgtest.URL(), nil)
}

// newTargetAt is newTarget with the sink's pool on url (PgBouncer, say),
// configured further by configure when not nil.
func newTargetAt(t testing.TB, url string, configure func(*pgxpool.Config)) *target {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	tg := &target{t: t, schema: pgtest.Schema(t), app: "pgtable_" + hex.EncodeToString(b[:]), down: new(atomic.Bool)}
	closed := pgtest.ClosedPort(t)
	tg.pool = pgtest.PoolWith(t, url, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 4
		if configure != nil {
			configure(cfg)
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = tg.app
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if tg.down.Load() {
				return dial(ctx, "tcp", closed)
			}
			return dial(ctx, network, addr)
		}
	})
	tg.read = pgtest.PoolWith(t, pgtest.URL(), func(cfg *pgxpool.Config) { cfg.MaxConns = 2 })
	tg.exec(t, `CREATE SCHEMA "`+tg.schema+`"`)
	return tg
}

// fault makes the target unreachable for the sink: new connections go to a
// closed port, and the sink's sessions are ended. restore undoes it.
func (tg *target) fault(t testing.TB) (restore func()) {
	t.Helper()
	tg.down.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := tg.read.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, tg.app); err != nil {
		t.Fatalf("ending the sink's sessions: %v", err)
	}
	return func() { tg.down.Store(false) }
}

// sink builds a sink over the target's pool.
func (tg *target) sink(t testing.TB, opts pgtable.Options) *pgtable.Sink {
	t.Helper()
	opts.Schema = tg.schema
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := pgtable.New(ctx, tg.pool, opts)
	if err != nil {
		t.Fatalf("pgtable.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// contents reads the live documents of the table, as readers see them.
func (tg *target) contents(ctx context.Context, table string) (map[feed.Key]json.RawMessage, error) {
	rows, err := tg.read.Query(ctx, `SELECT key, doc::text FROM "`+tg.schema+`"."`+table+`" WHERE doc IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[feed.Key]json.RawMessage{}
	for rows.Next() {
		var k, d string
		if err := rows.Scan(&k, &d); err != nil {
			return nil, err
		}
		out[feed.Key(k)] = json.RawMessage(d)
	}
	return out, rows.Err()
}

func (tg *target) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := tg.read.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%.80s: %v", sql, err)
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
	case strings.Contains(err.Error(), "password"):
		t.Errorf("%s: %v mentions a password", what, err)
	}
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
