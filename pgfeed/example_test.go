package pgfeed_test

import (
	"fmt"
	"strings"

	"github.com/kairos-es/kairos/pgfeed"
)

// Teams that run their own migration tool take the SQL from Migrations (one
// step per version) or MigrationSQL (the whole script), with their schema and
// prefix filled in and quoted.
func ExampleMigrations() {
	steps, err := pgfeed.Migrations(pgfeed.Options{Schema: "app", TablePrefix: "outbox_"})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Each step is a script of its own that also creates the version table
	// (and records itself there, so that New sees it ran).
	for _, m := range steps {
		var tables []string
		for _, part := range strings.Split(m.SQL, "CREATE TABLE IF NOT EXISTS ")[1:] {
			name, _, _ := strings.Cut(part, " ")
			tables = append(tables, name)
		}
		fmt.Println(m.Package, m.Version, m.Name, "-", strings.Join(tables, " "))
	}
	_, err = pgfeed.Migrations(pgfeed.Options{Schema: "App"})
	fmt.Println(err)
	// Output:
	// pgfeed 1 0001_feed - "app"."outbox_migrations" "app"."outbox_generations" "app"."outbox_rows" "app"."outbox_cursors" "app"."outbox_parked"
	// pgfeed 2 0002_concurrent - "app"."outbox_migrations" "app"."outbox_sealers"
	// pgfeed 3 0003_capture - "app"."outbox_migrations" "app"."outbox_captures" "app"."outbox_backfills"
	// pgfeed 4 0004_tombstone_age - "app"."outbox_migrations"
	// pgfeed 5 0005_unsealed - "app"."outbox_migrations" "app"."outbox_unsealed"
	// pgfeed 6 0006_write_result - "app"."outbox_migrations"
	// pgfeed 7 0007_changes - "app"."outbox_migrations" "app"."outbox_changes"
	// pgfeed 8 0008_switches - "app"."outbox_migrations" "app"."outbox_switches"
	// pgfeed 9 0009_record - "app"."outbox_migrations"
	// pgfeed 10 0010_stores - "app"."outbox_migrations" "app"."outbox_stores"
	// pgfeed 11 0011_reserved - "app"."outbox_migrations" "app"."outbox_reserved" "app"."outbox_backfill_shares"
	// pgfeed 12 0012_changes_check - "app"."outbox_migrations"
	// pgfeed 13 0013_pinned_path - "app"."outbox_migrations"
	// invalid input: schema: has 'A' at offset 0; it must match ^[a-z_][a-z0-9_]*$
}
