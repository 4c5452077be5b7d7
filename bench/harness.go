package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// appName marks the harness's sessions, so its wait-event samples leave out
// everyone else's.
const appName = "kairos-bench"

// DefaultURL is the database the harness measures when neither
// KAIROS_BENCH_DATABASE_URL nor KAIROS_TEST_DATABASE_URL is set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres"

// databaseURL picks the database: the bench's own variable first, then the
// tests' one, so CI needs no extra setting.
func databaseURL() string {
	for _, v := range []string{"KAIROS_BENCH_DATABASE_URL", "KAIROS_TEST_DATABASE_URL"} {
		if u := os.Getenv(v); u != "" {
			return u
		}
	}
	return DefaultURL
}

// Sizes are the workload of one full run. The issue fixes the full sizes; the
// tiny ones only prove every row still yields a figure (the CI smoke test).
type Sizes struct {
	Runs           int           // measured runs per row (median, min–max); at least 1
	WriteChanges   int           // P1: changes per transaction
	WriteTxs       int           // P1: timed transactions per run
	Backlog        int           // P2, P5, describe: rows of the large feed
	SmallBacklog   int           // P5: rows of the small feed, for linearity
	CatchUp        int           // P4: backlog size
	LatencyRate    int           // P3: commits per second
	LatencyFor     time.Duration // P3: how long commits are paced
	StrictRate     bool          // P3: fail when the writer falls short of LatencyRate
	IdleFor        time.Duration // P3: idle window per subject
	Writers        int           // P6: concurrent writers
	WritersFor     time.Duration // P6: how long they commit
	Tombstones     int           // collection: tombstones to collect
	DescribeSinks  int           // describe: registered sinks
	DescribeCalls  int           // describe: calls per run
	SinkApplyBatch int           // sink apply rates: records per Apply
	SinkApplyRecs  int           // sink apply rates: records per run
	ScrapeSinks    int           // M: sinks, each Backlog rows behind
	Scrapes        int           // M: timed scrapes per run
	CaptureRows    int           // K update: rows one UPDATE changes
	CaptureUpdates int           // K update: timed UPDATEs per side and run
	BackfillRows   int           // K backfill: rows of the table
}

// FullSizes are the sizes.
var FullSizes = Sizes{
	Runs: 3, WriteChanges: 1000, WriteTxs: 30,
	Backlog: 1_000_000, SmallBacklog: 100_000, CatchUp: 100_000,
	LatencyRate: 500, LatencyFor: 3 * time.Second, StrictRate: true, IdleFor: 6 * time.Second,
	Writers: 16, WritersFor: 3 * time.Second,
	Tombstones: 100_000, DescribeSinks: 10, DescribeCalls: 3,
	SinkApplyBatch: 500, SinkApplyRecs: 200_000,
	ScrapeSinks: 10, Scrapes: 300,
	CaptureRows: 10_000, CaptureUpdates: 10, BackfillRows: 1_000_000,
}

// TinySizes keep every code path of the full run at a size CI can afford.
var TinySizes = Sizes{
	Runs: 1, WriteChanges: 100, WriteTxs: 3,
	Backlog: 4_000, SmallBacklog: 2_000, CatchUp: 2_000,
	LatencyRate: 100, LatencyFor: 500 * time.Millisecond, IdleFor: 1200 * time.Millisecond,
	Writers: 4, WritersFor: 300 * time.Millisecond,
	Tombstones: 1_000, DescribeSinks: 3, DescribeCalls: 2,
	SinkApplyBatch: 500, SinkApplyRecs: 5_000,
	ScrapeSinks: 3, Scrapes: 20,
	CaptureRows: 500, CaptureUpdates: 2, BackfillRows: 3_000,
}

// env is what every measurement shares: the database and the sizes.
type env struct {
	url   string
	sizes Sizes
	log   io.Writer // progress lines; the table goes to stdout
	// stmts, when set, times every statement of every pool the harness
	// opens, for the "where the time goes" notes of a missed target.
	stmts *stmtTimer
}

func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(e.log, "bench: "+format+"\n", args...)
}

// queryCounter counts the statements a pool sends, client side, so idle cost
// is measured per subject even while other clients use the same server.
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// pool opens a pool of at most maxConns connections; counter, when not nil,
// counts every statement it sends.
func (e *env) pool(ctx context.Context, maxConns int32, counter *queryCounter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		return nil, fmt.Errorf("parsing the database URL: %w", err) // pgx's message does not repeat a password
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	switch {
	case counter != nil && e.stmts != nil:
		cfg.ConnConfig.Tracer = bothTracers{counter, e.stmts}
	case counter != nil:
		cfg.ConnConfig.Tracer = counter
	case e.stmts != nil:
		cfg.ConnConfig.Tracer = e.stmts
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("the database is unreachable: %w", err)
	}
	return p, nil
}

// schema is one fresh schema with pgfeed's tables migrated into it, dropped by
// drop. Every measurement gets its own, so none sees another's rows, bloat or
// cached plans.
type schema struct {
	name string
	pool *pgxpool.Pool // an admin pool, for setup SQL
}

// table is a schema-qualified pgfeed table name. The names are the ones
// pgfeed's package doc lists under its default prefix.
func (s *schema) table(t string) string {
	return pgx.Identifier{s.name, pgfeed.DefaultTablePrefix + t}.Sanitize()
}

// qualify is a schema-qualified name of the harness's own tables.
func (s *schema) qualify(t string) string { return pgx.Identifier{s.name, t}.Sanitize() }

func (e *env) newSchema(ctx context.Context, admin *pgxpool.Pool) (*schema, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &schema{name: "kbench_" + hex.EncodeToString(b[:]), pool: admin}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s.name}.Sanitize()); err != nil {
		return nil, err
	}
	if _, err := pgfeed.Migrate(ctx, admin, pgfeed.Options{Schema: s.name}); err != nil {
		s.drop()
		return nil, err
	}
	return s, nil
}

func (s *schema) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = s.pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s.name}.Sanitize()+" CASCADE")
}

// store opens a pgfeed store on the schema over p.
func (s *schema) store(ctx context.Context, p *pgxpool.Pool) (*pgfeed.Store, error) {
	return pgfeed.New(ctx, p, pgfeed.Options{Schema: s.name, Logger: quiet})
}

var quiet = slog.New(slog.DiscardHandler)

// docSQL builds a document of about 300 bytes from the integer expression i,
// the same shape as doc300 builds in Go.
const docSQL = `jsonb_build_object('id', %[1]s, 'name', 'item-' || %[1]s, 'pad', repeat(md5(%[1]s::text), 8))`

// doc300 is a JSON document of about 300 bytes for key number i.
func doc300(i int) []byte {
	pad := fmt.Sprintf("%032x", i*2654435761)
	pad = pad[len(pad)-32:]
	var p []byte
	for range 8 {
		p = append(p, pad...)
	}
	return fmt.Appendf(nil, `{"id": %d, "name": "item-%d", "pad": "%s"}`, i, i, p)
}

// fillFeed writes n rows (seqs 1..n, keys k00000001…) into feed f in one
// statement, with deleted rows as tombstones, and sets the feed's head to n:
// the state a feed reaches after n single-key changes, then vacuums it. It is
// far faster than n writes through the store and yields the same rows.
func (s *schema) fillFeed(ctx context.Context, f feed.FeedName, n int, deleted bool) error {
	doc := fmt.Sprintf(docSQL, "i")
	if deleted {
		doc = "NULL::jsonb"
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.table("rows")+` (feed, key, seq, doc)
SELECT $1::text, 'k' || lpad(i::text, 8, '0'), i, `+doc+` FROM generate_series(1, $2::bigint) AS i`, string(f), n); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.table("generations")+` (feed, head) VALUES ($1::text, $2::bigint)
ON CONFLICT (feed) DO UPDATE SET head = excluded.head`, string(f), n); err != nil {
		return err
	}
	// VACUUM as autovacuum would on a table that size: the visibility map
	// lets counts (describe's pending) use index-only scans, as they would
	// on a feed in service.
	_, err := s.pool.Exec(ctx, "VACUUM (ANALYZE) "+s.table("rows"))
	return err
}

// placeCursor registers sink with a cursor at (generation 1, seq) and no
// lease holder, as if an earlier worker had got there and stopped.
func (s *schema) placeCursor(ctx context.Context, id feed.SinkID, seq int) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.table("cursors")+` (feed, sink, generation, seq) VALUES ($1::text, $2::text, 1, $3::bigint)`,
		string(id.Feed), string(id.Sink), seq)
	return err
}

// stats summarises the samples of one figure.
type stats struct {
	Median, Min, Max float64
	N                int
}

func summarize(xs []float64) stats {
	if len(xs) == 0 {
		return stats{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stats{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// percentile is the q-quantile (nearest rank) of sorted durations, in ms.
func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(len(sorted)-1, i))
	return float64(sorted[i].Nanoseconds()) / 1e6
}

// interleave runs subject and baseline once per run, alternating which goes
// first, so a drift of the machine during the run hits both alike. Each
// function gets the run number and returns that run's figure.
func interleave(runs int, subject, baseline func(run int) (float64, error)) (sub, base []float64, err error) {
	out, err := interleaveN(runs, subject, baseline)
	if err != nil {
		return nil, nil, err
	}
	return out[0], out[1], nil
}

// interleaveN runs every function once per run, starting each run one
// function further along, and returns each function's figures.
func interleaveN(runs int, fns ...func(run int) (float64, error)) ([][]float64, error) {
	out := make([][]float64, len(fns))
	for r := range runs {
		for j := range fns {
			i := (r + j) % len(fns)
			v, err := fns[i](r)
			if err != nil {
				return nil, err
			}
			out[i] = append(out[i], v)
		}
	}
	return out, nil
}

// waitFor polls cond every 5 ms until it holds or ctx ends. No figure is
// read off when the poll sees cond: each measurement stamps its own end (a
// worker's last advance, a consumer's last arrival), so the poll can be slow
// enough to stay out of the way of what it waits for.
func waitFor(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// noopSink is a sink that costs nothing: it only counts what it is sent, so a
// measurement through it is the driver's and the store's cost alone.
type noopSink struct{ n atomic.Int64 }

func (s *noopSink) Apply(_ context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	s.n.Add(int64(len(recs)))
	return nil, nil
}

func (s *noopSink) OpenResync(context.Context, feed.Generation) (feed.ResyncTarget, error) {
	return noopTarget{s}, nil
}

type noopTarget struct{ s *noopSink }

func (t noopTarget) Apply(ctx context.Context, recs []feed.Record) ([]feed.Rejection, error) {
	return t.s.Apply(ctx, recs)
}
func (noopTarget) Publish(context.Context) error { return nil }
func (noopTarget) Abort(context.Context) error   { return nil }
