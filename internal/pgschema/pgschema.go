// Package pgschema is what every Kairos package that owns PostgreSQL tables
// (pgfeed, pgread) shares about them: the identifier rule for schemas and
// table prefixes, quoting, and the schema-wide lock their migrators take.
package pgschema

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
)

// MaxIdentLen is PostgreSQL's identifier limit, in bytes.
const MaxIdentLen = 63

// ValidIdent is the one home of the identifier rule: lower-case ASCII letters,
// digits and '_', not starting with a digit, at most max bytes. Quoting would
// make any string safe in SQL, but a name that needs no quoting also reads the
// same in psql, in logs and in a DBA's own scripts; it is quoted anyway.
func ValidIdent(field, s string, max int) error {
	if s == "" {
		return feed.Invalid(field, "must not be empty")
	}
	if len(s) > max {
		return feed.Invalid(field, "is %d bytes long; at most %d fit PostgreSQL's %d-byte identifier limit", len(s), max, MaxIdentLen)
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

// Quote quotes an identifier that passed ValidIdent.
func Quote(s string) string { return `"` + s + `"` }

// LockKey hashes parts, under a namespace naming the package, into a 64-bit
// advisory lock key, so that processes that agree on what a lock guards agree
// on its key.
func LockKey(namespace string, parts ...string) int64 {
	b, _ := json.Marshal(append([]string{namespace}, parts...)) // []string always marshals
	sum := sha256.Sum256(b)
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// LockSchema takes, for tx's length, the lock every Kairos migrator of schema
// takes first. Without it, two packages migrating one new schema at once race
// on CREATE SCHEMA IF NOT EXISTS (and CREATE TABLE IF NOT EXISTS), which is
// not safe under concurrency in PostgreSQL (the loser fails with a unique
// violation on pg_namespace), and on the version table they may share.
func LockSchema(ctx context.Context, tx pgx.Tx, schema string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, schemaLockKey(schema))
	return err
}

// schemaLockKey is LockSchema's key, which the printed scripts take too.
func schemaLockKey(schema string) int64 { return LockKey("kairos/schema", schema) }

// Names are a package's validated schema and table prefix.
type Names struct {
	Schema, Prefix string
}

// ResolveNames applies the defaults to an empty schema or prefix and validates
// both: both follow ValidIdent, the schema must not start with "pg_" (a name
// PostgreSQL keeps for itself; a table prefix may), and the prefix must leave
// room for the package's longest table name within PostgreSQL's identifier
// limit. Errors name "schema" or "table_prefix".
func ResolveNames(schema, prefix, defaultSchema, defaultPrefix, longestTable string) (Names, error) {
	if schema == "" {
		schema = defaultSchema
	}
	if prefix == "" {
		prefix = defaultPrefix
	}
	if err := ValidIdent("schema", schema, MaxIdentLen); err != nil {
		return Names{}, err
	}
	if strings.HasPrefix(schema, "pg_") {
		// PostgreSQL refuses to create such a schema (42939), but only once a
		// migration runs; refusing it here names the field instead.
		return Names{}, feed.Invalid("schema", "starts with \"pg_\", which PostgreSQL reserves for its system schemas")
	}
	if err := ValidIdent("table_prefix", prefix, MaxIdentLen-len(longestTable)); err != nil {
		return Names{}, err
	}
	return Names{Schema: schema, Prefix: prefix}, nil
}

// Table is the quoted, schema-qualified name of table t under these names.
func (n Names) Table(t string) string { return Quote(n.Schema) + "." + Quote(n.Prefix+t) }
