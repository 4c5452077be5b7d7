package pgschema

import (
	"errors"
	"fmt"
)

// The migration errors are defined once here and re-exported by pgfeed, whose
// names are the public ones (pgfeed.ErrNotMigrated, pgfeed.NotMigratedError,
// ...); pgread returns the same values, so one errors.Is or errors.As matches
// either package's.
var (
	// ErrNotMigrated: a constructor found the schema without the tables this
	// build needs. Nothing was written; run the package's Migrate.
	ErrNotMigrated = errors.New("schema not migrated")
	// ErrMigrationFailed: Migrate could not bring the schema up to date. Its
	// transaction rolled back, so the schema is as it was before the call.
	ErrMigrationFailed = errors.New("migration failed")
)

// NotMigratedError says which package's tables are missing or behind, and by
// how much. It matches ErrNotMigrated.
type NotMigratedError struct {
	// Package is the Go package whose tables these are: "pgfeed" or "pgread".
	Package string
	// Schema and Prefix name the tables checked.
	Schema, Prefix string
	// Found is the highest version of Package recorded in the schema: 0 when
	// none is, the version table missing or of the old shape (Legacy).
	Found int
	// Need is the highest version this build embeds.
	Need int
	// Legacy: the version table has the shape builds before per-package
	// versions wrote. Migrate upgrades it in place.
	Legacy bool
}

func (e *NotMigratedError) Error() string {
	legacy := ""
	if e.Legacy {
		legacy = "; its version table predates per-package versions"
	}
	return fmt.Sprintf("%s: schema %q is not migrated (found %d, need %d) for table prefix %q%s: run %s.Migrate or kairos migrate",
		e.Package, e.Schema, e.Found, e.Need, e.Prefix, legacy, e.Package)
}

// Is reports whether target is ErrNotMigrated.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// MigrationFailedError says which migration failed and why. It matches
// ErrMigrationFailed and wraps the cause (a pgx error, or a context's), which
// never carries a password: pgx leaves it out of its connection errors, and
// nothing here adds the connection string.
type MigrationFailedError struct {
	// Package is the Go package migrating: "pgfeed" or "pgread".
	Package string
	// Schema and Prefix name the tables being migrated.
	Schema, Prefix string
	// Version and Name are the step that failed; 0 and "" when the failure
	// came before or between steps (connecting, locking, creating or upgrading
	// the version table).
	Version int
	Name    string
	Err     error
}

func (e *MigrationFailedError) Error() string {
	step := ""
	if e.Version != 0 {
		step = ", migration " + e.Name
	}
	return fmt.Sprintf("%s: %v: schema %q, table prefix %q%s: %v", e.Package, ErrMigrationFailed, e.Schema, e.Prefix, step, e.Err)
}

// Is reports whether target is ErrMigrationFailed.
func (e *MigrationFailedError) Is(target error) bool { return target == ErrMigrationFailed }

// Unwrap returns the cause.
func (e *MigrationFailedError) Unwrap() error { return e.Err }
