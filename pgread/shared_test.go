package pgread_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/pgread"
)

// sharedPrefix is the one table prefix both packages are given in these
// tests, so that they share one version table.
const sharedPrefix = "app_"

// versions lists the version table's rows as "package version name".
func versions(t *testing.T, pool *pgxpool.Pool, schema, prefix string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT package || ' ' || version || ' ' || name FROM "`+schema+`"."`+prefix+`migrations" ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// tableNames lists schema's tables, sorted.
func tableNames(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// allVersions is every step both packages embed, as version rows.
func allVersions(t *testing.T, schema, prefix string) (feedSteps, readSteps []int, rows []string) {
	t.Helper()
	fl, err := pgfeed.Migrations(pgfeed.Options{Schema: schema, TablePrefix: prefix})
	mustf(t, err, "pgfeed.Migrations")
	rl, err := pgread.Migrations(pgread.Options{Schema: schema, TablePrefix: prefix})
	mustf(t, err, "pgread.Migrations")
	for _, m := range fl {
		feedSteps = append(feedSteps, m.Version)
		rows = append(rows, m.Package+" "+strconv.Itoa(m.Version)+" "+m.Name)
	}
	for _, m := range rl {
		readSteps = append(readSteps, m.Version)
		rows = append(rows, m.Package+" "+strconv.Itoa(m.Version)+" "+m.Name)
	}
	slices.Sort(rows)
	return feedSteps, readSteps, rows
}

// wantBothWork fails unless both packages' tables are there and their
// constructors accept the schema, and a feed write, a checkpoint commit and
// an append land.
func wantBothWork(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) {
	t.Helper()
	got := tableNames(t, pool, schema)
	for _, table := range []string{"cursors", "generations", "parked", "rows", "checkpoints", "log", "streams", "events", "migrations"} {
		if !slices.Contains(got, sharedPrefix+table) {
			t.Fatalf("table %s%s is missing; tables = %v", sharedPrefix, table, got)
		}
	}
	feeds, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema, TablePrefix: sharedPrefix, Logger: quiet})
	mustf(t, err, "pgfeed.New")
	defer feeds.Close()
	_, err = feeds.WriteCommitted(ctx, "f", []feed.Change{feed.Put("k", []byte(`{}`))})
	mustf(t, err, "a feed write")
	store, err := pgread.NewStore(ctx, pool, pgread.Options{Schema: schema, TablePrefix: sharedPrefix})
	mustf(t, err, "pgread.NewStore")
	mustf(t, store.Commit(ctx, keyEU, ckpt(0, 0), 1, nil), "a checkpoint commit")
	log, err := pgread.NewEventLog(ctx, pool, pgread.Options{Schema: schema, TablePrefix: sharedPrefix})
	mustf(t, err, "pgread.NewEventLog")
	_, err = log.AppendCommitted(ctx, "s", pgread.NoStream, []pgread.EventData{ev("E", `{}`)})
	mustf(t, err, "an append")
}

// TestSharedPrefixBothOrders: pgfeed and pgread given one schema and one
// prefix each apply all their own steps, whichever migrates first, and the
// version table they share records both.
func TestSharedPrefixBothOrders(t *testing.T) {
	t.Parallel()
	for _, feedFirst := range []bool{true, false} {
		name := map[bool]string{true: "feed first", false: "read first"}[feedFirst]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
			schema := pgtest.Schema(t)
			ctx := ctxFor(t, 30*time.Second)
			feedSteps, readSteps, rows := allVersions(t, schema, sharedPrefix)
			migrateFeed := func() {
				got, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema, TablePrefix: sharedPrefix})
				if err != nil || !slices.Equal(got, feedSteps) {
					t.Fatalf("pgfeed.Migrate = %v, %v; want %v", got, err, feedSteps)
				}
			}
			migrateRead := func() {
				got, err := pgread.Migrate(ctx, pool, pgread.Options{Schema: schema, TablePrefix: sharedPrefix})
				if err != nil || !slices.Equal(got, readSteps) {
					t.Fatalf("pgread.Migrate = %v, %v; want %v, not skipped for pgfeed's", got, err, readSteps)
				}
			}
			if feedFirst {
				migrateFeed()
				migrateRead()
			} else {
				migrateRead()
				migrateFeed()
			}
			if got := versions(t, pool, schema, sharedPrefix); !slices.Equal(got, rows) {
				t.Fatalf("version rows = %v; want %v", got, rows)
			}
			wantBothWork(t, ctx, pool, schema)
		})
	}
}

// TestSharedPrefixConcurrent: migrators of both packages on one schema and
// prefix, at once, each on its own connection as separate processes are:
// every one succeeds, each package's steps apply exactly once, and both
// sets of tables and version rows are there.
func TestSharedPrefixConcurrent(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 60*time.Second)
	feedSteps, readSteps, rows := allVersions(t, schema, sharedPrefix)
	applied, errs := migrateAtOnce(t, ctx, schema, 8)
	if len(errs) > 0 {
		t.Fatalf("concurrent migrators: %v", errs)
	}
	if got := applied["pgfeed"]; !slices.Equal(got, feedSteps) {
		t.Errorf("pgfeed's migrators applied %v between them; want each of %v once", got, feedSteps)
	}
	if got := applied["pgread"]; !slices.Equal(got, readSteps) {
		t.Errorf("pgread's migrators applied %v between them; want each of %v once", got, readSteps)
	}
	if got := versions(t, pool, schema, sharedPrefix); !slices.Equal(got, rows) {
		t.Fatalf("version rows = %v; want %v", got, rows)
	}
	wantBothWork(t, ctx, pool, schema)
}

// migrateAtOnce starts n migrators, alternately pgfeed's and pgread's, on
// schema and sharedPrefix, each on a connection of its own, and returns the
// versions each package's migrators applied between them (sorted) and the
// errors.
func migrateAtOnce(t *testing.T, ctx context.Context, schema string, n int) (map[string][]int, []error) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied = map[string][]int{}
		errs    []error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, pgtest.URL())
			var got []int
			pkg := "pgfeed"
			if err == nil {
				defer conn.Close(context.Background())
				<-start
				if i%2 == 0 {
					got, err = pgfeed.Migrate(ctx, conn, pgfeed.Options{Schema: schema, TablePrefix: sharedPrefix})
				} else {
					pkg = "pgread"
					got, err = pgread.Migrate(ctx, conn, pgread.Options{Schema: schema, TablePrefix: sharedPrefix})
				}
			}
			mu.Lock()
			defer mu.Unlock()
			applied[pkg] = append(applied[pkg], got...)
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	close(start)
	wg.Wait()
	for _, v := range applied {
		slices.Sort(v)
	}
	return applied, errs
}

// legacy turns schema's shared version table back into the shape builds
// before per-package versions wrote (version the key, no package), holding
// only the rows named: what those builds left behind, the other package's
// step skipped for a version number already taken.
func legacy(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, names ...string) {
	t.Helper()
	table := `"` + schema + `"."` + sharedPrefix + `migrations"`
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		stmts := []string{
			`DROP TABLE ` + table,
			`CREATE TABLE ` + table + ` (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`,
		}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		for i, name := range names {
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (version, name, applied_at) VALUES ($1, $2, '2020-01-01T00:00:00Z')`, i+1, name); err != nil {
				return err
			}
		}
		return nil
	})
	mustf(t, err, "making the old version table")
}

// TestLegacyVersionTableUpgrades: a schema an old build migrated for one
// package on a shared prefix (its version table of the old shape, the other
// package's step skipped) is upgraded in place by either package's Migrate,
// by its printed script, or by many migrators at once: the old row goes to
// the package whose step it names and keeps its time, that step is not
// applied again, and the skipped one is applied.
func TestLegacyVersionTableUpgrades(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		owner string // the package whose step the old row names
		how   string // "feed", "read", "script" or "concurrent"
	}{
		{"pgfeed's row, pgfeed migrates first", "pgfeed", "feed"},
		{"pgfeed's row, pgread migrates first", "pgfeed", "read"},
		{"pgread's row, pgfeed migrates first", "pgread", "feed"},
		{"pgread's row, pgread migrates first", "pgread", "read"},
		{"pgfeed's row, printed scripts", "pgfeed", "script"},
		{"pgread's row, at once", "pgread", "concurrent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
			schema := pgtest.Schema(t)
			ctx := ctxFor(t, 60*time.Second)
			feedOpts := pgfeed.Options{Schema: schema, TablePrefix: sharedPrefix}
			readOpts := pgread.Options{Schema: schema, TablePrefix: sharedPrefix}
			// The old build's state: the owner's tables and its one row.
			var err error
			if c.owner == "pgfeed" {
				_, err = pgfeed.Migrate(ctx, pool, feedOpts)
				legacy(t, ctx, pool, schema, "0001_feed")
			} else {
				_, err = pgread.Migrate(ctx, pool, readOpts)
				legacy(t, ctx, pool, schema, "0001_read")
			}
			mustf(t, err, "the old build's migration")
			_, err = pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema, TablePrefix: sharedPrefix})
			var nm *pgfeed.NotMigratedError
			if !errors.As(err, &nm) || !nm.Legacy {
				t.Fatalf("pgfeed.New on the old version table = %v; want a NotMigratedError saying so", err)
			}
			feedSteps, readSteps, rows := allVersions(t, schema, sharedPrefix)
			want := map[string][]int{"pgfeed": feedSteps[1:], "pgread": readSteps}
			if c.owner == "pgread" {
				want = map[string][]int{"pgfeed": feedSteps, "pgread": readSteps[1:]}
			}
			got := map[string][]int{}
			switch c.how {
			case "feed", "read":
				for _, pkg := range map[string][]string{"feed": {"pgfeed", "pgread"}, "read": {"pgread", "pgfeed"}}[c.how] {
					var v []int
					if pkg == "pgfeed" {
						v, err = pgfeed.Migrate(ctx, pool, feedOpts)
					} else {
						v, err = pgread.Migrate(ctx, pool, readOpts)
					}
					mustf(t, err, "%s.Migrate", pkg)
					got[pkg] = v
				}
			case "script":
				for _, f := range []func() (string, error){
					func() (string, error) { return pgread.MigrationSQL(readOpts) },
					func() (string, error) { return pgfeed.MigrationSQL(feedOpts) },
				} {
					script, err := f()
					mustf(t, err, "MigrationSQL")
					_, err = pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
					mustf(t, err, "running the printed script")
				}
				// The scripts applied everything; Migrate finds nothing left.
				for _, pkg := range []string{"pgfeed", "pgread"} {
					var v []int
					if pkg == "pgfeed" {
						v, err = pgfeed.Migrate(ctx, pool, feedOpts)
					} else {
						v, err = pgread.Migrate(ctx, pool, readOpts)
					}
					mustf(t, err, "%s.Migrate after the scripts", pkg)
					if len(v) != 0 {
						t.Fatalf("%s.Migrate after the scripts applied %v", pkg, v)
					}
				}
				got = want
			case "concurrent":
				var errs []error
				got, errs = migrateAtOnce(t, ctx, schema, 8)
				if len(errs) > 0 {
					t.Fatalf("concurrent migrators: %v", errs)
				}
			}
			for _, pkg := range []string{"pgfeed", "pgread"} {
				if !slices.Equal(got[pkg], want[pkg]) {
					t.Errorf("%s applied %v; want %v (its old step not again, its skipped step yes)", pkg, got[pkg], want[pkg])
				}
			}
			if got := versions(t, pool, schema, sharedPrefix); !slices.Equal(got, rows) {
				t.Fatalf("version rows = %v; want %v", got, rows)
			}
			var kept int
			mustf(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`"."`+sharedPrefix+`migrations" WHERE applied_at = '2020-01-01T00:00:00Z' AND package = $1`, c.owner).Scan(&kept), "the old row")
			if kept != 1 {
				t.Fatalf("the old row's time was not kept under %s", c.owner)
			}
			wantBothWork(t, ctx, pool, schema)
		})
	}
}
