package pgfeed_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// need is the version this build needs: the highest it embeds.
func need(t *testing.T) int {
	t.Helper()
	list, err := pgfeed.Migrations(pgfeed.Options{})
	if err != nil || len(list) == 0 {
		t.Fatalf("Migrations = %v, %v", list, err)
	}
	return list[len(list)-1].Version
}

// wantNotMigrated fails unless err is a NotMigratedError for schema and
// prefix, found 0.
func wantNotMigrated(t *testing.T, what string, err error, schema, prefix string) {
	t.Helper()
	var nm *pgfeed.NotMigratedError
	if !errors.Is(err, pgfeed.ErrNotMigrated) || !errors.As(err, &nm) ||
		nm.Package != "pgfeed" || nm.Schema != schema || nm.Prefix != prefix || nm.Found != 0 || nm.Need != need(t) {
		t.Fatalf("%s = %v; want a NotMigratedError for %s, prefix %s, found 0", what, err, schema, prefix)
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestNewRefusesUnmigratedSchema: New on a schema Migrate never ran on, or
// ran on under another prefix, fails at once with a NotMigratedError that
// says what to run, instead of a store whose first write meets a missing
// table.
func TestNewRefusesUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := ctxFor(t, 30*time.Second)
	schema := pgtest.Schema(t)
	_, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema})
	wantNotMigrated(t, "New on a schema that does not exist", err, schema, "feed_")
	want := fmt.Sprintf(`schema %q is not migrated (found 0, need %d)`, schema, need(t))
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "run pgfeed.Migrate or kairos migrate") {
		t.Fatalf("message %q; want it to say %q and what to run", err, want)
	}
	if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema, TablePrefix: "a_"}); err != nil {
		t.Fatal(err)
	}
	_, err = pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema, TablePrefix: "b_"})
	wantNotMigrated(t, "New under a prefix that was not migrated", err, schema, "b_")
	s, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema, TablePrefix: "a_", Logger: quiet})
	if err != nil {
		t.Fatalf("New on the migrated prefix: %v", err)
	}
	s.Close()
}

// TestNewUnreachable: a database that does not answer fails New with an
// UnreadableError saying what New was doing, and Migrate with a
// MigrationFailedError, not a feed write failure; neither repeats the
// password or the URL.
func TestNewUnreachable(t *testing.T) {
	t.Parallel()
	url := "postgres://kairos:hunter2-very-secret@" + pgtest.ClosedPort(t) + "/app?connect_timeout=2"
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := ctxFor(t, 10*time.Second)
	_, newErr := pgfeed.New(ctx, pool, pgfeed.Options{Schema: "app"})
	var unr *feed.UnreadableError
	if !errors.As(newErr, &unr) || !strings.Contains(unr.Op, `checking that schema "app" is migrated`) {
		t.Fatalf("New on a closed port = %v; want an UnreadableError saying what it was doing", newErr)
	}
	_, migErr := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: "app"})
	var mf *pgfeed.MigrationFailedError
	if !errors.Is(migErr, pgfeed.ErrMigrationFailed) || !errors.As(migErr, &mf) || mf.Package != "pgfeed" || errors.Is(migErr, feed.ErrWriteFailed) {
		t.Fatalf("Migrate on a closed port = %v; want a MigrationFailedError, and no feed write failure", migErr)
	}
	for _, err := range []error{newErr, migErr} {
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), url) {
			t.Fatalf("the error echoes the password: %v", err)
		}
	}
}

// TestMigrateStepFailure: a step that fails (here a table of the same name
// but another shape stands in the way of an index) is a MigrationFailedError
// naming the step, and rolls back everything Migrate did.
func TestMigrateStepFailure(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+schema+`"; CREATE TABLE "`+schema+`"."feed_parked" (feed text)`, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	_, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema})
	var mf *pgfeed.MigrationFailedError
	if !errors.As(err, &mf) || mf.Version != 1 || mf.Name != "0001_feed" || mf.Schema != schema || errors.Is(err, feed.ErrWriteFailed) {
		t.Fatalf("Migrate over a conflicting table = %v; want a MigrationFailedError naming 0001_feed", err)
	}
	if got := tables(t, pool, schema); len(got) != 1 || got[0] != "feed_parked" {
		t.Fatalf("after the failed migration the schema holds %v; want only the table that was there", got)
	}
}

// TestNewCheckThroughPgBouncer: the startup check is two short statements
// with no session state, so it works through a transaction pooler, in both
// exec modes one allows.
func TestNewCheckThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := pgbouncerURL(t)
	for _, m := range modes[1:] {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t, url, m.mode)
			schema := pgtest.Schema(t)
			ctx := ctxFor(t, 30*time.Second)
			_, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema, Listen: directListen})
			wantNotMigrated(t, "New through PgBouncer on an unmigrated schema", err, schema, "feed_")
			if _, err := pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}); err != nil {
				t.Fatal(err)
			}
			s, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: schema, Listen: directListen, Logger: quiet})
			if err != nil {
				t.Fatalf("New through PgBouncer on a migrated schema: %v", err)
			}
			defer s.Close()
			if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNewOnConnAndTx: New works with a *pgx.Conn and with a pgx.Tx as its
// DBTX. The check raises no error when it finds nothing, so the caller's
// transaction stays usable after a NotMigratedError; and a schema migrated
// inside the transaction is seen by New in it.
func TestNewOnConnAndTx(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := ctxFor(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	s, err := pgfeed.New(ctx, conn, pgfeed.Options{Schema: d.schema, Logger: quiet})
	if err != nil {
		t.Fatalf("New on a *pgx.Conn: %v", err)
	}
	if _, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil {
		t.Fatalf("a write through the *pgx.Conn store: %v", err)
	}
	s.Close()

	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	fresh := pgtest.Schema(t)
	_, err = pgfeed.New(ctx, tx, pgfeed.Options{Schema: fresh})
	wantNotMigrated(t, "New on a pgx.Tx, schema not migrated", err, fresh, "feed_")
	if _, err := pgfeed.Migrate(ctx, tx, pgfeed.Options{Schema: fresh}); err != nil {
		t.Fatalf("the transaction after New's check failed: %v", err)
	}
	s, err = pgfeed.New(ctx, tx, pgfeed.Options{Schema: fresh, Logger: quiet})
	if err != nil {
		t.Fatalf("New on a pgx.Tx that migrated: %v", err)
	}
	defer s.Close()
	if res, err := s.WriteCommitted(ctx, "f", []feed.Change{feed.Put("k", []byte(`{}`))}); err != nil || res.Last != 1 {
		t.Fatalf("a write through the pgx.Tx store = %+v, %v", res, err)
	}
}
