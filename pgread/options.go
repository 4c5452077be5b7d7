package pgread

import (
	"github.com/kairos-es/kairos/internal/pgschema"
	"github.com/kairos-es/kairos/pgfeed"
)

// Defaults of Options.
const (
	// DefaultSchema is the schema the tables live in: the same as pgfeed's,
	// since a checkpoint and the feed it is bound to live in one database.
	DefaultSchema = "kairos"
	// DefaultTablePrefix starts every table's name.
	DefaultTablePrefix = "read_"
	// longestTable is the longest name appended to the prefix.
	longestTable = "checkpoints"
)

// DBTX is what a Store or an EventLog runs its statements on: pgfeed's, since
// the read side and the feed live in one database and are handed one pool.
// Begin opens the transactions of Commit, of a WithFeed reset and of
// AppendCommitted.
type DBTX = pgfeed.DBTX

// Options name the tables of a Store and an EventLog. The zero value is valid
// and means all defaults.
type Options struct {
	// Schema holds the tables. It must match ^[a-z_][a-z0-9_]*$, fit
	// PostgreSQL's 63-byte identifier limit and not start with "pg_" (which
	// PostgreSQL reserves); it is always quoted. Defaults to DefaultSchema.
	Schema string
	// TablePrefix starts every table's name, so several read sides can share
	// a schema. Same rule as Schema, and prefix plus the longest table name
	// ("checkpoints") must fit 63 bytes. It may be pgfeed's prefix too: the
	// table names differ, and the shared version table keeps the packages'
	// versions apart. Defaults to DefaultTablePrefix.
	TablePrefix string
}

// names are the validated, quoted, schema-qualified table names, built once.
type names struct {
	schema, prefix string
	checkpoints    string
	log            string
	streams        string
	events         string
}

func resolveNames(o Options) (names, error) {
	n, err := pgschema.ResolveNames(o.Schema, o.TablePrefix, DefaultSchema, DefaultTablePrefix, longestTable)
	if err != nil {
		return names{}, err
	}
	schema, prefix, t := n.Schema, n.Prefix, n.Table
	return names{
		schema:      schema,
		prefix:      prefix,
		checkpoints: t("checkpoints"),
		log:         t("log"),
		streams:     t("streams"),
		events:      t("events"),
	}, nil
}
