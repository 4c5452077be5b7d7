package pgread_test

import (
	"cmp"
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
	if err != nil || len(list) != 2 || list[0].Version != 1 || !strings.Contains(list[0].SQL, `"rm_checkpoints"`) || !strings.Contains(list[1].SQL, `"rm_checkpoints"`) {
		t.Fatalf("Migrations = %+v, %v", list, err)
	}
	// A store and a log work on the script-made tables.
	s, err := pgread.NewStore(ctx, pool, opts)
	mustf(t, err, "NewStore")
	mustf(t, s.Commit(ctx, keyEU, ckpt(0, 0), 1, nil), "commit")
	l, err := pgread.NewEventLog(ctx, pool, opts)
	mustf(t, err, "NewEventLog")
	if _, err := l.AppendCommitted(context.Background(), "s", pgread.NoStream, []pgread.EventData{ev("E", `{}`)}); err != nil {
		t.Fatal(err)
	}
}

// A schema migrated before checkpoints had epochs keeps its checkpoints:
// migration 2 puts them in epoch 0, where a runner's next commit expects
// them, and lets a reset store the origin. With the longest prefix, the
// check 0001 declared has a name PostgreSQL truncated, which 0002 must find
// all the same.
func TestMigrateKeepsCheckpoints(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"", strings.Repeat("p", 63-len("checkpoints"))} {
		pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
		schema := pgtest.Schema(t)
		ctx := ctxFor(t, 30*time.Second)
		opts := pgread.Options{Schema: schema, TablePrefix: prefix}
		list, err := pgread.Migrations(opts)
		mustf(t, err, "Migrations")
		if len(list) < 2 || list[0].Version != 1 || list[1].Version != 2 {
			t.Fatalf("Migrations = %+v, want versions 1 and 2 first", list)
		}
		// The tables as version 1 made them (its script records it as
		// applied), with a checkpoint committed then.
		_, err = pool.Exec(ctx, `CREATE SCHEMA "`+schema+`"`)
		mustf(t, err, "create schema")
		_, err = pool.Exec(ctx, list[0].SQL)
		mustf(t, err, "version 1")
		table := `"` + schema + `"."` + cmp.Or(prefix, pgread.DefaultTablePrefix) + `checkpoints"`
		_, err = pool.Exec(ctx, `INSERT INTO `+table+` (projection, partition, position) VALUES ('orders', 'eu', 7)`)
		mustf(t, err, "a checkpoint of version 1")

		applied, err := pgread.Migrate(ctx, pool, opts)
		if err != nil || !slices.Equal(applied, []int{2}) {
			t.Fatalf("prefix %q: Migrate = %v, %v; want 2 alone (1 is recorded)", prefix, applied, err)
		}
		s, err := pgread.NewStore(ctx, pool, opts)
		mustf(t, err, "NewStore")
		if at := checkpoint(t, s, keyEU); at != ckpt(7, 0) {
			t.Fatalf("prefix %q: the old checkpoint reads %v, want position 7 of epoch 0", prefix, at)
		}
		mustf(t, s.Commit(ctx, keyEU, ckpt(7, 0), 9, nil), "prefix %q: commit from the old checkpoint", prefix)
		mustf(t, s.ResetCheckpoint(ctx, keyEU), "prefix %q: reset", prefix)
		if at := checkpoint(t, s, keyEU); at != ckpt(0, 1) {
			t.Fatalf("prefix %q: after the reset %v, want the origin of epoch 1", prefix, at)
		}
		mustf(t, s.Commit(ctx, keyEU, ckpt(0, 1), 1, nil), "prefix %q: commit after the reset", prefix)
		// Position is still checked, by one constraint: version 1's is gone.
		var checks int
		mustf(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint con JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = ANY (con.conkey)
WHERE con.conrelid = $1::regclass AND con.contype = 'c' AND a.attname = 'position'`, table).Scan(&checks), "constraints")
		if checks != 1 {
			t.Fatalf("prefix %q: %d checks on position, want 1", prefix, checks)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (projection, partition, position) VALUES ('x', '', -1)`); err == nil {
			t.Fatalf("prefix %q: a negative position was stored", prefix)
		}
	}
}
