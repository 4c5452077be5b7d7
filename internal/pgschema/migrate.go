package pgschema

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
)

// Migration is one versioned step of a package's tables.
type Migration struct {
	// Package owns the step: "pgfeed" or "pgread".
	Package string
	// Version numbers the step within its package, from 1.
	Version int
	// Name is the file's name without ".sql" ("0001_feed").
	Name string
	// SQL is the step as one script, every name filled in, to run as a whole
	// (it has several statements and a DO block; pgx's simple protocol or
	// psql run it as it is): it creates the schema and the version table, or
	// upgrades an old version table (see Migrations), runs the step, and
	// records it in the version table, each part idempotent. Recording it is
	// what lets the packages' constructors see that it ran.
	SQL string
}

// Migrations is one package's migrations under one schema and table prefix:
// embedded SQL templates named NNNN_name.sql, whose {{table "x"}} and
// {{index "x"}} are replaced by the quoted names. pgfeed and pgread each keep
// their own set and migrate it the same way, here.
//
// # Versions
//
// The applied steps are recorded in the table <prefix>migrations, one row
// per (package, version). pgfeed and pgread may share one schema and one
// prefix: their tables have different names, and the package column keeps
// their versions apart in the one version table they then share. The version
// a build needs is the highest it embeds.
//
// Builds before the package column kept (version, name, applied_at) with
// the version alone as the key, so on a shared prefix the second package
// found the first one's version 1 and skipped its own. Every migrator, and
// every script List and Script print, upgrades such a table in place: each
// row goes to the package whose migration it names (legacyOwners), under an
// exclusive lock on the table taken only while the column is missing and
// checked again once held, so two migrators upgrade it once. A package whose
// step the old key made it skip then finds it missing, and applies it.
//
// # A schema newer than the build
//
// A schema that records a higher version than a build needs is accepted, by
// the constructors' check and by Apply, which finds nothing to do. In a
// rolling deploy the processes still on the old build run beside the schema
// the first new one migrated, and refusing them would turn every deploy that
// migrates into an outage. That is safe because migrations are additive, the
// rule every new step must keep: it may add tables, indexes and columns that
// are nullable or have a default, and must not drop, rename or retype what an
// earlier build reads or writes, nor add a constraint its writes could break
// (the statements name their columns, never SELECT *, so an added column
// changes nothing for them). A change that cannot be additive takes two
// releases: the first stops using what the second removes.
type Migrations struct {
	// Package names the owner, in the version table and in errors ("pgfeed").
	Package string
	// Files holds the templates in Dir.
	Files fs.FS
	Dir   string
	// Schema and Prefix are validated identifiers.
	Schema, Prefix string
	// Funcs are the package's own template functions beside table and
	// index, for SQL a migration shares with the package's Go statements,
	// so the two keep one text.
	Funcs template.FuncMap
}

// legacyOwners are the only migrations a version table of the old shape can
// hold: the old shape was written only by builds whose steps were these, so
// the list never grows. A row that names anything else stops the upgrade,
// which changes nothing then.
var legacyOwners = []struct{ name, pkg string }{
	{"0001_feed", "pgfeed"},
	{"0001_read", "pgread"},
}

// Table is the quoted, schema-qualified name of the package's table t.
func (m Migrations) Table(t string) string { return Names{Schema: m.Schema, Prefix: m.Prefix}.Table(t) }

// versions is the table recording which versions are applied.
func (m Migrations) versions() string { return m.Table("migrations") }

// steps renders each migration's own SQL (without the version table's
// bootstrap and record), in version order.
func (m Migrations) steps() ([]Migration, error) {
	entries, err := fs.ReadDir(m.Files, m.Dir)
	if err != nil {
		return nil, err
	}
	funcs := template.FuncMap{
		"table": m.Table,
		"index": func(index string) string { return Quote(m.Prefix + index) },
	}
	for name, fn := range m.Funcs {
		funcs[name] = fn
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		version, err := strconv.Atoi(num)
		// The name is written into the version table as a literal by the
		// printed scripts, so it keeps to the identifier rule.
		if !ok || err != nil || version < 1 || !strings.HasSuffix(name, ".sql") || ValidIdent("name", rest, MaxIdentLen) != nil {
			return nil, fmt.Errorf("%s: migration file %q is not named NNNN_name.sql", m.Package, name)
		}
		if slices.ContainsFunc(out, func(o Migration) bool { return o.Version == version }) {
			return nil, fmt.Errorf("%s: two migration files have version %d", m.Package, version)
		}
		text, err := fs.ReadFile(m.Files, path.Join(m.Dir, name))
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(name).Funcs(funcs).Parse(string(text))
		if err != nil {
			return nil, fmt.Errorf("%s: migration %s: %w", m.Package, name, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, nil); err != nil {
			return nil, fmt.Errorf("%s: migration %s: %w", m.Package, name, err)
		}
		out = append(out, Migration{Package: m.Package, Version: version, Name: strings.TrimSuffix(name, ".sql"), SQL: b.String()})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no migration files", m.Package)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

// List returns every migration, in version order, each as a script of its
// own (see Migration.SQL), for a team's own migration tool.
func (m Migrations) List() ([]Migration, error) {
	list, err := m.steps()
	if err != nil {
		return nil, err
	}
	for i, s := range list {
		list[i].SQL = m.bootstrap() + "\n" + s.SQL + "\n" + m.record(s)
	}
	return list, nil
}

// Need is the version this build needs: the highest it embeds.
func (m Migrations) Need() (int, error) {
	list, err := m.steps()
	if err != nil {
		return 0, err
	}
	return list[len(list)-1].Version, nil
}

// bootstrap creates the schema and the version table, or upgrades a version
// table of the old shape (see Migrations).
func (m Migrations) bootstrap() string {
	var owners strings.Builder
	for _, o := range legacyOwners {
		fmt.Fprintf(&owners, " WHEN '%s' THEN '%s'", o.name, o.pkg)
	}
	return fmt.Sprintf(`-- Migrators of this schema, of every Kairos package, serialise on this
-- lock to the end of the transaction: run the script as one (a single
-- simple-protocol Exec, or psql --single-transaction).
SELECT pg_advisory_xact_lock(%[4]d);
CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[2]s (
    package    text NOT NULL,
    version    integer NOT NULL CHECK (version >= 1),
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (package, version)
);
-- A version table without the package column is upgraded in place, once,
-- even by scripts run statement by statement: the table's lock is taken only
-- while the column is missing, and the column looked for again once held.
DO $upgrade$
DECLARE
    pk    name;
    stray text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_attribute WHERE attrelid = '%[2]s'::regclass AND attname = 'package' AND NOT attisdropped) THEN
        RETURN;
    END IF;
    LOCK TABLE %[2]s IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT FROM pg_catalog.pg_attribute WHERE attrelid = '%[2]s'::regclass AND attname = 'package' AND NOT attisdropped) THEN
        RETURN;
    END IF;
    ALTER TABLE %[2]s ADD COLUMN package text;
    UPDATE %[2]s SET package = CASE name%[3]s END;
    SELECT string_agg(format('%%s %%s', version, name), ', ' ORDER BY version) INTO stray FROM %[2]s WHERE package IS NULL;
    IF stray IS NOT NULL THEN
        RAISE EXCEPTION 'version table %%: rows name migrations of no Kairos package (%%); nothing was changed', '%[2]s', stray;
    END IF;
    SELECT conname INTO pk FROM pg_catalog.pg_constraint WHERE conrelid = '%[2]s'::regclass AND contype = 'p';
    IF pk IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %%s DROP CONSTRAINT %%I', '%[2]s', pk);
    END IF;
    ALTER TABLE %[2]s ALTER COLUMN package SET NOT NULL, ADD PRIMARY KEY (package, version);
END
$upgrade$;
`, Quote(m.Schema), m.versions(), owners.String(), schemaLockKey(m.Schema))
}

// record is the statement a printed script records step s with.
func (m Migrations) record(s Migration) string {
	return fmt.Sprintf("INSERT INTO %s (package, version, name) VALUES ('%s', %d, '%s') ON CONFLICT (package, version) DO NOTHING;\n",
		m.versions(), m.Package, s.Version, s.Name)
}

// Script is the whole schema as one idempotent script (schema, version table,
// every migration and its version row), for review or a team's own tool.
func (m Migrations) Script() (string, error) {
	list, err := m.steps()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(m.bootstrap())
	for _, s := range list {
		fmt.Fprintf(&b, "\n-- %s %s\n%s\n%s", s.Package, s.Name, s.SQL, m.record(s))
	}
	return b.String(), nil
}

// Beginner is what Apply runs its transaction on.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Apply brings the tables up to date in one transaction and returns the
// versions it applied. It takes the schema-wide lock (LockSchema) first, so
// migrators that run at once, of this package or another, serialise, and
// the later ones find nothing left to do. Every statement is an ordinary
// one, so it works through a transaction pooler. Any failure is a
// *MigrationFailedError, and leaves the schema as it was.
func (m Migrations) Apply(ctx context.Context, db Beginner) ([]int, error) {
	list, err := m.steps()
	if err != nil {
		return nil, m.failed(Migration{}, err)
	}
	var applied []int
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		applied = nil
		if err := LockSchema(ctx, tx, m.Schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, m.bootstrap(), pgx.QueryExecModeSimpleProtocol); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT version FROM `+m.versions()+` WHERE package = $1::text`, m.Package)
		if err != nil {
			return err
		}
		done, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		for _, s := range list {
			if slices.Contains(done, int32(s.Version)) {
				continue
			}
			if _, err := tx.Exec(ctx, s.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
				return m.failed(s, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+m.versions()+` (package, version, name) VALUES ($1::text, $2::integer, $3::text)`,
				m.Package, int32(s.Version), s.Name); err != nil {
				return m.failed(s, err)
			}
			applied = append(applied, s.Version)
		}
		return nil
	})
	if err != nil {
		var mf *MigrationFailedError
		if errors.As(err, &mf) {
			return nil, mf
		}
		return nil, m.failed(Migration{}, err)
	}
	return applied, nil
}

func (m Migrations) failed(s Migration, err error) error {
	return &MigrationFailedError{Package: m.Package, Schema: m.Schema, Prefix: m.Prefix, Version: s.Version, Name: s.Name, Err: err}
}

// Querier is what Check runs its statements on.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Check is the constructors' startup check: nil when the schema records at
// least the version this build needs (a newer one is accepted; see
// Migrations), a *NotMigratedError when it records less, and an
// *feed.UnreadableError when the database cannot say (unreachable, or a
// permission missing). It writes nothing, and costs two short statements.
// It looks the version table up in the catalog before reading it, so a
// missing table raises no error, and a transaction db may be stays usable.
func (m Migrations) Check(ctx context.Context, db Querier) error {
	need, err := m.Need()
	if err != nil {
		return err
	}
	op := fmt.Sprintf("checking that schema %q is migrated for %s", m.Schema, m.Package)
	var exists, shaped bool
	probe := `SELECT r.c IS NOT NULL, EXISTS (SELECT FROM pg_catalog.pg_attribute a
WHERE a.attrelid = r.c AND a.attname = 'package' AND NOT a.attisdropped)
FROM (SELECT to_regclass($1::text) AS c) AS r`
	if err := db.QueryRow(ctx, probe, m.versions()).Scan(&exists, &shaped); err != nil {
		return feed.Unreadable(op, err)
	}
	found := 0
	if shaped {
		var v int32
		if err := db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+m.versions()+` WHERE package = $1::text`, m.Package).Scan(&v); err != nil {
			return feed.Unreadable(op, err)
		}
		found = int(v)
	}
	if found < need {
		return &NotMigratedError{Package: m.Package, Schema: m.Schema, Prefix: m.Prefix, Found: found, Need: need, Legacy: exists && !shaped}
	}
	return nil
}
