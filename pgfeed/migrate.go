package pgfeed

import (
	"github.com/kairos-es/kairos/internal/pgschema"

	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/json"
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

// lockKey is the one home of this package's advisory lock keys: a 64-bit
// hash of what the lock guards. Migrations, lease locks and removeSink's
// transaction lock all derive their key here, so two processes that agree on
// schema, prefix, feed and sink agree on the key.
func lockKey(parts ...string) int64 {
	b, _ := json.Marshal(append([]string{"kairos/feed"}, parts...)) // []string always marshals
	sum := sha256.Sum256(b)
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// Migrations returns the schema's migrations for schema and prefix (empty
// means the default), in version order, for teams that apply SQL with their own
// migration tool. Each step is idempotent. Migrate applies the same SQL.
func Migrations(schema, prefix string) ([]Migration, error) {
	n, err := resolveNames(schema, prefix)
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
		"index": func(index string) string { return quoteIdent(n.prefix + index) },
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version < 1 {
			return nil, fmt.Errorf("pgfeed: migration file %q is not named NNNN_name.sql", name)
		}
		text, err := migrationFiles.ReadFile("migrations/" + name)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(name).Funcs(funcs).Parse(string(text))
		if err != nil {
			return nil, fmt.Errorf("pgfeed: migration %s: %w", name, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, nil); err != nil {
			return nil, fmt.Errorf("pgfeed: migration %s: %w", name, err)
		}
		out = append(out, Migration{Version: version, Name: strings.TrimSuffix(name, ".sql"), SQL: b.String()})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

// MigrationSQL is the whole schema as one script (schema, version table and
// every migration), for review or for a migration tool of the team's own.
func MigrationSQL(schema, prefix string) (string, error) {
	n, err := resolveNames(schema, prefix)
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

// Migrate brings the schema for opts' schema and prefix up to date, in one
// transaction. Two processes may migrate at once: a transaction-scoped
// advisory lock makes the second wait for the first and then find nothing
// left to do. It works through a transaction pooler. It returns the versions
// it applied.
func Migrate(ctx context.Context, db DBTX, schema, prefix string) ([]int, error) {
	n, err := resolveNames(schema, prefix)
	if err != nil {
		return nil, err
	}
	list, err := n.migrationList()
	if err != nil {
		return nil, err
	}
	var applied []int
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := pgschema.LockSchema(ctx, tx, n.schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, lockKey("migrate", n.schema, n.prefix)); err != nil {
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
		return nil, feed.WriteFailed("migrating schema "+n.schema, err)
	}
	return applied, nil
}
