package pgschema_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// A test-only package with two steps; build1 embeds the first only, as the
// build before the one that added the second would.
var (
	step1  = &fstest.MapFile{Data: []byte(`CREATE TABLE IF NOT EXISTS {{table "one"}} (id int PRIMARY KEY);`)}
	step2  = &fstest.MapFile{Data: []byte(`CREATE TABLE IF NOT EXISTS {{table "two"}} (id int PRIMARY KEY);`)}
	build1 = fstest.MapFS{"m/0001_one.sql": step1}
	build2 = fstest.MapFS{"m/0001_one.sql": step1, "m/0002_two.sql": step2}
)

func set(files fstest.MapFS, schema string) pgschema.Migrations {
	return pgschema.Migrations{Package: "pgtestpkg", Files: files, Dir: "m", Schema: schema, Prefix: "p_"}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func wantNotMigrated(t *testing.T, err error, found, need int) {
	t.Helper()
	var nm *pgschema.NotMigratedError
	if !errors.Is(err, pgschema.ErrNotMigrated) || !errors.As(err, &nm) || nm.Found != found || nm.Need != need || nm.Package != "pgtestpkg" {
		t.Fatalf("Check = %v; want a NotMigratedError found %d, need %d", err, found, need)
	}
}

// TestCheckVersions: the startup check compares the highest version the
// schema records for the package with the highest the build embeds. None
// recorded, or fewer than the build needs, is a NotMigratedError that says
// both; as many is fine, and so is more (an old build beside a schema a newer
// one migrated, in a rolling deploy).
func TestCheckVersions(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 30*time.Second)
	old, cur := set(build1, schema), set(build2, schema)
	if need, err := cur.Need(); err != nil || need != 2 {
		t.Fatalf("Need = %d, %v; want 2, the highest embedded version", need, err)
	}
	wantNotMigrated(t, cur.Check(ctx, pool), 0, 2)
	if got, err := old.Apply(ctx, pool); err != nil || !slices.Equal(got, []int{1}) {
		t.Fatalf("Apply(build 1) = %v, %v", got, err)
	}
	wantNotMigrated(t, cur.Check(ctx, pool), 1, 2)
	err := cur.Check(ctx, pool)
	if want := `pgtestpkg: schema "` + schema + `" is not migrated (found 1, need 2) for table prefix "p_": run pgtestpkg.Migrate or kairos migrate`; err.Error() != want {
		t.Fatalf("message = %q\nwant      %q", err, want)
	}
	if err := old.Check(ctx, pool); err != nil {
		t.Fatalf("build 1 on its own schema: %v", err)
	}
	if got, err := cur.Apply(ctx, pool); err != nil || !slices.Equal(got, []int{2}) {
		t.Fatalf("Apply(build 2) = %v, %v; want [2]", got, err)
	}
	if err := cur.Check(ctx, pool); err != nil {
		t.Fatalf("build 2 after its Migrate: %v", err)
	}
	if err := old.Check(ctx, pool); err != nil {
		t.Fatalf("build 1 beside a schema at version 2: %v; a newer schema is accepted", err)
	}
	if got, err := old.Apply(ctx, pool); err != nil || len(got) != 0 {
		t.Fatalf("build 1's Apply on a schema at version 2 = %v, %v; want nothing to do", got, err)
	}
	// Another package's versions, on the same table, count for nothing.
	other := cur
	other.Package = "othertestpkg"
	var nm *pgschema.NotMigratedError
	if err := other.Check(ctx, pool); !errors.As(err, &nm) || nm.Found != 0 {
		t.Fatalf("another package's Check = %v; want found 0", err)
	}
}

// TestCheckKeepsTransactionUsable: a check that finds nothing raises no
// error in the database, so a transaction it runs in stays usable.
func TestCheckKeepsTransactionUsable(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := ctxFor(t, 30*time.Second)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	wantNotMigrated(t, set(build2, pgtest.Schema(t)).Check(ctx, tx), 0, 2)
	var one int
	if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatalf("the transaction after a check that found no table: %v", err)
	}
}

// TestUnreachable: a server that cannot be reached is an UnreadableError for
// the check and a MigrationFailedError (not a feed write failure) for Apply,
// and neither repeats the password or the URL.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	url := "postgres://kairos:hunter2-very-secret@" + pgtest.ClosedPort(t) + "/app?connect_timeout=2"
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := ctxFor(t, 10*time.Second)
	m := set(build2, "app")
	checkErr := m.Check(ctx, pool)
	var unr *feed.UnreadableError
	if !errors.As(checkErr, &unr) || !strings.Contains(unr.Op, `schema "app"`) {
		t.Fatalf("Check on a closed port = %v; want an UnreadableError saying what it was doing", checkErr)
	}
	_, applyErr := m.Apply(ctx, pool)
	var mf *pgschema.MigrationFailedError
	if !errors.Is(applyErr, pgschema.ErrMigrationFailed) || !errors.As(applyErr, &mf) || mf.Schema != "app" || mf.Version != 0 {
		t.Fatalf("Apply on a closed port = %v; want a MigrationFailedError before any step", applyErr)
	}
	if errors.Is(applyErr, feed.ErrWriteFailed) {
		t.Fatalf("Apply's failure matches feed.ErrWriteFailed: %v", applyErr)
	}
	for _, err := range []error{checkErr, applyErr} {
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), url) {
			t.Fatalf("the error echoes the password: %v", err)
		}
	}
}

// TestStepFailure: a step that fails names itself, and leaves nothing
// behind: not its tables, not the schema, not a version row.
func TestStepFailure(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 30*time.Second)
	bad := set(fstest.MapFS{"m/0001_one.sql": step1, "m/0002_bad.sql": {Data: []byte(`SELECT no_such_column FROM {{table "one"}};`)}}, schema)
	_, err := bad.Apply(ctx, pool)
	var mf *pgschema.MigrationFailedError
	if !errors.As(err, &mf) || mf.Version != 2 || mf.Name != "0002_bad" || !strings.Contains(err.Error(), "migration 0002_bad") {
		t.Fatalf("Apply with a failing step = %v; want a MigrationFailedError naming 0002_bad", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after a failed migration the schema exists (%d, %v); the transaction should have rolled it back", n, err)
	}
}

// TestResolveNamesRefusesReservedSchema: PostgreSQL keeps schemas named pg_*
// for itself; the rule refuses them up front, naming the field, while a
// table prefix may start so.
func TestResolveNamesRefusesReservedSchema(t *testing.T) {
	t.Parallel()
	_, err := pgschema.ResolveNames("pg_kairos", "", "kairos", "feed_", "generations")
	var inv *feed.InvalidError
	if !errors.As(err, &inv) || inv.Field != "schema" || !strings.Contains(inv.Reason, "reserves") {
		t.Fatalf("ResolveNames(pg_kairos) = %v; want an InvalidError on schema saying why", err)
	}
	for _, ok := range []string{"pgx", "pg", "my_pg_schema", "_pg_"} {
		if _, err := pgschema.ResolveNames(ok, "", "kairos", "feed_", "generations"); err != nil {
			t.Errorf("ResolveNames(%s) = %v; only a pg_ prefix is reserved", ok, err)
		}
	}
	if _, err := pgschema.ResolveNames("", "pg_", "kairos", "feed_", "generations"); err != nil {
		t.Errorf("a pg_ table prefix: %v; tables may be named so", err)
	}
}

// createLegacy makes the version table as builds before the package column
// made it, holding rows.
func createLegacy(ctx context.Context, t *testing.T, db pgschema.Beginner, m pgschema.Migrations, rows ...string) {
	t.Helper()
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgschema.Quote(m.Schema)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE `+m.Table("migrations")+` (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`); err != nil {
			return err
		}
		for _, r := range rows {
			v, _, _ := strings.Cut(r, "_")
			if _, err := tx.Exec(ctx, `INSERT INTO `+m.Table("migrations")+` (version, name) VALUES ($1::text::integer, $2)`, v, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLegacyRowOfNoPackageRefused: an old version table holding a migration
// no Kairos package ever had is not guessed at: the upgrade fails, says why,
// and changes nothing.
func TestLegacyRowOfNoPackageRefused(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 30*time.Second)
	m := set(build2, schema)
	createLegacy(ctx, t, pool, m, "0001_feed", "0002_mystery")
	var nm *pgschema.NotMigratedError
	if err := m.Check(ctx, pool); !errors.As(err, &nm) || !nm.Legacy || !strings.Contains(err.Error(), "predates per-package versions") {
		t.Fatalf("Check on an old version table = %v; want a NotMigratedError that says the table is of the old shape", err)
	}
	_, err := m.Apply(ctx, pool)
	if !errors.Is(err, pgschema.ErrMigrationFailed) || !strings.Contains(err.Error(), "2 0002_mystery") {
		t.Fatalf("Apply over an unknown old row = %v; want a MigrationFailedError naming the row", err)
	}
	var cols int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'p_migrations'`, schema).Scan(&cols); err != nil || cols != 3 {
		t.Fatalf("the old table has %d columns after the refused upgrade (%v); want its 3, untouched", cols, err)
	}
}

// TestLegacyUpgradeConcurrent: many migrators of two packages upgrading one
// old version table at once all succeed; the table is upgraded once, keeps
// its old row under its package, and each package's steps apply exactly once.
func TestLegacyUpgradeConcurrent(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 60*time.Second)
	feedSet := set(build2, schema)
	feedSet.Package = "pgfeed" // its version 1 is the old row 0001_feed
	readSet := set(build2, schema)
	readSet.Package = "pgread"
	createLegacy(ctx, t, pool, feedSet, "0001_feed")
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied = map[string][]int{}
		errs    []error
	)
	start := make(chan struct{})
	for i := range 8 {
		m := []pgschema.Migrations{feedSet, readSet}[i%2]
		wg.Go(func() {
			<-start
			got, err := m.Apply(ctx, pool)
			mu.Lock()
			defer mu.Unlock()
			applied[m.Package] = append(applied[m.Package], got...)
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent upgrades: %v", errs)
	}
	for pkg, want := range map[string][]int{"pgfeed": {2}, "pgread": {1, 2}} {
		got := applied[pkg]
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s applied %v across the runs; want each of %v once", pkg, got, want)
		}
	}
	rows, err := pool.Query(ctx, `SELECT package || ' ' || name FROM `+feedSet.Table("migrations")+` ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"pgfeed 0001_feed", "pgfeed 0002_two", "pgread 0001_one", "pgread 0002_two"}; !slices.Equal(got, want) {
		t.Fatalf("version rows = %v; want %v", got, want)
	}
}

// feedAndRead are two test-only sets named as pgfeed and pgread, so an old
// version table's rows (0001_feed, 0001_read) belong to them.
func feedAndRead(schema string) (feedSet, readSet pgschema.Migrations) {
	feedSet, readSet = set(build2, schema), set(build2, schema)
	feedSet.Package, readSet.Package = "pgfeed", "pgread"
	return feedSet, readSet
}

// runAtOnce runs each of sqls on a connection of its own, all at once, each
// in the simple protocol, and returns the errors.
func runAtOnce(t *testing.T, ctx context.Context, sqls []string) []error {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := make(chan struct{})
	for _, sql := range sqls {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, pgtest.URL())
			if err == nil {
				defer conn.Close(context.Background())
				<-start
				_, err = conn.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// TestPrintedScriptsAtOnce: the printed scripts of two packages, each run
// as one transaction by processes at once, on a new schema or over an old
// version table, serialise like Migrate does: all succeed and record both
// packages.
func TestPrintedScriptsAtOnce(t *testing.T) {
	t.Parallel()
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "new schema", true: "old version table"}[old], func(t *testing.T) {
			t.Parallel()
			printedScriptsAtOnce(t, old)
		})
	}
}

func printedScriptsAtOnce(t *testing.T, old bool) {
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 60*time.Second)
	feedSet, readSet := feedAndRead(schema)
	if old {
		createLegacy(ctx, t, pool, feedSet, "0001_feed")
	}
	var sqls []string
	for i := range 8 {
		script, err := []pgschema.Migrations{feedSet, readSet}[i%2].Script()
		if err != nil {
			t.Fatal(err)
		}
		sqls = append(sqls, script)
	}
	if errs := runAtOnce(t, ctx, sqls); len(errs) > 0 {
		t.Fatalf("scripts run at once: %v", errs)
	}
	for _, m := range []pgschema.Migrations{feedSet, readSet} {
		if err := m.Check(ctx, pool); err != nil {
			t.Fatalf("%s after the scripts: %v", m.Package, err)
		}
	}
}

// TestUpgradeStatementByStatement: the upgrade of an old version table,
// run at once by scripts whose statements each commit on their own (psql
// without --single-transaction), where the schema lock is gone before the
// upgrade starts, still happens once: the others find it done.
func TestUpgradeStatementByStatement(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 60*time.Second)
	feedSet, _ := feedAndRead(schema)
	createLegacy(ctx, t, pool, feedSet, "0001_feed")
	script, err := feedSet.Script()
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(script, "DO $upgrade$")
	end := strings.Index(script, "$upgrade$;")
	if start < 0 || end < start {
		t.Fatalf("no upgrade block in the script:\n%s", script)
	}
	upgrade := script[start : end+len("$upgrade$;")]
	if errs := runAtOnce(t, ctx, slices.Repeat([]string{upgrade}, 8)); len(errs) > 0 {
		t.Fatalf("upgrades at once: %v", errs)
	}
	var pk string
	if err := pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::text::regclass AND contype = 'p'`, feedSet.Table("migrations")).Scan(&pk); err != nil || pk != "PRIMARY KEY (package, version)" {
		t.Fatalf("primary key after the upgrade = %q, %v", pk, err)
	}
	if err := feedSet.Check(ctx, pool); err == nil || !errors.Is(err, pgschema.ErrNotMigrated) {
		t.Fatalf("Check after the upgrade alone = %v; want found 1, need 2", err)
	}
}
