package pgread

import (
	"github.com/kairos-es/kairos/internal/pgschema"

	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned step of the schema, as SQL with every name
// already filled in.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// migrateLockKey is the advisory lock migrators of one schema and prefix
// serialise on: a 64-bit hash of what it guards, in a namespace of its own so
// it never meets pgfeed's keys.
func migrateLockKey(n names) int64 {
	sum := sha256.Sum256([]byte("kairos/read\x00migrate\x00" + n.schema + "\x00" + n.prefix))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// Migrations returns the schema's migrations for opts' schema and prefix, in
// version order, for teams that apply SQL with their own migration tool. Each
// step is idempotent. Migrate applies the same SQL.
func Migrations(opts Options) ([]Migration, error) {
	n, err := resolveNames(opts)
	if err != nil {
		return nil, err
	}
	return n.migrationList()
}

func (n names) migrationList() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	funcs := template.FuncMap{
		"table": func(table string) string { return n.quotedSchema + "." + quoteIdent(n.prefix+table) },
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version < 1 {
			return nil, fmt.Errorf("pgread: migration file %q is not named NNNN_name.sql", name)
		}
		text, err := migrationFiles.ReadFile("migrations/" + name)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(name).Funcs(funcs).Parse(string(text))
		if err != nil {
			return nil, fmt.Errorf("pgread: migration %s: %w", name, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, nil); err != nil {
			return nil, fmt.Errorf("pgread: migration %s: %w", name, err)
		}
		out = append(out, Migration{Version: version, Name: strings.TrimSuffix(name, ".sql"), SQL: b.String()})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

// MigrationSQL is the whole schema as one script (schema, version table and
// every migration), for review or for a migration tool of the team's own.
func MigrationSQL(opts Options) (string, error) {
	n, err := resolveNames(opts)
	if err != nil {
		return "", err
	}
	list, err := n.migrationList()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(n.bootstrapSQL())
	for _, m := range list {
		fmt.Fprintf(&b, "\n-- %04d %s\n%s\nINSERT INTO %s (version, name) VALUES (%d, '%s') ON CONFLICT (version) DO NOTHING;\n",
			m.Version, m.Name, m.SQL, n.migrations, m.Version, m.Name)
	}
	return b.String(), nil
}

func (n names) bootstrapSQL() string {
	return fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %s;
CREATE TABLE IF NOT EXISTS %s (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
`, n.quotedSchema, n.migrations)
}

// Migrate brings the tables for opts' schema and prefix up to date, in one
// transaction, and returns the versions it applied. Two processes may migrate
// at once: a transaction-scoped advisory lock makes the second wait for the
// first and then find nothing left to do, and pgschema's schema-wide lock
// serialises it with pgfeed's migrator on the same schema. It works through a
// transaction pooler.
func Migrate(ctx context.Context, db DBTX, opts Options) ([]int, error) {
	if db == nil {
		return nil, feed.Invalid("db", "must not be nil")
	}
	n, err := resolveNames(opts)
	if err != nil {
		return nil, err
	}
	list, err := n.migrationList()
	if err != nil {
		return nil, err
	}
	applied, err := n.migrate(ctx, db, list)
	if err != nil {
		return nil, feed.WriteFailed("migrating schema "+n.schema, err)
	}
	return applied, nil
}

func (n names) migrate(ctx context.Context, db DBTX, list []Migration) ([]int, error) {
	var applied []int
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := pgschema.LockSchema(ctx, tx, n.schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, migrateLockKey(n)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, n.bootstrapSQL(), pgx.QueryExecModeSimpleProtocol); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT version FROM `+n.migrations)
		if err != nil {
			return err
		}
		done, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		for _, m := range list {
			if slices.Contains(done, int32(m.Version)) {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("migration %04d %s: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+n.migrations+` (version, name) VALUES ($1::integer, $2::text)`, int32(m.Version), m.Name); err != nil {
				return err
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}
