package pgread_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/pgread"
)

// Eight processes' worth of migrators on a fresh schema, with four of
// pgfeed's migrators creating the same schema at the same moment: every one succeeds,
// exactly one applies each version, and a later run applies nothing.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 60*time.Second)
	opts := pgread.Options{Schema: schema}
	var wg sync.WaitGroup
	results := make([][]int, 8)
	errs := make([]error, 8)
	start := make(chan struct{})
	for i := range results {
		wg.Go(func() { <-start; results[i], errs[i] = pgread.Migrate(ctx, pool, opts) })
	}
	feedErrs := make([]error, 4)
	for i := range feedErrs {
		wg.Go(func() { <-start; _, feedErrs[i] = pgfeed.Migrate(ctx, pool, pgfeed.Options{Schema: schema}) })
	}
	close(start)
	wg.Wait()
	list, err := pgread.Migrations(opts)
	mustf(t, err, "Migrations")
	var all []int
	for _, m := range list {
		all = append(all, m.Version)
	}
	applied := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
		switch {
		case slices.Equal(results[i], all):
			applied++
		case len(results[i]) != 0:
			t.Fatalf("migrator %d applied %v", i, results[i])
		}
	}
	if applied != 1 {
		t.Fatalf("%d migrators applied the versions %v, want exactly 1", applied, all)
	}
	// pgschema's schema-wide lock serialises the two packages' migrators; without
	// it, CREATE SCHEMA IF NOT EXISTS races and one of them fails.
	for i, err := range feedErrs {
		if err != nil {
			t.Fatalf("pgfeed migrator %d: %v", i, err)
		}
	}
	again, err := pgread.Migrate(ctx, pool, opts)
	if err != nil || len(again) != 0 {
		t.Fatalf("a second Migrate = %v, %v; want nothing to do", again, err)
	}
	// Every table is logged, so a checkpoint survives a server crash as its
	// view does.
	var unlogged int
	mustf(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relpersistence <> 'p'`, schema).Scan(&unlogged), "pg_class")
	if unlogged != 0 {
		t.Fatalf("%d unlogged tables", unlogged)
	}
}

// The printed script is what Migrate applies, runs twice without error (each
// step is idempotent), and names only the schema and prefix it was given.
func TestMigrationSQL(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeSimpleProtocol)
	schema := pgtest.Schema(t)
	ctx := ctxFor(t, 30*time.Second)
	opts := pgread.Options{Schema: schema, TablePrefix: "rm_"}
	script, err := pgread.MigrationSQL(opts)
	mustf(t, err, "MigrationSQL")
	for _, table := range []string{"checkpoints", "log", "streams", "events", "migrations"} {
		if !strings.Contains(script, `"`+schema+`"."rm_`+table+`"`) {
			t.Fatalf("script does not create %s", table)
		}
	}
	if strings.Contains(script, "kairos") || strings.Contains(script, "read_") {
		t.Fatal("script names the default schema or prefix")
	}
	for range 2 {
		if _, err := pool.Exec(ctx, script); err != nil {
			t.Fatalf("running the script: %v", err)
		}
	}
	// Migrate then finds the version recorded and does nothing.
	applied, err := pgread.Migrate(ctx, pool, opts)
	if err != nil || len(applied) != 0 {
		t.Fatalf("Migrate after the script = %v, %v", applied, err)
	}
	list, err := pgread.Migrations(opts)
	if err != nil || len(list) == 0 || list[0].Version != 1 || !strings.Contains(list[0].SQL, `"rm_checkpoints"`) {
		t.Fatalf("Migrations = %+v, %v", list, err)
	}
	// A store and a log work on the script-made tables.
	s, err := pgread.NewStore(ctx, pool, opts)
	mustf(t, err, "NewStore")
	mustf(t, s.Commit(ctx, keyEU, 0, 1, nil), "commit")
	l, err := pgread.NewEventLog(ctx, pool, opts)
	mustf(t, err, "NewEventLog")
	if _, err := l.AppendCommitted(context.Background(), "s", pgread.NoStream, []pgread.EventData{ev("E", `{}`)}); err != nil {
		t.Fatal(err)
	}
}
