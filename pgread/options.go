package pgread

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kairos-es/kairos/feed"
)

// Defaults of Options.
const (
	// DefaultSchema is the schema the tables live in: the same as pgfeed's,
	// since a checkpoint and the feed it is bound to live in one database.
	DefaultSchema = "kairos"
	// DefaultTablePrefix starts every table's name.
	DefaultTablePrefix = "read_"
	// maxIdentLen is PostgreSQL's identifier limit (NAMEDATALEN − 1), in bytes.
	maxIdentLen = 63
	// longestTable is the longest name appended to the prefix.
	longestTable = "checkpoints"
)

// DBTX is what a Store or an EventLog runs its statements on: a
// *pgxpool.Pool in production, a *pgx.Conn where the caller wants. Begin opens
// the transactions of Commit, of a WithFeed reset and of AppendCommitted.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Options name the tables of a Store and an EventLog. The zero value is valid
// and means all defaults.
type Options struct {
	// Schema holds the tables. It must match ^[a-z_][a-z0-9_]*$ and fit
	// PostgreSQL's 63-byte identifier limit; it is always quoted. Defaults to
	// DefaultSchema.
	Schema string
	// TablePrefix starts every table's name, so several read sides can share
	// a schema. Same rule as Schema, and prefix plus the longest table name
	// ("checkpoints") must fit 63 bytes. Defaults to DefaultTablePrefix.
	TablePrefix string
}

// validIdent is this package's identifier rule, the same as pgfeed's: lower-
// case ASCII letters, digits and '_', not starting with a digit, at most max
// bytes. A name that needs no quoting reads the same in psql and in logs; it
// is quoted anyway.
func validIdent(field, s string, max int) error {
	if s == "" {
		return feed.Invalid(field, "must not be empty")
	}
	if len(s) > max {
		return feed.Invalid(field, "is %d bytes long; at most %d fit PostgreSQL's %d-byte identifier limit", len(s), max, maxIdentLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			if c < 0x20 || c >= 0x7f || c == '"' || c == '\'' || c == '\\' {
				return feed.Invalid(field, "has the byte 0x%02x at offset %d; it must match ^[a-z_][a-z0-9_]*$", c, i)
			}
			return feed.Invalid(field, "has %q at offset %d; it must match ^[a-z_][a-z0-9_]*$", c, i)
		}
	}
	return nil
}

// names are the validated, quoted, schema-qualified table names, built once.
type names struct {
	schema, prefix string
	quotedSchema   string
	checkpoints    string
	log            string
	streams        string
	events         string
	migrations     string
}

func quoteIdent(s string) string { return `"` + s + `"` } // s is a validated identifier

func resolveNames(o Options) (names, error) {
	schema, prefix := o.Schema, o.TablePrefix
	if schema == "" {
		schema = DefaultSchema
	}
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	if err := validIdent("schema", schema, maxIdentLen); err != nil {
		return names{}, err
	}
	if err := validIdent("table_prefix", prefix, maxIdentLen-len(longestTable)); err != nil {
		return names{}, err
	}
	t := func(table string) string { return quoteIdent(schema) + "." + quoteIdent(prefix+table) }
	return names{
		schema:       schema,
		prefix:       prefix,
		quotedSchema: quoteIdent(schema),
		checkpoints:  t("checkpoints"),
		log:          t("log"),
		streams:      t("streams"),
		events:       t("events"),
		migrations:   t("migrations"),
	}, nil
}
