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
	for _, m := range steps {
		first, _, _ := strings.Cut(strings.TrimSpace(m.SQL[strings.Index(m.SQL, "CREATE TABLE"):]), "(")
		fmt.Println(m.Version, m.Name, "-", strings.TrimSpace(first))
	}
	_, err = pgfeed.Migrations(pgfeed.Options{Schema: "App"})
	fmt.Println(err)
	// Output:
	// 1 0001_feed - CREATE TABLE IF NOT EXISTS "app"."outbox_generations"
	// invalid input: schema: has 'A' at offset 0; it must match ^[a-z_][a-z0-9_]*$
}
