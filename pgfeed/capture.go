package pgfeed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
)

// DefaultCaptureSchema is the schema CaptureSpec.Schema defaults to.
const DefaultCaptureSchema = "public"

// CaptureSpec says which table a capture copies into which feed, and how a
// row becomes a key and a document. Names are the table's and columns' own
// spelling, case and all: they are looked up in the catalog and quoted, never
// pasted.
type CaptureSpec struct {
	// Feed is the feed the table's changes are written to; one table per
	// feed. Required.
	Feed feed.FeedName
	// Schema is the table's schema. Defaults to DefaultCaptureSchema.
	Schema string
	// Table is the captured table, a plain (not partitioned) table.
	// Required.
	Table string
	// Key names the columns a row's feed key is made of, in order. Some
	// unique index (not partial, no expressions) of the table must cover
	// only columns among them, so that two rows never share a key; their
	// types must print the same text in every session (integers, numeric,
	// text types, uuid, boolean, enums, and domains over them). The key is
	// one column's text, or, for several, each column's text with "%" written
	// "%25" and "/" written "%2F", joined by "/" (SplitKey undoes it). A
	// row whose key columns hold a NULL fails the writer's statement, as a
	// key the feed refuses does (see the package doc's # Capture).
	// Defaults to the primary key's columns.
	Key []string
	// Include names the columns the document keeps; Exclude the columns it
	// drops. At most one of the two, and neither with Document. Defaults to
	// every column.
	Include, Exclude []string
	// Document is a SQL expression over the row, named r, whose value (cast
	// to jsonb) is the row's document, for example
	// `jsonb_build_object('name', r.name, 'price', r.price_cents / 100.0)`.
	// It is the caller's own SQL and runs in the writer's transaction: it is
	// checked once by preparing it against the table, with search_path set
	// to pg_catalog only, as it runs in the trigger, so functions of other
	// schemas must be qualified. A NULL value makes the row a tombstone (the
	// key is absent from the feed); JSON null is refused, as Write refuses
	// it. Defaults to to_jsonb(r), trimmed by Include or Exclude. An
	// UPDATE writes only the rows whose document changed; with a document
	// expression, only the rows of which some column changed (the
	// expression is not run on the old rows).
	Document string
}

// CaptureInfo describes an installed capture.
type CaptureInfo struct {
	Feed          feed.FeedName
	Schema, Table string
	// Key is the key's columns, in order.
	Key []string
	// Version hashes the SQL installed; a Capture that would install the
	// same SQL changes nothing.
	Version string
	// Changed says whether this Capture installed or replaced the trigger
	// (false when it found the same version installed).
	Changed bool
}

// keyTypes are the base types whose text output depends on no session
// setting (DateStyle, TimeZone, extra_float_digits, lc_monetary), so the
// same row gives the same key in every session and a backfill's position
// reads back exactly. Enums are allowed too.
var keyTypes = []string{"int2", "int4", "int8", "numeric", "text", "varchar", "bpchar", "name", "uuid", "bool", "citext"}

// column is one column of a captured table.
type column struct {
	name    string
	typ     string // format_type, for casts
	base    string // the base type's name, domains looked through
	enum    bool
	notNull bool
}

// capture is a CaptureSpec resolved against the catalog: everything the
// trigger and the backfill are generated from.
type capture struct {
	spec    CaptureSpec
	table   string // quoted, schema-qualified
	relid   uint32
	key     []column
	keyExpr string // the key of row r, as text
	docExpr string // the document of row r, as jsonb
	fn      string // the trigger function, quoted, schema-qualified
	// triggers are the four triggers' names (insert, update, delete,
	// truncate), unquoted.
	triggers []string
	// previous is the table an earlier capture of the feed is installed on,
	// quoted, when it is another one (its triggers are dropped).
	previous string
	ddl      string // function and triggers
	version  string
}

// quoteIdent quotes any identifier, doubling its double quotes.
func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

// quoteLiteral is s as a standard-conforming string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// captureLockKey guards every capture change under one schema and prefix:
// Capture and Uncapture serialise on it (DDL alone would not: two
// CREATE OR REPLACE FUNCTION of one name at once fail with "tuple
// concurrently updated").
func (n names) captureLockKey() int64 { return lockKey("capture", n.schema, n.prefix) }

// captureNames are the trigger function's and the triggers' names for f.
func (n names) captureNames(f feed.FeedName) (fn string, triggers []string) {
	h := fmt.Sprintf("%016x", uint64(lockKey("capture", n.schema, n.prefix, string(f))))
	fn = pgschema.Quote(n.schema) + "." + pgschema.Quote(n.prefix+"c"+h[:10])
	for _, ev := range []string{"insert", "update", "delete", "truncate"} {
		triggers = append(triggers, "kairos_"+h+"_"+ev)
	}
	return fn, triggers
}

// validate checks what can be checked without the catalog.
func (c CaptureSpec) validate() error {
	if err := c.Feed.Validate(); err != nil {
		return feed.Invalid("spec.feed", "%v", err)
	}
	if c.Table == "" {
		return feed.Invalid("spec.table", "must not be empty")
	}
	for field, list := range map[string][]string{"spec.key": c.Key, "spec.include": c.Include, "spec.exclude": c.Exclude} {
		for i, name := range list {
			if name == "" || strings.IndexByte(name, 0) >= 0 {
				return feed.Invalid(fmt.Sprintf("%s[%d]", field, i), "is not a column name")
			}
			if slices.Index(list, name) != i {
				return feed.Invalid(fmt.Sprintf("%s[%d]", field, i), "names column %q twice", name)
			}
		}
	}
	switch {
	case len(c.Include) > 0 && len(c.Exclude) > 0:
		return feed.Invalid("spec.include", "and spec.exclude are both set; give one")
	case c.Document != "" && (len(c.Include) > 0 || len(c.Exclude) > 0):
		return feed.Invalid("spec.document", "is set with spec.include or spec.exclude; a document expression picks its columns itself")
	case strings.Contains(c.Document, "$kairos$"):
		return feed.Invalid("spec.document", "contains $kairos$, the quote the trigger's body is written in")
	}
	return nil
}

// resolveCapture resolves spec against the catalog in tx, which must hold
// the capture lock when its result is installed.
func (s *Store) resolveCapture(ctx context.Context, tx pgx.Tx, spec CaptureSpec) (*capture, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	if spec.Schema == "" {
		spec.Schema = DefaultCaptureSchema
	}
	var enc string
	if err := tx.QueryRow(ctx, `SELECT current_setting('server_encoding')`).Scan(&enc); err != nil {
		return nil, feed.Unreadable("reading the catalog", err)
	}
	if enc != "UTF8" {
		return nil, feed.Invalid("database", "has server_encoding %s; capture needs UTF8, the encoding of feed keys", enc)
	}
	var nsp *uint32
	if err := tx.QueryRow(ctx, `SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = $1::text`, spec.Schema).Scan(&nsp); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, feed.Unreadable("reading the catalog", err)
	}
	if nsp == nil {
		return nil, feed.Invalid("spec.schema", "names schema %q, which does not exist", spec.Schema)
	}
	c := &capture{spec: spec, table: quoteIdent(spec.Schema) + "." + quoteIdent(spec.Table)}
	var kind string
	err := tx.QueryRow(ctx, `SELECT oid, relkind::text FROM pg_catalog.pg_class WHERE relnamespace = $1::oid AND relname = $2::text`, *nsp, spec.Table).Scan(&c.relid, &kind)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, feed.Invalid("spec.table", "names table %s, which does not exist", c.table)
	case err != nil:
		return nil, feed.Unreadable("reading the catalog", err)
	case kind == "p":
		return nil, feed.Invalid("spec.table", "names %s, a partitioned table; capture its partitions, or a plain table", c.table)
	case kind != "r":
		return nil, feed.Invalid("spec.table", "names %s, which is not a table (relkind %s)", c.table, kind)
	}
	rows, err := tx.Query(ctx, `SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
	coalesce(b.typname, t.typname)::text, coalesce(b.typtype, t.typtype) = 'e'
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype
WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`, c.relid)
	if err != nil {
		return nil, feed.Unreadable("reading the catalog", err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (column, error) {
		var col column
		return col, r.Scan(&col.name, &col.typ, &col.notNull, &col.base, &col.enum)
	})
	if err != nil {
		return nil, feed.Unreadable("reading the catalog", err)
	}
	find := func(field string, i int, name string) (column, error) {
		for _, col := range cols {
			if col.name == name {
				return col, nil
			}
		}
		return column{}, feed.Invalid(fmt.Sprintf("%s[%d]", field, i), "names column %q, which table %s does not have", name, c.table)
	}
	for i, name := range spec.Include {
		if _, err := find("spec.include", i, name); err != nil {
			return nil, err
		}
	}
	for i, name := range spec.Exclude {
		if _, err := find("spec.exclude", i, name); err != nil {
			return nil, err
		}
	}

	// The key: the primary key, or the given columns under a unique index.
	keyNames := spec.Key
	if len(keyNames) == 0 {
		var pk []string
		if err := tx.QueryRow(ctx, `SELECT array_agg(a.attname::text ORDER BY k.ord)
FROM pg_catalog.pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1::oid AND i.indisprimary`, c.relid).Scan(&pk); err != nil {
			return nil, feed.Unreadable("reading the catalog", err)
		}
		if len(pk) == 0 {
			return nil, feed.Invalid("spec.key", "is empty and table %s has no primary key; name the key's columns", c.table)
		}
		keyNames = pk
	} else {
		rows, err := tx.Query(ctx, `SELECT array_agg(a.attname::text)
FROM pg_catalog.pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) AS k(attnum)
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1::oid AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid`, c.relid)
		if err != nil {
			return nil, feed.Unreadable("reading the catalog", err)
		}
		uniques, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
		if err != nil {
			return nil, feed.Unreadable("reading the catalog", err)
		}
		covered := slices.ContainsFunc(uniques, func(u []string) bool {
			return !slices.ContainsFunc(u, func(n string) bool { return !slices.Contains(keyNames, n) })
		})
		for i, name := range keyNames {
			if _, err := find("spec.key", i, name); err != nil {
				return nil, err
			}
		}
		if !covered {
			return nil, feed.Invalid("spec.key", "names columns %q of table %s that no unique index (without a predicate or expressions) covers; two rows could share a key", keyNames, c.table)
		}
	}
	for i, name := range keyNames {
		col, err := find("spec.key", i, name)
		if err != nil {
			return nil, err
		}
		if !col.enum && !slices.Contains(keyTypes, col.base) {
			return nil, feed.Invalid(fmt.Sprintf("spec.key[%d]", i), "names column %q of type %s, whose text depends on session settings or is not a key type; key on integers, numeric, text, uuid, boolean or enum columns (a generated column can hold one)", name, col.typ)
		}
		c.key = append(c.key, col)
	}

	// The key expression: one column's text, or the escaped texts joined.
	if len(c.key) == 1 {
		c.keyExpr = "(r." + quoteIdent(c.key[0].name) + ")::text"
	} else {
		parts := make([]string, len(c.key))
		for i, col := range c.key {
			parts[i] = "replace(replace((r." + quoteIdent(col.name) + ")::text, '%', '%25'), '/', '%2F')"
		}
		c.keyExpr = "(" + strings.Join(parts, " || '/' || ") + ")"
	}

	// The document expression.
	switch {
	case spec.Document != "":
		c.docExpr = "(" + spec.Document + "\n)::jsonb"
	default:
		drop := spec.Exclude
		if len(spec.Include) > 0 {
			drop = nil
			for _, col := range cols {
				if !slices.Contains(spec.Include, col.name) {
					drop = append(drop, col.name)
				}
			}
		}
		c.docExpr = "to_jsonb(r)"
		if len(drop) > 0 {
			lits := make([]string, len(drop))
			for i, d := range drop {
				lits[i] = quoteLiteral(d)
			}
			c.docExpr = "(to_jsonb(r) - ARRAY[" + strings.Join(lits, ", ") + "]::text[])"
		}
	}
	// Check both expressions the way the trigger runs them, by preparing
	// them against the table (a prepared statement is one statement, so the
	// document cannot smuggle another in). The setting is local to tx.
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)`); err != nil {
		return nil, feed.Unreadable("reading the catalog", err)
	}
	check := `SELECT ` + c.keyExpr + `, ` + c.docExpr + ` FROM ` + c.table + ` AS r`
	if _, err := tx.Conn().PgConn().Prepare(ctx, "", check, nil); err != nil {
		field := "spec.document"
		if spec.Document == "" {
			field = "spec"
		}
		return nil, feed.Invalid(field, "does not prepare against table %s: %v", c.table, err)
	}

	c.fn, c.triggers = s.names.captureNames(spec.Feed)
	var prevSchema, prevTable string
	err = tx.QueryRow(ctx, `SELECT table_schema, table_name FROM `+s.names.table("captures")+` WHERE feed = $1::text`, string(spec.Feed)).Scan(&prevSchema, &prevTable)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, feed.Unreadable("reading the captures of feed "+string(spec.Feed), err)
	case prevSchema != spec.Schema || prevTable != spec.Table:
		c.previous = quoteIdent(prevSchema) + "." + quoteIdent(prevTable)
	}
	c.ddl = s.captureDDL(c)
	sum := sha256.Sum256([]byte(c.ddl))
	c.version = hex.EncodeToString(sum[:8])
	return c, nil
}

// table is the quoted, schema-qualified name of this package's table (or
// function) t.
func (n names) table(t string) string {
	return pgschema.Names{Schema: n.schema, Prefix: n.prefix}.Table(t)
}

// captureDDL is the trigger function and the four triggers for c. The
// function builds the statement's change set from its transition tables
// and hands it to the feed's write function, which applies Write's rules;
// an UPDATE hands, as tombstones, the keys of old rows no new row has, and
// the new rows' documents where they changed, so a key that changed leaves
// a tombstone, a key that stayed has its new document, and a row whose
// document stayed writes nothing. Keys are distinct in each part and the
// tombstones' keys are none of the documents', so the set has each key
// once, as the write function needs. TRUNCATE moves the feed to a new
// generation.
func (s *Store) captureDDL(c *capture) string {
	feedLit, chanLit := quoteLiteral(string(c.spec.Feed)), quoteLiteral(s.names.channel)
	// Keys are compared as the feed compares them, byte by byte: under the
	// column's own equality 1.0 = 1.00 (numeric) or 'A' = 'a' (citext), and
	// a key whose text changed must still leave a tombstone.
	keyC := "(" + c.keyExpr + `) COLLATE "C"`
	// An UPDATE writes only the rows whose document changed. A row whose
	// every column is unchanged, by record image (byte by byte, so 1.0 and
	// 1.00 differ), keeps its document: that is the whole test for a
	// document of every column, and for a document expression, which is the
	// user's and is not run on the old rows (it might fail on values the
	// UPDATE repairs). A document trimmed by Include or Exclude is compared
	// itself, so an UPDATE of a left-out column writes nothing: as text,
	// not by jsonb's equality, which holds 1.0 and 1.00 equal where a sink
	// would see the change (jsonb's text is canonical, so equal text is an
	// equal document).
	// The comparisons are written so that neither can be a merge or hash
	// key: joined on them, the planner sorted both sides by the whole row
	// or document, on disk at 10k rows, where a hash join on the key and a
	// filter cost a fraction.
	newRec, oldCmp, unchanged := ", r AS rec", "r AS rec", "(o.rec *= n.rec) IS TRUE"
	if c.spec.Document == "" && c.docExpr != "to_jsonb(r)" {
		newRec, oldCmp, unchanged = "", c.docExpr+" AS doc", "o.doc::text IS NOT DISTINCT FROM n.doc::text"
	}
	write, reset := s.names.table("write"), s.names.table("reset")
	var b strings.Builder
	fmt.Fprintf(&b, `-- Kairos capture of table %[1]s into feed %[2]s.
CREATE OR REPLACE FUNCTION %[3]s() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $kairos$
DECLARE
    k text[];
    d jsonb[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(%[4]s), array_agg(%[5]s) INTO k, d FROM kairos_new AS r;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT array_agg(c.key), array_agg(c.doc) INTO k, d FROM (
            SELECT o.key, NULL::jsonb AS doc FROM (SELECT %[4]s AS key FROM kairos_old AS r) AS o
            WHERE NOT EXISTS (SELECT FROM kairos_new AS r WHERE %[4]s = o.key)
            UNION ALL
            SELECT n.key, n.doc FROM (SELECT %[4]s AS key, %[5]s AS doc%[10]s FROM kairos_new AS r) AS n
            WHERE NOT EXISTS (SELECT FROM (SELECT %[4]s AS key, %[12]s FROM kairos_old AS r) AS o
                WHERE o.key = n.key AND %[13]s)
        ) AS c;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(%[4]s), array_agg(NULL::jsonb) INTO k, d FROM kairos_old AS r;
    ELSE
        PERFORM %[6]s(%[8]s, %[9]s, %[11]d);
        RETURN NULL;
    END IF;
    PERFORM %[7]s(%[8]s, k, d, %[9]s, %[11]d);
    RETURN NULL;
END
$kairos$;
`, c.table, c.spec.Feed, c.fn, keyC, c.docExpr, reset, write, feedLit, chanLit, newRec, s.writeKey(c.spec.Feed), oldCmp, unchanged)
	if c.previous != "" {
		for _, t := range c.triggers {
			fmt.Fprintf(&b, "DROP TRIGGER IF EXISTS %s ON %s;\n", quoteIdent(t), c.previous)
		}
	}
	refs := []string{
		"AFTER INSERT ON %s REFERENCING NEW TABLE AS kairos_new",
		"AFTER UPDATE ON %s REFERENCING OLD TABLE AS kairos_old NEW TABLE AS kairos_new",
		"AFTER DELETE ON %s REFERENCING OLD TABLE AS kairos_old",
		"AFTER TRUNCATE ON %s",
	}
	for i, t := range c.triggers {
		fmt.Fprintf(&b, "DROP TRIGGER IF EXISTS %s ON %s;\n", quoteIdent(t), c.table)
		fmt.Fprintf(&b, "CREATE TRIGGER %s "+refs[i]+" FOR EACH STATEMENT EXECUTE FUNCTION %s();\n", quoteIdent(t), c.table, c.fn)
	}
	return b.String()
}

// installSQL is the whole capture script: the capture lock, the DDL and the
// registry row.
func (s *Store) installSQL(c *capture) (string, error) {
	spec, err := json.Marshal(c.spec)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n%sINSERT INTO %s AS c (feed, table_schema, table_name, spec, version)\nVALUES (%s, %s, %s, %s::jsonb, %s)\nON CONFLICT (feed) DO UPDATE SET table_schema = excluded.table_schema, table_name = excluded.table_name,\n    spec = excluded.spec, version = excluded.version, installed_at = clock_timestamp();\n",
		s.names.captureLockKey(), c.ddl, s.names.table("captures"),
		quoteLiteral(string(c.spec.Feed)), quoteLiteral(c.spec.Schema), quoteLiteral(c.spec.Table), quoteLiteral(string(spec)), quoteLiteral(c.version)), nil
}

// CaptureSQL returns the SQL Capture would run for spec, resolved against
// the database's catalog as it is now, for review or a migration tool of
// the team's own: one script that takes the capture lock, creates the
// trigger function and the four triggers, and records the capture. Run it
// in one transaction. It changes nothing itself.
func (s *Store) CaptureSQL(ctx context.Context, spec CaptureSpec) (string, error) {
	var out string
	err := s.captureTx(ctx, func(tx pgx.Tx) error {
		c, err := s.resolveCapture(ctx, tx, spec)
		if err != nil {
			return err
		}
		out, err = s.installSQL(c)
		return err
	})
	return out, err
}

// captureTx runs fn in a transaction under the capture lock; fn's errors
// come back as they are, and the transaction rolls back on any.
func (s *Store) captureTx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return feed.WriteFailed("opening a capture transaction", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::bigint)`, s.names.captureLockKey()); err != nil {
		return feed.WriteFailed("taking the capture lock", err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return feed.WriteFailed("committing a capture", err)
	}
	return nil
}

// Capture installs, or brings up to date, the capture of spec.Table into
// spec.Feed: statement-level AFTER triggers that write, in the writing
// transaction itself, the feed rows of every INSERT, UPDATE and DELETE of
// the table (COPY and INSERT … ON CONFLICT included), by Write's rules in
// the feed's write mode, whichever it is now or later: one row per key, in
// commit order. A
// TRUNCATE moves the feed to a new generation (see the package doc's
// # Capture). Everything is checked before anything is installed (an
// *feed.InvalidError names the spec's field), and the whole install is one
// transaction under an advisory lock, so processes that capture at once
// serialise. A Capture whose SQL is already installed changes nothing and
// takes no lock on the table; one with a changed spec (or a build that
// generates other SQL) replaces the trigger, and one naming another table
// for the same feed moves it. Existing rows are not copied: Backfill does.
func (s *Store) Capture(ctx context.Context, spec CaptureSpec) (CaptureInfo, error) {
	var info CaptureInfo
	err := s.captureTx(ctx, func(tx pgx.Tx) error {
		c, err := s.resolveCapture(ctx, tx, spec)
		if err != nil {
			return err
		}
		info = CaptureInfo{Feed: c.spec.Feed, Schema: c.spec.Schema, Table: c.spec.Table, Version: c.version}
		for _, k := range c.key {
			info.Key = append(info.Key, k.name)
		}
		var version string
		var present int
		err = tx.QueryRow(ctx, `SELECT coalesce((SELECT version FROM `+s.names.table("captures")+` WHERE feed = $1::text), ''),
	(SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = $2::oid AND tgname = ANY ($3::text[]))`,
			string(c.spec.Feed), c.relid, c.triggers).Scan(&version, &present)
		if err != nil {
			return feed.Unreadable("reading the captures of feed "+string(c.spec.Feed), err)
		}
		if version == c.version && present == len(c.triggers) {
			return nil
		}
		script, err := s.installSQL(c)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
			return feed.WriteFailed("installing the capture of table "+c.table+" into feed "+string(c.spec.Feed), err)
		}
		info.Changed = true
		return nil
	})
	if err != nil {
		return CaptureInfo{}, err
	}
	return info, nil
}

// Uncapture removes f's capture: its triggers, its function, its registry
// row and its backfill's progress. The feed's rows stay. It says whether
// there was a capture; removing none is not an error. It serialises with
// Capture on the same lock.
func (s *Store) Uncapture(ctx context.Context, f feed.FeedName) (bool, error) {
	if err := f.Validate(); err != nil {
		return false, err
	}
	var found bool
	err := s.captureTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `DELETE FROM `+s.names.table("captures")+` WHERE feed = $1::text RETURNING true`, string(f)).Scan(&found)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return feed.WriteFailed("removing the capture of feed "+string(f), err)
		}
		// The triggers are found by the function they call, not by the
		// recorded table's name, so a table renamed since still loses them.
		fn, _ := s.names.captureNames(f)
		rows, err := tx.Query(ctx, `SELECT tgrelid::regclass::text, tgname::text FROM pg_catalog.pg_trigger
WHERE tgfoid = to_regprocedure($1::text) AND NOT tgisinternal`, fn+"()")
		if err != nil {
			return feed.Unreadable("reading the catalog", err)
		}
		type trig struct{ table, name string }
		trigs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (trig, error) {
			var t trig
			return t, r.Scan(&t.table, &t.name)
		})
		if err != nil {
			return feed.Unreadable("reading the catalog", err)
		}
		var b strings.Builder
		for _, t := range trigs {
			fmt.Fprintf(&b, "DROP TRIGGER IF EXISTS %s ON %s;\n", quoteIdent(t.name), t.table)
		}
		fmt.Fprintf(&b, "DROP FUNCTION IF EXISTS %s();\nDELETE FROM %s WHERE feed = %s;\n", fn, s.names.table("backfills"), quoteLiteral(string(f)))
		if _, err := tx.Exec(ctx, b.String(), pgx.QueryExecModeSimpleProtocol); err != nil {
			return feed.WriteFailed("removing the capture of feed "+string(f), err)
		}
		return nil
	})
	return found, err
}

// Captures lists the installed captures, by feed. Key is the spec's as
// given: empty for a capture keyed on the primary key. Changed is false.
func (s *Store) Captures(ctx context.Context) ([]CaptureInfo, error) {
	rows, err := s.db.Query(ctx, `SELECT feed, table_schema, table_name, spec, version FROM `+s.names.table("captures")+` ORDER BY feed`)
	if err != nil {
		return nil, feed.Unreadable("reading the captures", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (CaptureInfo, error) {
		var ci CaptureInfo
		var spec CaptureSpec
		err := r.Scan(&ci.Feed, &ci.Schema, &ci.Table, &spec, &ci.Version)
		ci.Key = spec.Key
		return ci, err
	})
}

// SplitKey undoes the key encoding of a capture keyed on several columns
// (see CaptureSpec.Key): each column's text, in key order. A key of one
// column is that column's text as it is; do not split it.
func SplitKey(key feed.Key) ([]string, error) {
	parts := strings.Split(string(key), "/")
	for i, p := range parts {
		var b strings.Builder
		for j := 0; j < len(p); j++ {
			if p[j] != '%' {
				b.WriteByte(p[j])
				continue
			}
			switch {
			case strings.HasPrefix(p[j:], "%25"):
				b.WriteByte('%')
			case strings.HasPrefix(p[j:], "%2F"):
				b.WriteByte('/')
			default:
				return nil, feed.Invalid("key", "%q has a %% in its part %d that is neither %%25 nor %%2F; it is not a capture key of several columns", key, i+1)
			}
			j += 2
		}
		parts[i] = b.String()
	}
	return parts, nil
}
