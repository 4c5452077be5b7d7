package pgfeed

import (
	"context"
	"embed"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned step of the schema, as SQL with every name
// already filled in.
type Migration = pgschema.Migration

// lockKey is the one home of this package's advisory lock keys: a 64-bit
// hash of what the lock guards. Migrations, lease locks and removeSink's
// transaction lock all derive their key here, so two processes that agree on
// schema, prefix, feed and sink agree on the key.
func lockKey(parts ...string) int64 { return pgschema.LockKey("kairos/feed", parts...) }

// migrations is this package's set under n's schema and prefix.
func (n names) migrations() pgschema.Migrations {
	return pgschema.Migrations{
		Package: "pgfeed", Files: migrationFiles, Dir: "migrations",
		Schema: n.schema, Prefix: n.prefix, Lock: lockKey("migrate", n.schema, n.prefix),
	}
}

// Migrations returns the schema's migrations for opts' schema and table
// prefix (the other options play no part), in version order, for teams that
// apply SQL with their own migration tool. Each step is idempotent. Migrate
// applies the same SQL.
func Migrations(opts Options) ([]Migration, error) {
	n, err := resolveNames(opts.Schema, opts.TablePrefix)
	if err != nil {
		return nil, err
	}
	return n.migrations().List()
}

// MigrationSQL is the whole schema as one script (schema, version table and
// every migration), for review or for a migration tool of the team's own.
func MigrationSQL(opts Options) (string, error) {
	n, err := resolveNames(opts.Schema, opts.TablePrefix)
	if err != nil {
		return "", err
	}
	return n.migrations().Script()
}

// Migrate brings the schema for opts' schema and table prefix (the store's
// own options; the others play no part) up to date, in one transaction, and
// returns the versions it applied. Processes
// that migrate at once serialise on advisory transaction locks (see
// pgschema.Migrations.Apply) and the later ones find nothing left to do. It
// works through a transaction pooler.
func Migrate(ctx context.Context, db DBTX, opts Options) ([]int, error) {
	if db == nil {
		return nil, feed.Invalid("db", "must not be nil")
	}
	n, err := resolveNames(opts.Schema, opts.TablePrefix)
	if err != nil {
		return nil, err
	}
	applied, err := n.migrations().Apply(ctx, db)
	if err != nil {
		return nil, feed.WriteFailed("migrating schema "+n.schema, err)
	}
	return applied, nil
}
