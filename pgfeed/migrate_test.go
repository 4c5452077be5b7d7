package pgfeed_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// tables lists the tables of schema, sorted.
func tables(t *testing.T, db pgfeed.DBTX, schema string) []string {
	t.Helper()
	rows, err := db.Query(t.Context(), `SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestMigrateConcurrentAndIdempotent: eight processes migrating one fresh
// schema at once all succeed, exactly one applies each version, and a later
// run applies nothing.
func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	list, err := pgfeed.Migrations(pgfeed.Options{Schema: schema, TablePrefix: "x_"})
	if err != nil || len(list) == 0 {
		t.Fatalf("Migrations = %v, %v", list, err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied []int
		errs    []error
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each on its own connection, as separate processes would be.
			conn, err := pgx.Connect(t.Context(), pgtest.URL())
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			defer conn.Close(context.Background())
			got, err := pgfeed.Migrate(t.Context(), conn, pgfeed.Options{Schema: schema, TablePrefix: "x_"})
			mu.Lock()
			defer mu.Unlock()
			applied = append(applied, got...)
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent Migrate: %v", errs)
	}
	slices.Sort(applied)
	var want []int
	for _, m := range list {
		want = append(want, m.Version)
	}
	if !slices.Equal(applied, want) {
		t.Fatalf("versions applied across 8 concurrent runs = %v; want each of %v once", applied, want)
	}
	if got, err := pgfeed.Migrate(t.Context(), pool, pgfeed.Options{Schema: schema, TablePrefix: "x_"}); err != nil || len(got) != 0 {
		t.Fatalf("a later Migrate applied %v, %v; want nothing", got, err)
	}
	if got := tables(t, pool, schema); !slices.Equal(got, []string{"x_backfill_shares", "x_backfills", "x_captures", "x_changes", "x_cursors", "x_generations", "x_migrations", "x_parked", "x_reserved", "x_rows", "x_sealers", "x_stores", "x_switches", "x_unsealed"}) {
		t.Fatalf("tables = %v", got)
	}
	var unlogged int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relpersistence <> 'p'`, schema).Scan(&unlogged); err != nil || unlogged != 0 {
		t.Fatalf("%d tables are not logged (%v); fencing state must survive a crash", unlogged, err)
	}
}

// TestMigrateMovesUnsealedWrites: a schema whose concurrent-mode feed has
// writes waiting unsealed in the rows table (the layout before migration 5:
// a key never sealed, and a sealed key with a newer write beside it) keeps
// them across the migration: they wait in the unsealed table, a round seals
// them with their documents, and the old layout's write now fails instead
// of waiting where no sealer looks.
func TestMigrateMovesUnsealedWrites(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	list, err := pgfeed.Migrations(pgfeed.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list {
		if m.Version <= 3 {
			if _, err := pool.Exec(t.Context(), m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatalf("migration %d: %v", m.Version, err)
			}
		}
	}
	q := `"` + schema + `".`
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+q+`feed_generations (feed, head, write_mode) VALUES ('f', 2, 'concurrent');
INSERT INTO `+q+`feed_rows (feed, key, seq, doc, pending, pending_doc) VALUES
	('f', 'sealed', 1, '{"v":1}', false, NULL),
	('f', 'rewritten', 2, '{"v":1}', true, '{"v":2}'),
	('f', 'deleted', NULL, NULL, true, NULL),
	('f', 'fresh', NULL, NULL, true, '{"v":3}')`, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	if got, err := pgfeed.Migrate(t.Context(), pool, pgfeed.Options{Schema: schema}); err != nil || !slices.Contains(got, 5) {
		t.Fatalf("Migrate = %v, %v; want migration 5 applied", got, err)
	}
	s := newStore(t, db{pool: pool, schema: schema}, pgfeed.Options{})
	if d, err := s.Describe(t.Context(), "f"); err != nil || d.Unsealed != 3 {
		t.Fatalf("after the migration: %d unsealed (%v); want 3", d.Unsealed, err)
	}
	if got := feedDocs(t, s, "f"); len(got) != 2 || got["sealed"] != `{"v": 1}` || got["rewritten"] != `{"v": 1}` {
		t.Fatalf("sealed rows before the round = %v; want the two sealed ones as they were", got)
	}
	if n := sealAll(t, s, "f"); n != 3 {
		t.Fatalf("the rounds sealed %d rows; want 3", n)
	}
	want := map[feed.Key]string{"sealed": `{"v": 1}`, "rewritten": `{"v": 2}`, "deleted": "", "fresh": `{"v": 3}`}
	if got := feedDocs(t, s, "f"); !maps.Equal(got, want) {
		t.Fatalf("after sealing: %v; want %v", got, want)
	}
	_, err = pool.Exec(t.Context(), `UPDATE `+q+`feed_rows SET pending = true, pending_doc = '{"v":4}' WHERE feed = 'f' AND key = 'sealed'`)
	if !strings.Contains(fmt.Sprint(err), "unsealed_writes_live_apart") {
		t.Fatalf("a write in the old layout after the migration: %v; want the check to refuse it", err)
	}
}

// TestMigrateRecordsConcurrentFeeds: migration 8 gives every feed already
// in the concurrent mode its row of the switches table, the row a writer
// in REPEATABLE READ checks (mode_seen) and a switch rewrites, so that such
// a writer of a feed switched before the step does not add it itself; a
// feed in the locked mode gets its row at its first switch. The check
// then finds the row as the snapshot sees it and adds nothing.
func TestMigrateRecordsConcurrentFeeds(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	list, err := pgfeed.Migrations(pgfeed.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list {
		if m.Version <= 7 {
			if _, err := pool.Exec(t.Context(), m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatalf("migration %d: %v", m.Version, err)
			}
		}
	}
	q := `"` + schema + `".`
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+q+`feed_generations (feed, head, write_mode) VALUES ('c', 1, 'concurrent'), ('l', 1, 'locked')`); err != nil {
		t.Fatal(err)
	}
	if got, err := pgfeed.Migrate(t.Context(), pool, pgfeed.Options{Schema: schema}); err != nil || !slices.Equal(got, []int{8, 9, 10, 11, 12, 13}) {
		t.Fatalf("Migrate = %v, %v; want migrations 8 to 13 applied", got, err)
	}
	// Migration 12 drops the changes table's check of n, which every
	// insert paid for, whatever PostgreSQL named it.
	var checks int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_constraint WHERE conrelid = '`+q+`feed_changes'::regclass AND contype = 'c'`).Scan(&checks); err != nil || checks != 0 {
		t.Fatalf("after the migration the changes table has %d checks (%v); want none", checks, err)
	}
	// Migration 13 pins the search_path of the functions a keyed capture
	// trigger calls, which no longer pins it for them.
	var pinned []string
	if err := pool.QueryRow(t.Context(), `SELECT array_agg(p.proname::text ORDER BY p.proname) FROM pg_proc p
		WHERE p.pronamespace = $1::regnamespace AND p.proname IN ('feed_record', 'feed_write', 'feed_reset')
		AND 'search_path=pg_catalog, pg_temp' = ANY (p.proconfig)`, schema).Scan(&pinned); err != nil || !slices.Equal(pinned, []string{"feed_record", "feed_reset", "feed_write"}) {
		t.Fatalf("after the migration the functions with search_path pinned are %v (%v); want feed_record, feed_reset and feed_write", pinned, err)
	}
	switched := func() []string {
		t.Helper()
		rows, err := pool.Query(t.Context(), `SELECT feed FROM `+q+`feed_switches ORDER BY feed`)
		if err != nil {
			t.Fatal(err)
		}
		feeds, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return feeds
	}
	if got := switched(); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("after the migration the switches table holds %v; want the concurrent feed c", got)
	}
	err = pgx.BeginTxFunc(t.Context(), pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		var xid *string
		if _, err := tx.Exec(t.Context(), `SELECT `+q+`feed_mode_seen('c')`); err != nil {
			return err
		}
		if err := tx.QueryRow(t.Context(), `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil || xid != nil {
			return fmt.Errorf("after the check the transaction has id %v (%v); want none: the check writes nothing", xid, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, db{pool: pool, schema: schema}, pgfeed.Options{})
	if err := s.SetWriteMode(t.Context(), "l", feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	if got := switched(); !slices.Equal(got, []string{"c", "l"}) {
		t.Fatalf("after l's switch the switches table holds %v; want c and l", got)
	}
}

// TestMigrationSQLScript: the printed script, run by hand (as a team's own
// migration tool would) twice, builds a schema the store works on, and
// Migrate then finds nothing to do.
func TestMigrationSQLScript(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	script, err := pgfeed.MigrationSQL(pgfeed.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(script, `"`+schema+`"."feed_rows"`) {
		t.Fatalf("the script does not name the quoted, qualified tables:\n%s", script)
	}
	for range 2 {
		if _, err := pool.Exec(t.Context(), script, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("running the script: %v", err)
		}
	}
	if got, err := pgfeed.Migrate(t.Context(), pool, pgfeed.Options{Schema: schema}); err != nil || len(got) != 0 {
		t.Fatalf("Migrate after the script applied %v, %v; want nothing", got, err)
	}
	s := newStore(t, db{pool: pool, schema: schema}, pgfeed.Options{})
	if res, err := s.WriteCommitted(t.Context(), "f", []feed.Change{feed.Put("k", []byte(`{"a":1}`))}); err != nil || res.Last != 1 {
		t.Fatalf("a write on the scripted schema = %+v, %v", res, err)
	}
}

// TestDefaultSchemaNames: the zero Options mean schema kairos, prefix feed_.
func TestDefaultSchemaNames(t *testing.T) {
	script, err := pgfeed.MigrationSQL(pgfeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`CREATE SCHEMA IF NOT EXISTS "kairos"`, `"kairos"."feed_generations"`, `"kairos"."feed_cursors"`} {
		if !strings.Contains(script, want) {
			t.Errorf("the default script lacks %s", want)
		}
	}
}

// TestListenerReconnects: when the LISTEN session is terminated, every
// subscription is signalled once the listener is back (a commit may have
// been missed meanwhile), and commits after that wake it again.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	app := "kairos-listen-" + d.schema
	opts := pgfeed.Options{Listen: func(ctx context.Context) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(pgtest.URL())
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = app
		return pgx.ConnectConfig(ctx, cfg)
	}}
	s := newStore(t, d, opts)
	ctx := t.Context()
	sub, err := s.Subscribe(ctx, "wake")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	other, err := s.Subscribe(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	drain := func(c <-chan struct{}) {
		for {
			select {
			case <-c:
			default:
				return
			}
		}
	}
	wait := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("no wake-up %s within 10s", what)
		}
	}
	drain(sub.C())
	drain(other.C())
	if _, err := s.WriteCommitted(ctx, "wake", []feed.Change{feed.Put("a", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	wait("after a commit", sub.C())
	select {
	case <-other.C():
		t.Fatal("a commit to one feed woke another feed's subscription")
	case <-time.After(100 * time.Millisecond):
	}
	terminate(t, d.pool, app)
	wait("for the feed after the listener reconnected", sub.C())
	wait("for the other feed after the listener reconnected", other.C())
	drain(sub.C())
	if _, err := s.WriteCommitted(ctx, "wake", []feed.Change{feed.Put("b", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	wait("after a commit on the new session", sub.C())
}
