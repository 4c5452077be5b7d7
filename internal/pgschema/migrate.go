package pgschema

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

// Migration is one versioned step of a package's tables, as SQL with every
// name already filled in.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations is one package's migrations under one schema and table prefix:
// embedded SQL templates named NNNN_name.sql, whose {{table "x"}} and
// {{index "x"}} are replaced by the quoted names. pgfeed and pgread each keep
// their own set, with their own version table, and migrate them the same way.
type Migrations struct {
	// Package names the owner in errors ("pgfeed").
	Package string
	// Files holds the templates in Dir.
	Files fs.FS
	Dir   string
	// Schema and Prefix are validated identifiers.
	Schema, Prefix string
	// Lock is the advisory key migrators of this package, schema and prefix
	// serialise on.
	Lock int64
}

// Table is the quoted, schema-qualified name of the package's table t.
func (m Migrations) Table(t string) string { return Names{Schema: m.Schema, Prefix: m.Prefix}.Table(t) }

// versions is the table recording which versions are applied.
func (m Migrations) versions() string { return m.Table("migrations") }

// List renders every migration, in version order.
func (m Migrations) List() ([]Migration, error) {
	entries, err := fs.ReadDir(m.Files, m.Dir)
	if err != nil {
		return nil, err
	}
	funcs := template.FuncMap{
		"table": m.Table,
		"index": func(index string) string { return Quote(m.Prefix + index) },
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version < 1 || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("%s: migration file %q is not named NNNN_name.sql", m.Package, name)
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
		out = append(out, Migration{Version: version, Name: strings.TrimSuffix(name, ".sql"), SQL: b.String()})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

// bootstrap creates the schema and the version table.
func (m Migrations) bootstrap() string {
	return fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %s;
CREATE TABLE IF NOT EXISTS %s (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
`, Quote(m.Schema), m.versions())
}

// Script is the whole schema as one idempotent script (schema, version table,
// every migration and its version row), for review or a team's own tool.
func (m Migrations) Script() (string, error) {
	list, err := m.List()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(m.bootstrap())
	for _, s := range list {
		fmt.Fprintf(&b, "\n-- %04d %s\n%s\nINSERT INTO %s (version, name) VALUES (%d, '%s') ON CONFLICT (version) DO NOTHING;\n",
			s.Version, s.Name, s.SQL, m.versions(), s.Version, s.Name)
	}
	return b.String(), nil
}

// Apply brings the tables up to date in one transaction and returns the
// versions it applied. It takes the schema-wide lock (LockSchema), then the
// package's own, so migrators that run at once, of this package or another,
// serialise and the later ones find nothing left to do. Every statement is an
// ordinary one, so it works through a transaction pooler.
func (m Migrations) Apply(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}) ([]int, error) {
	list, err := m.List()
	if err != nil {
		return nil, err
	}
	var applied []int
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		applied = nil
		if err := LockSchema(ctx, tx, m.Schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, m.Lock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, m.bootstrap(), pgx.QueryExecModeSimpleProtocol); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT version FROM `+m.versions())
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
				return fmt.Errorf("migration %04d %s: %w", s.Version, s.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+m.versions()+` (version, name) VALUES ($1::integer, $2::text)`, int32(s.Version), s.Name); err != nil {
				return err
			}
			applied = append(applied, s.Version)
		}
		return nil
	})
	return applied, err
}
