package pgfeed_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// pgbouncerURL is a PgBouncer in transaction mode in front of the test
// database, from KAIROS_TEST_PGBOUNCER_URL; its absence fails in CI.
func pgbouncerURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("KAIROS_TEST_PGBOUNCER_URL")
	if u == "" {
		pgtest.Unavailable(t, "PgBouncer", errors.New("KAIROS_TEST_PGBOUNCER_URL is not set"))
	}
	return u
}

// directListen opens the LISTEN session straight to PostgreSQL: a
// transaction pooler does not deliver notifications, so behind one the
// listener is the one connection that must bypass it.
func directListen(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, pgtest.URL()) }

// TestThroughPgBouncer runs both suites with every statement, migration and
// lease row going through PgBouncer in transaction mode, in the two exec
// modes a transaction pooler allows (prepared statements need a pooler that
// tracks them).
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := pgbouncerURL(t)
	for _, m := range modes[1:] {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			t.Run("feed", func(t *testing.T) {
				t.Parallel()
				feedtest.RunFeed(t, suiteStores(t, url, m.mode, pgfeed.Options{Listen: directListen}))
			})
			t.Run("sync", func(t *testing.T) {
				t.Parallel()
				feedtest.RunSyncStore(t, suiteStores(t, url, m.mode, pgfeed.Options{Listen: directListen}))
			})
		})
	}
}

// TestAdvisoryRefusesPooler shows both checks of an advisory lease pool: the
// active probe catches PgBouncer on a port no address sign names, and the
// address signs refuse without connecting. No message repeats the URL or its
// password.
func TestAdvisoryRefusesPooler(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)

	t.Run("probe", func(t *testing.T) {
		t.Parallel()
		url := pgbouncerURL(t)
		pool := pgtest.Pool(t, url, pgx.QueryExecModeSimpleProtocol)
		_, err := pgfeed.New(t.Context(), d.pool, pgfeed.Options{Schema: d.schema, AdvisoryLock: pool})
		var inv *feed.InvalidError
		if !errors.As(err, &inv) || inv.Field != "options.advisory_lock" || !strings.Contains(inv.Reason, "backend pid") {
			t.Fatalf("New with an advisory pool behind PgBouncer = %v; want an *InvalidError on options.advisory_lock from the pid probe", err)
		}
		if strings.Contains(err.Error(), url) || strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("the refusal repeats the address: %v", err)
		}
	})

	for _, c := range []struct{ name, url, sign string }{
		{"port 6432", "postgres://kairos:s3cret-pw@db.example.invalid:6432/app", "port 6432"},
		{"pooler host", "postgres://kairos:s3cret-pw@ep-cool-name-pooler.example.invalid:5432/app", "-pooler"},
		{"pgbouncer=true", "postgres://kairos:s3cret-pw@db.example.invalid:5432/app?pgbouncer=true", "pgbouncer=true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool, err := pgxpool.New(t.Context(), c.url) // lazy: never connects
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			_, err = pgfeed.New(ctx, d.pool, pgfeed.Options{Schema: d.schema, AdvisoryLock: pool})
			var inv *feed.InvalidError
			if !errors.As(err, &inv) || inv.Field != "options.advisory_lock" || !strings.Contains(inv.Reason, c.sign) {
				t.Fatalf("New = %v; want an *InvalidError on options.advisory_lock naming %q", err, c.sign)
			}
			for _, secret := range []string{"s3cret-pw", "example.invalid", c.url} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("the refusal repeats %q: %v", secret, err)
				}
			}
		})
	}
}

// recorder keeps the messages logged at warning level or above, each
// followed by its attributes as key=value.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, line)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, line)
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

func (r *recorder) has(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

// TestListenerWarnsBehindPooler: a store whose listener would LISTEN through
// PgBouncer says so, since its wake-ups cannot arrive; a direct listener
// does not.
func TestListenerWarnsBehindPooler(t *testing.T) {
	t.Parallel()
	url := pgbouncerURL(t)
	for _, c := range []struct {
		name   string
		listen func(context.Context) (*pgx.Conn, error)
		warn   bool
	}{{"pooled", nil, true}, {"direct", directListen, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := setup(t, url, pgx.QueryExecModeExec)
			rec := &recorder{}
			s := newStore(t, d, pgfeed.Options{Listen: c.listen, Logger: slog.New(rec)})
			sub, err := s.Subscribe(t.Context(), "f")
			if err != nil {
				t.Fatal(err)
			}
			sub.Close()
			if got := rec.has("transaction pooler"); got != c.warn {
				t.Fatalf("warned about the pooler: %v, want %v (log: %v)", got, c.warn, rec.msgs)
			}
		})
	}
}
