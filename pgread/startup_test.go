package pgread_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/pgread"
)

// wantNotMigrated fails unless err is pgfeed's NotMigratedError, for
// pgread's tables under schema, found 0, saying what to run.
func wantNotMigrated(t *testing.T, what string, err error, schema string) {
	t.Helper()
	list, lerr := pgread.Migrations(pgread.Options{})
	mustf(t, lerr, "Migrations")
	var nm *pgfeed.NotMigratedError
	if !errors.Is(err, pgfeed.ErrNotMigrated) || !errors.As(err, &nm) || nm.Package != "pgread" || nm.Schema != schema ||
		nm.Prefix != pgread.DefaultTablePrefix || nm.Found != 0 || nm.Need != list[len(list)-1].Version ||
		!strings.Contains(err.Error(), "run pgread.Migrate or kairos migrate") {
		t.Fatalf("%s = %v; want a NotMigratedError for pgread's tables in %s, found 0", what, err, schema)
	}
}

// TestConstructorsRefuseUnmigratedSchema: NewStore and NewEventLog on a
// schema without pgread's tables (none at all, or only pgfeed's) fail at
// once with pgfeed's NotMigratedError, naming pgread, instead of a store
// whose first commit meets a missing table.
func TestConstructorsRefuseUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 30*time.Second)
	opts := pgread.Options{Schema: schema}
	for _, stage := range []string{"no schema", "only pgfeed's tables"} {
		_, err := pgread.NewStore(ctx, pool, opts)
		wantNotMigrated(t, "NewStore, "+stage, err, schema)
		_, err = pgread.NewEventLog(ctx, pool, opts)
		wantNotMigrated(t, "NewEventLog, "+stage, err, schema)
		_, err = pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema})
		mustf(t, err, "pgfeed.Migrate")
	}
	_, err := pgread.Migrate(ctx, pool, opts)
	mustf(t, err, "pgread.Migrate")
	_, err = pgread.NewStore(ctx, pool, opts)
	mustf(t, err, "NewStore once migrated")
	_, err = pgread.NewEventLog(ctx, pool, opts)
	mustf(t, err, "NewEventLog once migrated")
}

// TestConstructorsUnreachable: a database that does not answer fails the
// constructors with an UnreadableError saying what they were doing, and
// Migrate with pgfeed's MigrationFailedError (not a feed write failure);
// none repeats the password.
func TestConstructorsUnreachable(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://kairos:hunter2-very-secret@"+pgtest.ClosedPort(t)+"/app?connect_timeout=2")
	mustf(t, err, "pool")
	defer pool.Close()
	ctx := ctxFor(t, 10*time.Second)
	opts := pgread.Options{Schema: "app"}
	_, storeErr := pgread.NewStore(ctx, pool, opts)
	_, logErr := pgread.NewEventLog(ctx, pool, opts)
	for _, err := range []error{storeErr, logErr} {
		var unr *feed.UnreadableError
		if !errors.As(err, &unr) || !strings.Contains(unr.Op, `checking that schema "app" is migrated for pgread`) {
			t.Fatalf("a constructor on a closed port = %v; want an UnreadableError saying what it was doing", err)
		}
	}
	_, migErr := pgread.Migrate(ctx, pool, opts)
	var mf *pgfeed.MigrationFailedError
	if !errors.Is(migErr, pgfeed.ErrMigrationFailed) || !errors.As(migErr, &mf) || mf.Package != "pgread" || errors.Is(migErr, feed.ErrWriteFailed) {
		t.Fatalf("Migrate on a closed port = %v; want pgfeed's MigrationFailedError naming pgread", migErr)
	}
	for _, err := range []error{storeErr, logErr, migErr} {
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("the error echoes the password: %v", err)
		}
	}
}

// TestConstructorsCheckThroughPgBouncer: the constructors' check works
// through a transaction pooler, in both exec modes one allows.
func TestConstructorsCheckThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := os.Getenv("KAIROS_TEST_PGBOUNCER_URL")
	if url == "" {
		pgtest.Unavailable(t, "PgBouncer", errors.New("KAIROS_TEST_PGBOUNCER_URL is not set"))
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t, url, mode)
			schema := pgtest.Schema(t)
			ctx := ctxFor(t, 30*time.Second)
			opts := pgread.Options{Schema: schema}
			_, err := pgread.NewStore(ctx, pool, opts)
			wantNotMigrated(t, "NewStore through PgBouncer", err, schema)
			_, err = pgread.Migrate(ctx, pool, opts)
			mustf(t, err, "Migrate through PgBouncer")
			_, err = pgread.NewEventLog(ctx, pool, opts)
			mustf(t, err, "NewEventLog through PgBouncer once migrated")
		})
	}
}
