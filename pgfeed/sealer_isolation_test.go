package pgfeed_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// warnings is a slog handler that keeps the warnings it is given.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool { line += fmt.Sprintf(" %s=%v", a.Key, a.Value); return true })
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, line)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.seen...)
}

// TestSealerWhateverTheSessionDefault: a sealer whose sessions default to
// REPEATABLE READ or SERIALIZABLE (default_transaction_isolation, as a
// role or a database can set it) seals writers that keep rewriting a few
// keys without a fault, as in READ COMMITTED, and so without the pause a
// fault costs. Its rounds run in READ COMMITTED whatever the default: a
// round that read its first statement's snapshot, taken before its lock,
// failed with 40001 on a row a writer had rewritten since.
func TestSealerWhateverTheSessionDefault(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
			ctx := t.Context()
			const f = feed.FeedName("sealed")
			w := newStore(t, d, pgfeed.Options{})
			concurrentFeed(t, w, f)
			snapshotPool := pgtest.PoolWith(t, pgtest.URL(), func(cfg *pgxpool.Config) {
				cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			})
			warned := &warnings{}
			sealer := newStore(t, db{pool: snapshotPool, schema: d.schema}, pgfeed.Options{Logger: slog.New(warned)})
			sealCtx, stopSealing := context.WithCancel(ctx)
			sealed := make(chan error, 1)
			go func() { sealed <- sealer.RunSealer(sealCtx, f) }()
			var wg sync.WaitGroup
			var commits atomic.Int64
			stop := time.Now().Add(2 * time.Second)
			for i := range 8 {
				wg.Go(func() {
					for n := 0; time.Now().Before(stop); n++ {
						k := feed.Key(fmt.Sprintf("k%d", (i+n)%5))
						v := commits.Add(1)
						err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
							_, err := w.Write(ctx, tx, f, []feed.Change{feed.Put(k, fmt.Appendf(nil, `{"v": %d}`, v))})
							return err
						})
						if err != nil {
							t.Errorf("write: %v", err)
							return
						}
					}
				})
			}
			wg.Wait()
			for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				desc, err := w.Describe(ctx, f)
				if err != nil {
					t.Fatal(err)
				}
				if desc.Unsealed == 0 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("20 s after the writers stopped %d writes wait unsealed; the sealer warned %q", desc.Unsealed, warned.list())
				}
			}
			stopSealing()
			if err := <-sealed; err != nil {
				t.Fatal(err)
			}
			if got := warned.list(); len(got) > 0 {
				t.Fatalf("the sealer warned %d times over %d commits, first: %s", len(got), commits.Load(), got[0])
			}
			if docs := feedDocs(t, w, f); len(docs) != 5 {
				t.Fatalf("the feed holds %d keys; want the 5 written", len(docs))
			}
		})
	}
}
