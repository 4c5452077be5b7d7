package pgread

import (
	"context"
	"embed"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned step of the schema; see pgfeed.Migration.
type Migration = pgschema.Migration

// migrations is this package's set under n's schema and prefix.
func (n names) migrations() pgschema.Migrations {
	return pgschema.Migrations{
		Package: "pgread", Files: migrationFiles, Dir: "migrations",
		Schema: n.schema, Prefix: n.prefix,
	}
}

// Migrations returns the schema's migrations for opts' schema and prefix, in
// version order, for teams that apply SQL with their own migration tool.
// Each is one script that records itself in the version table the
// constructors check, and is idempotent. Migrate applies the same steps.
func Migrations(opts Options) ([]Migration, error) {
	n, err := resolveNames(opts)
	if err != nil {
		return nil, err
	}
	return n.migrations().List()
}

// MigrationSQL is the whole schema as one idempotent script (schema, version
// table, every migration and its version row), for review or for a
// migration tool of the team's own.
func MigrationSQL(opts Options) (string, error) {
	n, err := resolveNames(opts)
	if err != nil {
		return "", err
	}
	return n.migrations().Script()
}

// Migrate brings the tables for opts' schema and prefix up to date, in one
// transaction, and returns the versions it applied. Processes that migrate at
// once, of this package or of pgfeed on the same schema, serialise on a
// schema-wide advisory transaction lock, and the later ones find nothing
// left to do. It works through a transaction pooler. A failure is a
// *pgfeed.MigrationFailedError (matching pgfeed.ErrMigrationFailed).
func Migrate(ctx context.Context, db DBTX, opts Options) ([]int, error) {
	if db == nil {
		return nil, feed.Invalid("db", "must not be nil")
	}
	n, err := resolveNames(opts)
	if err != nil {
		return nil, err
	}
	return n.migrations().Apply(ctx, db)
}

// newNames is the constructors' shared start: db and opts are validated,
// then db is checked to answer and to hold the tables this build needs
// (pgschema.Migrations.Check; its errors are pgfeed's).
func newNames(ctx context.Context, db DBTX, opts Options) (names, error) {
	if db == nil {
		return names{}, feed.Invalid("db", "must not be nil")
	}
	n, err := resolveNames(opts)
	if err != nil {
		return names{}, err
	}
	if err := n.migrations().Check(ctx, db); err != nil {
		return names{}, err
	}
	return n, nil
}
