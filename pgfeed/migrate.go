package pgfeed

import (
	"context"
	"embed"
	"text/template"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned step of the schema: its package ("pgfeed"), its
// version and name, and its SQL as one self-contained script that also
// creates (or upgrades) the version table and records the step there.
type Migration = pgschema.Migration

// ErrNotMigrated: New found the schema without the tables this build needs
// (pgread's constructors return the same). Run Migrate (or kairos migrate).
// A schema at a higher version than the build is accepted; see the package
// doc.
var ErrNotMigrated = pgschema.ErrNotMigrated

// ErrMigrationFailed: Migrate (pgfeed's or pgread's) could not bring the
// schema up to date; its transaction rolled back, leaving the schema as it
// was. It is not feed.ErrWriteFailed: a migration runs once, by an operator
// or at startup, and is not retried like a feed write.
var ErrMigrationFailed = pgschema.ErrMigrationFailed

// NotMigratedError says whose tables, under which schema and prefix, are
// missing or behind: the version found and the version the build needs. It
// matches ErrNotMigrated.
type NotMigratedError = pgschema.NotMigratedError

// MigrationFailedError says which package's migration of which schema and
// prefix failed, at which step if it got that far, and wraps the cause. It
// matches ErrMigrationFailed and never carries a connection string.
type MigrationFailedError = pgschema.MigrationFailedError

// lockKey is the one home of this package's advisory lock keys: a 64-bit
// hash of what the lock guards. Lease locks and removeSink's transaction
// lock derive their key here, so two processes that agree on schema,
// prefix, feed and sink agree on the key. (Migrators take pgschema's
// schema-wide lock instead, shared with pgread's.)
func lockKey(parts ...string) int64 { return pgschema.LockKey("kairos/feed", parts...) }

// migrations is this package's set under n's schema and prefix.
func (n names) migrations() pgschema.Migrations {
	return pgschema.Migrations{
		Package: "pgfeed", Files: migrationFiles, Dir: "migrations",
		Schema: n.schema, Prefix: n.prefix,
		Funcs: template.FuncMap{"concurrentUpsert": n.concurrentUpsert, "unsealedUpsert": n.unsealedUpsert, "lockedUpsert": n.lockedUpsert, "lockedUpsertV1": n.lockedUpsertV1, "storeOf": n.storeOf, "modeSeen": n.modeSeen, "snapshotTx": func() string { return snapshotTx }},
	}
}

// Migrations returns the schema's migrations for opts' schema and table
// prefix (the other options play no part), in version order, for teams that
// apply SQL with their own migration tool. Each is one script that records
// itself in the version table New checks, and is idempotent. Migrate
// applies the same steps.
func Migrations(opts Options) ([]Migration, error) {
	n, err := resolveNames(opts.Schema, opts.TablePrefix)
	if err != nil {
		return nil, err
	}
	return n.migrations().List()
}

// MigrationSQL is the whole schema as one idempotent script (schema, version
// table, every migration and its version row), for review or for a
// migration tool of the team's own.
func MigrationSQL(opts Options) (string, error) {
	n, err := resolveNames(opts.Schema, opts.TablePrefix)
	if err != nil {
		return "", err
	}
	return n.migrations().Script()
}

// Migrate brings the schema for opts' schema and table prefix (the store's
// own options; the others play no part) up to date, in one transaction, and
// returns the versions it applied. Processes that migrate at once, of this
// package or of pgread, serialise on a schema-wide advisory transaction lock,
// and the later ones find nothing left to do. It works through a transaction
// pooler. A failure is a *MigrationFailedError.
func Migrate(ctx context.Context, db DBTX, opts Options) ([]int, error) {
	if db == nil {
		return nil, feed.Invalid("db", "must not be nil")
	}
	n, err := resolveNames(opts.Schema, opts.TablePrefix)
	if err != nil {
		return nil, err
	}
	return n.migrations().Apply(ctx, db)
}
