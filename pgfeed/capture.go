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
	"time"

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
	// Table is the captured table: a plain table, or a partitioned table,
	// whose triggers then go on every partition under it too (see the
	// package doc's # Partitioned tables). Not a partition alone, and not a
	// table of an inheritance tree (INHERITS). Required.
	Table string
	// Key names the columns a row's feed key is made of, in order. Some
	// unique index (not partial, no expressions) of the table must cover
	// only columns among them, so that two rows never share a key; their
	// types must print the same text in every session (integers, numeric,
	// text types, uuid, boolean, enums, and domains over them). The key is
	// one column's text, or, for several, each column's text with "%" written
	// "%25" and "/" written "%2F", joined by "/" (SplitKey undoes it). Each
	// column must be NOT NULL, as a primary key's are: a row with NULL in
	// one would have no key. Defaults to the primary key's columns.
	Key []string
	// Include names the columns the document keeps; Exclude the columns it
	// drops. At most one of the two, and neither with Document. Defaults to
	// every column.
	Include, Exclude []string
	// Document is a SQL expression over the row, named r, whose value (cast
	// to jsonb) is the row's document, for example
	// `jsonb_build_object('name', r.name, 'price', r.price_cents / 100.0)`.
	// It is the caller's own SQL and runs in the writer's transaction, as
	// the role that ran Capture (see the package doc's # Capture): it is
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
	// Uncovered names ("schema.table") the tables of the capture, the
	// captured table and every partition under it, that lack one of its
	// triggers or have one disabled: their writes do not reach the feed.
	// A partition created or attached after Capture is one. Empty after a
	// Capture, which covers them; Backfill refuses while it is not.
	Uncovered []string
	// Stray names ("schema.table") the tables that still carry the
	// capture's triggers but are no longer the captured table or under it
	// (a detached partition, the table of an earlier spec): their writes
	// still reach the feed. A Capture removes those triggers; Backfill
	// refuses until then.
	Stray []string
	// Spec is the spec as given to the Capture that installed it (set by
	// Captures), so an operator can run the same Capture again.
	Spec CaptureSpec
	// Backfill is the feed's last backfill, nil when none ran (set by
	// Captures).
	Backfill *BackfillState
}

// BackfillState is how far a feed's last backfill got.
type BackfillState struct {
	// Rows is how many rows it copied.
	Rows int64
	// Started is when it started, Updated when its last batch committed.
	Started, Updated time.Time
	// Finished is when it copied the last row; zero while it has not (it
	// runs, or stopped, and resumes when run again).
	Finished time.Time
	// Current says it read the table with the capture as installed; a
	// backfill after a Capture that changed the spec starts over.
	Current bool
}

// keyTypes are the base types whose text output depends on no session
// setting (DateStyle, TimeZone, extra_float_digits, lc_monetary), so the
// same row gives the same key in every session and a backfill's position
// reads back exactly. Enums are allowed too.
var keyTypes = []string{"int2", "int4", "int8", "numeric", "text", "varchar", "bpchar", "name", "uuid", "bool", "citext"}

// column is one column of a captured table.
type column struct {
	name string
	typ  string // format_type, for casts
	// cast is the column's type qualified by its schema (pg_catalog's
	// types bare, without a modifier), for casts in SQL that runs with
	// search_path set to pg_catalog only.
	cast    string
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
	// docs is the capture's document function, quoted, schema-qualified,
	// through which the sealer reads recorded keys' documents; keyed says
	// the trigger records keys in the concurrent mode, which it does
	// when the spec has no document expression (see captureDDL).
	docs  string
	keyed bool
	// triggers are the four triggers' names (insert, update, delete,
	// truncate), unquoted.
	triggers []string
	// partitioned says the table is partitioned; parts are then the tables
	// under it, sub-partitioned ones included, quoted, in name order.
	partitioned bool
	parts       []string
	// before is the name of a partitioned table's BEFORE TRUNCATE trigger;
	// skip is the setting through which that trigger tells its partitions'
	// TRUNCATE triggers that the feed is reset anyway (see captureDDL).
	before, skip string
	// stale are the DROP TRIGGER statements for the capture's triggers on
	// tables it no longer covers (an earlier table of the feed, a detached
	// partition), found by the function they call. They are not part of
	// ddl, so not of the version: what was installed before does not change
	// what this spec installs.
	stale string
	// uncovered and stray are the gaps of the triggers as installed now
	// (CaptureInfo's fields).
	uncovered, stray []string
	ddl              string // function and triggers
	version          string
}

// quoteIdent quotes any identifier, doubling its double quotes.
func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

// rowDoc is the document of a whole row r.
const rowDoc = "pg_catalog.to_jsonb(r)"

// op is the binary or prefix operator name of pg_catalog, named with its
// schema, for SQL that runs under a search_path a writer chose.
func op(name string) string { return "OPERATOR(pg_catalog." + name + ")" }

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

// captureDocsName is the name of f's document function (a keyed capture's;
// see captureDDL), which the sealer calls: derived from the feed alone, so
// a sealer finds it without reading the capture.
func (n names) captureDocsName(f feed.FeedName) string {
	h := fmt.Sprintf("%016x", uint64(lockKey("capture", n.schema, n.prefix, string(f))))
	return pgschema.Quote(n.schema) + "." + pgschema.Quote(n.prefix+"d"+h[:10])
}

// captureTruncateNames are, for f, the name of a partitioned table's BEFORE
// TRUNCATE trigger and of the transaction-local setting it sets.
func (n names) captureTruncateNames(f feed.FeedName) (before, skip string) {
	h := fmt.Sprintf("%016x", uint64(lockKey("capture", n.schema, n.prefix, string(f))))
	return "kairos_" + h + "_truncating", "kairos.truncate_" + h
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
	var isPartition bool
	err := tx.QueryRow(ctx, `SELECT oid, relkind::text, relispartition FROM pg_catalog.pg_class WHERE relnamespace = $1::oid AND relname = $2::text`, *nsp, spec.Table).Scan(&c.relid, &kind, &isPartition)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, feed.Invalid("spec.table", "names table %s, which does not exist", c.table)
	case err != nil:
		return nil, feed.Unreadable("reading the catalog", err)
	case kind != "r" && kind != "p":
		return nil, feed.Invalid("spec.table", "names %s, which is %s, not a table", c.table, relkindName(kind))
	}
	if err := c.resolveTree(ctx, tx, kind, isPartition); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
	coalesce(b.typname, t.typname)::text, coalesce(b.typtype, t.typtype) = 'e',
	CASE WHEN tn.nspname = 'pg_catalog' THEN pg_catalog.format_type(t.oid, NULL)
		ELSE pg_catalog.quote_ident(tn.nspname) || '.' || pg_catalog.quote_ident(t.typname) END
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
LEFT JOIN pg_catalog.pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype
WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`, c.relid)
	if err != nil {
		return nil, feed.Unreadable("reading the catalog", err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (column, error) {
		var col column
		return col, r.Scan(&col.name, &col.typ, &col.notNull, &col.base, &col.enum, &col.cast)
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
WHERE i.indrelid = $1::oid AND i.indisprimary AND i.indisvalid`, c.relid).Scan(&pk); err != nil {
			return nil, feed.Unreadable("reading the catalog", err)
		}
		if len(pk) == 0 {
			return nil, feed.Invalid("spec.key", "is empty and table %s has no primary key (a valid one: not created ON ONLY a partitioned table and left unattached); name the key's columns", c.table)
		}
		keyNames = pk
	} else {
		rows, err := tx.Query(ctx, `SELECT array_agg(a.attname::text)
FROM pg_catalog.pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) AS k(attnum)
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1::oid AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
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
			return nil, feed.Invalid("spec.key", "names columns %q of table %s that no unique index covers (a valid one of the table itself, without a predicate or expressions: a partition's own index, or one created ON ONLY a partitioned table and not yet valid, does not count); two rows could share a key", keyNames, c.table)
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
		// Refused here rather than left to the trigger, whose refusal of a
		// NULL key would come at some later write and name neither the
		// column nor the row. A unique index lets any number of rows hold
		// NULL; a primary key's columns never do, so this only ever
		// refuses a chosen key.
		if !col.notNull {
			return nil, feed.Invalid(fmt.Sprintf("spec.key[%d]", i), "names column %q of table %s, which may hold NULL, and a row with NULL there would have no key; make the column NOT NULL, or key the capture by other columns", name, c.table)
		}
		c.key = append(c.key, col)
	}

	// The key expression: one column's text, or the escaped texts joined.
	// It and the document expression Kairos writes name every type,
	// function and operator with its schema, since a keyed trigger runs
	// them under the writer's search_path (see captureDDL).
	if len(c.key) == 1 {
		c.keyExpr = "(r." + quoteIdent(c.key[0].name) + ")::pg_catalog.text"
	} else {
		parts := make([]string, len(c.key))
		for i, col := range c.key {
			parts[i] = "pg_catalog.replace(pg_catalog.replace((r." + quoteIdent(col.name) + ")::pg_catalog.text, '%', '%25'), '/', '%2F')"
		}
		c.keyExpr = "(" + strings.Join(parts, " "+op("||")+" '/' "+op("||")+" ") + ")"
	}

	// The document expression.
	switch {
	case spec.Document != "":
		c.docExpr = "(" + spec.Document + "\n)::pg_catalog.jsonb"
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
		c.docExpr = rowDoc
		if len(drop) > 0 {
			lits := make([]string, len(drop))
			for i, d := range drop {
				lits[i] = quoteLiteral(d)
			}
			c.docExpr = "(" + rowDoc + " " + op("-") + " ARRAY[" + strings.Join(lits, ", ") + "]::pg_catalog.text[])"
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
	c.docs, c.keyed = s.names.captureDocsName(spec.Feed), spec.Document == ""
	c.before, c.skip = s.names.captureTruncateNames(spec.Feed)
	state, err := s.captureState(ctx, tx, spec.Feed, &c.relid, spec.Schema, spec.Table)
	if err != nil {
		return nil, err
	}
	c.uncovered, c.stray = state.uncovered, state.strayTables
	var stale strings.Builder
	for _, t := range state.strayTriggers {
		fmt.Fprintf(&stale, "DROP TRIGGER IF EXISTS %s ON %s;\n", quoteIdent(t.name), t.table)
	}
	c.stale = stale.String()
	c.ddl = s.captureDDL(c)
	sum := sha256.Sum256([]byte(c.ddl))
	c.version = hex.EncodeToString(sum[:8])
	return c, nil
}

// relName is a catalog table's quoted, schema-qualified name.
func relName(schema, table string) string { return quoteIdent(schema) + "." + quoteIdent(table) }

// relNames collects rows of (schema, table) as quoted, qualified names.
func relNames(rows pgx.Rows) ([]string, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var schema, table string
		err := r.Scan(&schema, &table)
		return relName(schema, table), err
	})
}

// resolveTree checks where c's table stands among partitions and
// inheritance, and records a partitioned table's partitions. Only a whole
// partition tree can be captured: a write that names one partition fires
// that partition's statement triggers only, so a partition alone misses
// the writes through its parent, and its feed would key rows that its
// siblings may share. An inheritance tree is refused outright: an UPDATE or
// DELETE naming the parent changes the children's rows without firing
// their triggers, a write naming a child changes rows the parent's reads
// (and a backfill through it) return, and nothing in PostgreSQL keeps keys
// unique across the tree.
func (c *capture) resolveTree(ctx context.Context, tx pgx.Tx, kind string, isPartition bool) error {
	if isPartition {
		var schema, table string
		if err := tx.QueryRow(ctx, `SELECT n.nspname::text, r.relname::text FROM pg_catalog.pg_class r
JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = pg_catalog.pg_partition_root($1::oid)`, c.relid).Scan(&schema, &table); err != nil {
			return feed.Unreadable("reading the catalog", err)
		}
		root := relName(schema, table)
		return feed.Invalid("spec.table", "names %s, a partition of %s; capture %s, whose triggers then cover every partition under it", c.table, root, root)
	}
	related := func(q string) ([]string, error) {
		rows, err := tx.Query(ctx, q, c.relid)
		if err != nil {
			return nil, feed.Unreadable("reading the catalog", err)
		}
		names, err := relNames(rows)
		if err != nil {
			return nil, feed.Unreadable("reading the catalog", err)
		}
		return names, nil
	}
	// inherits names the tables on the other side of the table's
	// pg_inherits rows: its children (the rows where it is inhparent), or
	// its parents (where it is inhrelid).
	inherits := func(this, other string) ([]string, error) {
		return related(`SELECT n.nspname::text, r.relname::text FROM pg_catalog.pg_inherits i
JOIN pg_catalog.pg_class r ON r.oid = i.` + other + ` JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
WHERE i.` + this + ` = $1::oid ORDER BY n.nspname COLLATE "C", r.relname COLLATE "C"`)
	}
	if kind == "r" {
		children, err := inherits("inhparent", "inhrelid")
		if err != nil {
			return err
		}
		if len(children) > 0 {
			return feed.Invalid("spec.table", "names %s, which has inheritance children (%s): writes naming it change their rows without their triggers, and a backfill through it would copy them; capture cannot cover an inheritance tree", c.table, strings.Join(children, ", "))
		}
		parents, err := inherits("inhrelid", "inhparent")
		if err != nil {
			return err
		}
		if len(parents) > 0 {
			return feed.Invalid("spec.table", "names %s, an inheritance child of %s: writes naming the parent change its rows without its triggers; capture cannot cover an inheritance tree", c.table, strings.Join(parents, ", "))
		}
		return nil
	}
	c.partitioned = true
	foreign, err := related(`SELECT n.nspname::text, r.relname::text FROM pg_catalog.pg_partition_tree($1::oid::regclass) AS t
JOIN pg_catalog.pg_class r ON r.oid = t.relid JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
WHERE t.level > 0 AND r.relkind NOT IN ('r', 'p') ORDER BY n.nspname COLLATE "C", r.relname COLLATE "C"`)
	if err != nil {
		return err
	}
	if len(foreign) > 0 {
		return feed.Invalid("spec.table", "names %s, which has partitions that are not tables (%s, foreign tables, whose triggers cannot have transition tables, and whose server is written past them); capture cannot cover them", c.table, strings.Join(foreign, ", "))
	}
	c.parts, err = related(`SELECT n.nspname::text, r.relname::text FROM pg_catalog.pg_partition_tree($1::oid::regclass) AS t
JOIN pg_catalog.pg_class r ON r.oid = t.relid JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
WHERE t.level > 0`)
	if err != nil {
		return err
	}
	// In the order of the names as written, so the DDL, and the version,
	// depend on the set only.
	slices.Sort(c.parts)
	return nil
}

// captureTriggers is where a capture's triggers are, against where they
// should be.
type captureTriggers struct {
	// uncovered and strayTables are CaptureInfo's Uncovered and Stray.
	uncovered, strayTables []string
	// strayTriggers are the capture's triggers on tables it does not
	// cover, and those of its names a covered table should not have (a
	// former root's BEFORE TRUNCATE trigger, now a partition's).
	strayTriggers []struct{ table, name string }
}

// captureState reads where f's triggers are, against where they should be
// for the table relid (nil: schema.table, looked up by name; a table that
// no longer exists is then uncovered): on the table, and on every
// partition under it when it is partitioned, every one of them present,
// calling f's function, and enabled (a trigger enabled for replicas only
// does not fire for the application's writes either). Its triggers are
// found by the function they call, so a table renamed since keeps them.
func (s *Store) captureState(ctx context.Context, q DBTX, f feed.FeedName, relid *uint32, schema, table string) (captureTriggers, error) {
	var st captureTriggers
	fail := func(err error) (captureTriggers, error) {
		return captureTriggers{}, feed.Unreadable("reading the triggers of feed "+string(f), err)
	}
	if relid == nil {
		if err := q.QueryRow(ctx, `SELECT pg_catalog.to_regclass($1::text)::oid`, relName(schema, table)).Scan(&relid); err != nil {
			return fail(err)
		}
		if relid == nil {
			st.uncovered = []string{schema + "." + table}
		}
	}
	fn, triggers := s.names.captureNames(f)
	before, _ := s.names.captureTruncateNames(f)
	rows, err := q.Query(ctx, `WITH fn AS (SELECT pg_catalog.to_regprocedure($2::text) AS oid),
tree AS (
	SELECT $1::oid AS relid, true AS root WHERE $1::oid IS NOT NULL
	UNION ALL
	SELECT t.relid, false FROM pg_catalog.pg_partition_tree($1::oid::regclass) AS t WHERE t.level > 0
), want AS (
	SELECT tree.relid, w.name FROM tree, unnest($3::text[]) AS w(name)
	UNION ALL
	SELECT tree.relid, $4::text FROM tree JOIN pg_catalog.pg_class r ON r.oid = tree.relid WHERE tree.root AND r.relkind = 'p'
)
SELECT 'uncovered', n.nspname::text, r.relname::text, ''
FROM pg_catalog.pg_class r JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
WHERE r.oid IN (SELECT w.relid FROM want AS w WHERE NOT EXISTS (
	SELECT FROM pg_catalog.pg_trigger g, fn
	WHERE g.tgrelid = w.relid AND g.tgname = w.name AND g.tgfoid = fn.oid AND g.tgenabled IN ('O', 'A')))
UNION ALL
SELECT CASE WHEN g.tgrelid IN (SELECT tree.relid FROM tree) THEN 'extra' ELSE 'stray' END, n.nspname::text, r.relname::text, g.tgname::text
FROM pg_catalog.pg_trigger g JOIN fn ON g.tgfoid = fn.oid
JOIN pg_catalog.pg_class r ON r.oid = g.tgrelid JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
WHERE NOT g.tgisinternal AND (g.tgrelid, g.tgname::text) NOT IN (SELECT want.relid, want.name FROM want)
ORDER BY 1, 2, 3, 4`, relid, fn+"()", triggers, before)
	if err != nil {
		return fail(err)
	}
	type found struct{ what, schema, table, trigger string }
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (found, error) {
		var f found
		return f, r.Scan(&f.what, &f.schema, &f.table, &f.trigger)
	})
	if err != nil {
		return fail(err)
	}
	for _, x := range all {
		switch x.what {
		case "uncovered":
			st.uncovered = append(st.uncovered, x.schema+"."+x.table)
		case "stray":
			if name := x.schema + "." + x.table; !slices.Contains(st.strayTables, name) {
				st.strayTables = append(st.strayTables, name)
			}
			fallthrough
		default:
			st.strayTriggers = append(st.strayTriggers, struct{ table, name string }{relName(x.schema, x.table), x.trigger})
		}
	}
	// Sorted as written, whatever the database's collation.
	slices.Sort(st.uncovered)
	slices.Sort(st.strayTables)
	return st, nil
}

// table is the quoted, schema-qualified name of this package's table (or
// function) t.
func (n names) table(t string) string {
	return pgschema.Names{Schema: n.schema, Prefix: n.prefix}.Table(t)
}

// captureDDL is the trigger function and the triggers for c. The
// function builds the statement's change set from its transition tables
// and hands it to the feed's write function, which applies Write's rules;
// an UPDATE hands, as tombstones, the keys of old rows no new row has, and
// the new rows' documents where they changed, so a key that changed leaves
// a tombstone, a key that stayed has its new document, and a row whose
// document stayed writes nothing. Keys are distinct in each part and the
// tombstones' keys are none of the documents', so the set has each key
// once, as the write function needs. TRUNCATE moves the feed to a new
// generation.
//
// A partitioned table gets the same INSERT, UPDATE and DELETE triggers on
// itself and on every partition under it: a statement fires the statement
// triggers of the table it names only, and its transition tables hold the
// rows it changed in every partition under that one, so each write is seen
// once, whichever table it names. An UPDATE through a parent that moves a
// row to another partition is in its transition tables as the old and the
// new row, and since every unique index of a partitioned table includes
// the partition key, so does the capture's key: the old key is tombstoned.
// (One that names the partition is refused by PostgreSQL.) A TRUNCATE of
// the partitioned table resets the feed as a plain table's does; one of a
// partition, which fires its own TRUNCATE triggers and those of the
// partitions under it, tombstones each partition's rows from a BEFORE
// TRUNCATE trigger, as only it can still read them. A TRUNCATE of the
// partitioned table fires its partitions' triggers too, first its own
// BEFORE trigger, then theirs, then its AFTER trigger: the first records
// the partitions' OIDs in a transaction-local setting, under which their
// triggers write nothing (the reset empties the feed anyway), and the last
// clears it, so that a later TRUNCATE of a partition in the same
// transaction tombstones again. A plain table's SQL has none of these parts.
func (s *Store) captureDDL(c *capture) string {
	feedLit, chanLit := quoteLiteral(string(c.spec.Feed)), quoteLiteral(s.names.channel)
	// Keys are compared as the feed compares them, byte by byte: under the
	// column's own equality 1.0 = 1.00 (numeric) or 'A' = 'a' (citext), and
	// a key whose text changed must still leave a tombstone.
	keyC := "(" + c.keyExpr + `) COLLATE pg_catalog."C"`
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
	// key (each is tested IS TRUE, not joined on): joined on them, the
	// planner sorted both sides by the whole row or document, on disk at
	// 10k rows, where a hash join on the key and a filter cost a fraction.
	// A trimmed document is never NULL, so its = is IS NOT DISTINCT FROM.
	newRec, oldCmp, unchanged := ", r AS rec", "r AS rec", "(o.rec "+op("*=")+" n.rec) IS TRUE"
	if c.spec.Document == "" && c.docExpr != rowDoc {
		newRec, oldCmp, unchanged = "", c.docExpr+" AS doc", "(o.doc::pg_catalog.text "+op("=")+" n.doc::pg_catalog.text) IS TRUE"
	}
	write, reset := s.names.table("write"), s.names.table("reset")
	truncate := fmt.Sprintf(`    ELSE
        PERFORM %s(%s, %s, %d);
        RETURN NULL;
    END IF;
`, reset, feedLit, chanLit, s.writeKey(c.spec.Feed))
	if c.partitioned {
		skip := quoteLiteral(c.skip)
		// The partition's rows are read through a statement of its own
		// name, ONLY, so a sub-partitioned table, whose partitions have
		// triggers of their own, reads none. The name is regclass's text,
		// which leaves out the schema only when the search_path in force
		// finds this very table by the bare name, and the statement is
		// parsed under the same path.
		rowsOf := quoteLiteral("SELECT pg_catalog.array_agg(" + keyC + "), pg_catalog.array_agg(NULL::pg_catalog.jsonb) FROM ONLY ")
		truncate = fmt.Sprintf(`    ELSIF TG_NAME OPERATOR(pg_catalog.=) %[1]s THEN
        PERFORM pg_catalog.set_config(%[2]s, coalesce(',' OPERATOR(pg_catalog.||) (SELECT pg_catalog.string_agg(t.relid::pg_catalog.oid::pg_catalog.text, ',')
            FROM pg_catalog.pg_partition_tree(TG_RELID::pg_catalog.regclass) AS t WHERE t.level OPERATOR(pg_catalog.>) 0) OPERATOR(pg_catalog.||) ',', ''), true);
        RETURN NULL;
    ELSIF TG_WHEN OPERATOR(pg_catalog.=) 'AFTER' THEN
        PERFORM pg_catalog.set_config(%[2]s, '', true);
        PERFORM %[3]s(%[4]s, %[5]s, %[6]d);
        RETURN NULL;
    ELSIF pg_catalog.strpos(coalesce(pg_catalog.current_setting(%[2]s, true), ''), ',' OPERATOR(pg_catalog.||) TG_RELID::pg_catalog.text OPERATOR(pg_catalog.||) ',') OPERATOR(pg_catalog.>) 0 THEN
        RETURN NULL;
    ELSE
        EXECUTE %[7]s OPERATOR(pg_catalog.||) TG_RELID::pg_catalog.regclass::pg_catalog.text OPERATOR(pg_catalog.||) ' AS r' INTO k, d;
    END IF;
`, quoteLiteral(c.before), skip, reset, feedLit, chanLit, s.writeKey(c.spec.Feed), rowsOf)
	}
	// A keyed capture (no document expression) records, in the concurrent
	// mode, only the statement's keys: the new rows' and, of an UPDATE, the
	// old keys no new row has (a key changed). The sealer reads each key's
	// document through the document function below when it seals it. In
	// the locked mode record returns false and the trigger goes on to write
	// the change set with its documents, as a capture with a document
	// expression always does.
	//
	// The keys come first, each event in one branch, and an empty set ends
	// the call: every statement fires the trigger, and what a single-row
	// write pays for it is mostly PL/pgSQL's price per statement and per
	// expression, each of which is set up again in every transaction. An
	// INSERT … ON CONFLICT DO UPDATE fires the UPDATE statement trigger
	// whether or not it updated a row, so every upsert that only inserted
	// reaches it with empty transition tables; the UPDATE branch probes for
	// a new row before it starts its key query, whose plan costs more to
	// start than the probe's.
	//
	// The common case is then written out here rather than left to record:
	// the feed's write lock shared, then, in a statement of its own (so
	// with a snapshot taken after the lock), the keys inserted into the
	// changes table if the feed is in the concurrent mode, the transaction
	// in READ COMMITTED, and no key can be one the feed refuses (none is
	// NULL or empty, and all of them together fit in one key's 512 bytes).
	// In exactly those cases record would insert the same row and do
	// nothing else; calling it, with its own statements and expressions,
	// cost about a tenth of the instructions the trigger adds to a
	// single-row write. Any other case inserts nothing here. In the locked
	// mode the trigger goes on to write the documents, record's answer
	// there, without calling it: a subquery reads the mode as record's
	// insert would, after the lock (under which no switch can commit) and,
	// in the other isolation levels, in the transaction's snapshot.
	// Otherwise it goes on to record, which takes the lock again (a lock
	// the transaction holds does not block it), checks the snapshot in the
	// other isolation levels and refuses a bad key. The lock is taken in
	// the CASE that ends the call when there are no keys, so it costs no
	// statement of its own (it returns void, which is not NULL). Both CASEs
	// keep a TRUNCATE, which has no keys (k is NULL), from the lock and
	// from record: record would report the concurrent mode, and the reset
	// below would be skipped; a CASE, unlike OR, runs its branches in the
	// order written. (Each is in parentheses because PL/pgSQL ends an IF's
	// condition at the first THEN outside them.) The insert's test of
	// cardinality keeps a TRUNCATE's NULL out of the changes table.
	noNewRows := `        IF NOT EXISTS (SELECT FROM kairos_new) THEN
            RETURN NULL;
        END IF;
`
	keyed := ""
	if c.keyed {
		keyed = fmt.Sprintf(`    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        k := ARRAY(SELECT %[1]s FROM kairos_new AS r);
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
%[5]s        k := ARRAY(SELECT %[1]s FROM kairos_new AS r
            UNION ALL
            SELECT o.key FROM (SELECT %[1]s AS key FROM kairos_old AS r) AS o
            WHERE NOT EXISTS (SELECT FROM kairos_new AS r WHERE %[1]s OPERATOR(pg_catalog.=) o.key));
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        k := ARRAY(SELECT %[1]s FROM kairos_old AS r);
    END IF;
    IF (CASE WHEN k IS NULL THEN false WHEN pg_catalog.cardinality(k) OPERATOR(pg_catalog.=) 0 THEN true
        ELSE pg_catalog.pg_advisory_xact_lock_shared(%[4]d) IS NULL END) THEN
        RETURN NULL;
    END IF;
    INSERT INTO %[6]s (feed, n, keys)
    SELECT %[3]s, pg_catalog.cardinality(k), k FROM %[7]s AS g
    WHERE g.feed OPERATOR(pg_catalog.=) %[3]s AND g.write_mode OPERATOR(pg_catalog.=) 'concurrent'
        AND pg_catalog.cardinality(k) OPERATOR(pg_catalog.>) 0
        AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) ANY (ARRAY['read committed', 'read uncommitted'])
        AND pg_catalog.array_position(k, NULL) IS NULL AND pg_catalog.array_position(k, ''::pg_catalog.text) IS NULL
        AND pg_catalog.octet_length(pg_catalog.array_to_string(k, '')) OPERATOR(pg_catalog.<=) 512;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    IF (CASE WHEN k IS NULL THEN false
        WHEN NOT EXISTS (SELECT FROM %[7]s AS g WHERE g.feed OPERATOR(pg_catalog.=) %[3]s AND g.write_mode OPERATOR(pg_catalog.=) 'concurrent') THEN false
        ELSE %[2]s(%[3]s, k, %[4]d) END) THEN
        RETURN NULL;
    END IF;
`, keyC, s.names.table("record"), feedLit, s.writeKey(c.spec.Feed), noNewRows, s.names.table("changes"), s.names.table("generations"))
	}
	// A capture with a document expression probes the same way before its
	// document queries, which would otherwise start for nothing (the probe
	// saved about 4 µs of the 30 the trigger added to a single-row upsert
	// that inserted). Each probe is a statement of its own: in one
	// expression with the test of TG_OP, it would be planned for a DELETE,
	// which has no new rows to name. A keyed capture reaches the document
	// queries only with keys, or for a TRUNCATE.
	probe := ""
	if !c.keyed {
		probe = "    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN\n" + noNewRows + "    END IF;\n"
	}
	// The function runs as its owner, the role that ran Capture, so that
	// the table's writers need no right on the feed's schema, tables or
	// functions. That lends a writer nothing it could turn elsewhere:
	// PostgreSQL calls a trigger function only as a trigger, so all a
	// writer can make it do is write the change its own statement made to
	// the table into the one feed its body names; the document expression
	// in the body is SQL of the owner's own; and no object a writer
	// creates can stand in for one the body names. The owner could create
	// triggers on the table, and writes the feed anyway. Firing a trigger
	// checks no EXECUTE right (CREATE TRIGGER checks its creator's), so
	// EXECUTE is revoked from PUBLIC at no cost to the writers.
	//
	// A function runs under its caller's search_path unless it pins its
	// own, and a writer chooses its path: it may put a schema of its own
	// ahead of pg_catalog, and pg_temp, where it may create types and
	// tables, comes first unless the path places it. A keyed trigger
	// names every type, function, operator and collation of its body with
	// its schema (the ones PostgreSQL's grammar resolves itself, such as
	// integer, coalesce or IS NULL, aside; a transition table comes before
	// any table of the same name), and the functions it calls pin their
	// own path (migration 13), so it runs under the writer's path, which
	// saves the 12,000 instructions a pinned path costs each call, twice
	// for every upsert. A capture with a document expression pins the
	// path to pg_catalog, then pg_temp, as the expression was checked
	// under it: the expression is the user's SQL, whose names Kairos does
	// not qualify.
	pin := ""
	if !c.keyed {
		pin = " SET search_path = pg_catalog, pg_temp"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `-- Kairos capture of table %[1]s into feed %[2]s.
CREATE OR REPLACE FUNCTION %[3]s() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER%[16]s AS $kairos$
DECLARE
    k pg_catalog.text[];
    d pg_catalog.jsonb[];
BEGIN
%[14]s%[15]s    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        SELECT pg_catalog.array_agg(%[4]s), pg_catalog.array_agg(%[5]s) INTO k, d FROM kairos_new AS r;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        SELECT pg_catalog.array_agg(c.key), pg_catalog.array_agg(c.doc) INTO k, d FROM (
            SELECT o.key, NULL::pg_catalog.jsonb AS doc FROM (SELECT %[4]s AS key FROM kairos_old AS r) AS o
            WHERE NOT EXISTS (SELECT FROM kairos_new AS r WHERE %[4]s OPERATOR(pg_catalog.=) o.key)
            UNION ALL
            SELECT n.key, n.doc FROM (SELECT %[4]s AS key, %[5]s AS doc%[8]s FROM kairos_new AS r) AS n
            WHERE NOT EXISTS (SELECT FROM (SELECT %[4]s AS key, %[9]s FROM kairos_old AS r) AS o
                WHERE o.key OPERATOR(pg_catalog.=) n.key AND %[10]s)
        ) AS c;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        SELECT pg_catalog.array_agg(%[4]s), pg_catalog.array_agg(NULL::pg_catalog.jsonb) INTO k, d FROM kairos_old AS r;
%[11]s    PERFORM %[6]s(%[7]s, k, d, %[12]s, %[13]d);
    RETURN NULL;
END
$kairos$;
REVOKE ALL ON FUNCTION %[3]s() FROM PUBLIC;
`, c.table, c.spec.Feed, c.fn, keyC, c.docExpr, write, feedLit, newRec, oldCmp, unchanged, truncate, chanLit, s.writeKey(c.spec.Feed), keyed, probe, pin)
	{
		// The document of each recorded key, as the table has it in the
		// caller's snapshot: the row found by the key's columns (the key
		// text cast back to each column's type, which the unique index
		// behind the key makes one row at most), kept only when its key
		// text is the recorded one byte for byte (numeric 1.0 is 1.00 by
		// equality but not by key); no row, a NULL document, is a
		// tombstone. It runs as its owner (the role that ran Capture, who
		// could create triggers on the table), so the sealer reads every
		// row whatever its own role may see; nobody else may call it.
		// Every capture has one, a capture with a document expression too,
		// whose trigger records no keys: keys a keyed spec recorded before
		// Capture replaced it are then sealed by the spec now installed
		// (a JSON null from the expression, which a writer's statement
		// would have refused, is sealed as a tombstone).
		docExpr := c.docExpr
		if !c.keyed {
			docExpr = "nullif(" + docExpr + ", 'null'::jsonb)"
		}
		var where []string
		for i, col := range c.key {
			part := "u.k"
			if len(c.key) > 1 {
				part = fmt.Sprintf("replace(replace(split_part(u.k, '/', %d), '%%2F', '/'), '%%25', '%%')", i+1)
			}
			where = append(where, fmt.Sprintf("r.%s = (%s)::%s", quoteIdent(col.name), part, col.cast))
		}
		// PL/pgSQL, not SQL, so the query's plan is kept from one round to
		// the next (a SQL function that cannot be inlined is planned at
		// every call); the result columns are named so that no column of
		// the table, which the document expression may name, is taken for
		// them.
		fmt.Fprintf(&b, `CREATE OR REPLACE FUNCTION %[1]s(keys text[]) RETURNS TABLE (kairos_key text, kairos_doc jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $kairos$
#variable_conflict use_column
BEGIN
    RETURN QUERY SELECT u.k, (SELECT %[2]s FROM %[3]s AS r WHERE %[4]s AND %[5]s = u.k)
    FROM unnest(keys) AS u(k);
END
$kairos$;
REVOKE ALL ON FUNCTION %[1]s(text[]) FROM PUBLIC;
`, c.docs, docExpr, c.table, strings.Join(where, " AND "), keyC)
	}
	refs := []string{
		"AFTER INSERT ON %s REFERENCING NEW TABLE AS kairos_new",
		"AFTER UPDATE ON %s REFERENCING OLD TABLE AS kairos_old NEW TABLE AS kairos_new",
		"AFTER DELETE ON %s REFERENCING OLD TABLE AS kairos_old",
		"AFTER TRUNCATE ON %s",
	}
	install := func(table string, refs []string) {
		for i, t := range c.triggers {
			fmt.Fprintf(&b, "DROP TRIGGER IF EXISTS %s ON %s;\n", quoteIdent(t), table)
			fmt.Fprintf(&b, "CREATE TRIGGER %s "+refs[i]+" FOR EACH STATEMENT EXECUTE FUNCTION %s();\n", quoteIdent(t), table, c.fn)
		}
	}
	install(c.table, refs)
	if c.partitioned {
		fmt.Fprintf(&b, "DROP TRIGGER IF EXISTS %s ON %s;\n", quoteIdent(c.before), c.table)
		fmt.Fprintf(&b, "CREATE TRIGGER %s BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s();\n", quoteIdent(c.before), c.table, c.fn)
		partRefs := slices.Clone(refs)
		partRefs[3] = "BEFORE TRUNCATE ON %s"
		for _, p := range c.parts {
			install(p, partRefs)
		}
	}
	return b.String()
}

// installSQL is the whole capture script: the capture lock, the removal of
// triggers the capture no longer needs, the DDL and the registry row.
func (s *Store) installSQL(c *capture) (string, error) {
	spec, err := json.Marshal(c.spec)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n%s%sINSERT INTO %s AS c (feed, table_schema, table_name, spec, version)\nVALUES (%s, %s, %s, %s::jsonb, %s)\nON CONFLICT (feed) DO UPDATE SET table_schema = excluded.table_schema, table_name = excluded.table_name,\n    spec = excluded.spec, version = excluded.version, installed_at = clock_timestamp();\n",
		s.names.captureLockKey(), c.stale, c.ddl, s.names.table("captures"),
		quoteLiteral(string(c.spec.Feed)), quoteLiteral(c.spec.Schema), quoteLiteral(c.spec.Table), quoteLiteral(string(spec)), quoteLiteral(c.version)), nil
}

// CaptureSQL returns the SQL Capture would run for spec, resolved against
// the database's catalog as it is now, for review or a migration tool of
// the team's own: one script that takes the capture lock, drops the
// capture's triggers from tables it no longer covers, creates the trigger
// function and the triggers (on a partitioned table, on every partition as
// it is now: run it again, or Capture, after adding one), and records the
// capture. Run it in one transaction. It changes nothing itself.
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
		// A partition attached while the catalog was read, before the
		// install locked its parent, is found by the next round, which
		// installs again under those locks.
		for round := 0; ; round++ {
			c, err := s.resolveCapture(ctx, tx, spec)
			if err != nil {
				return err
			}
			var version string
			err = tx.QueryRow(ctx, `SELECT coalesce((SELECT version FROM `+s.names.table("captures")+` WHERE feed = $1::text), '')`,
				string(c.spec.Feed)).Scan(&version)
			if err != nil {
				return feed.Unreadable("reading the captures of feed "+string(c.spec.Feed), err)
			}
			changed := info.Changed
			info = CaptureInfo{Feed: c.spec.Feed, Schema: c.spec.Schema, Table: c.spec.Table, Version: c.version, Changed: changed}
			for _, k := range c.key {
				info.Key = append(info.Key, k.name)
			}
			if version == c.version && len(c.uncovered) == 0 && c.stale == "" {
				return nil
			}
			if round == 2 {
				info.Uncovered, info.Stray = c.uncovered, c.stray
				return feed.WriteFailed("installing the capture of table "+c.table+" into feed "+string(c.spec.Feed),
					fmt.Errorf("its partitions kept changing while it was installed (uncovered: %q, stray: %q); run Capture again", c.uncovered, c.stray))
			}
			script, err := s.installSQL(c)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
				return feed.WriteFailed("installing the capture of table "+c.table+" into feed "+string(c.spec.Feed), err)
			}
			info.Changed = true
		}
	})
	if err != nil {
		return CaptureInfo{}, err
	}
	return info, nil
}

// Uncapture removes f's capture: its triggers, its functions, its registry
// row and its backfill's progress. The feed's rows stay. Changes the
// capture recorded by key and the sealer has not sealed yet (see the
// package doc's # Keyed capture) are sealed first, in the same
// transaction, so every write that committed before the removal reaches
// the feed. It says whether there was a capture; removing none is not an
// error. It serialises with Capture on the same lock.
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
		fmt.Fprintf(&b, "DROP FUNCTION IF EXISTS %s();\nDELETE FROM %s WHERE feed = %s;\nDELETE FROM %s WHERE feed = %s;\n", fn, s.names.table("backfills"), quoteLiteral(string(f)), s.names.table("backfill_shares"), quoteLiteral(string(f)))
		if _, err := tx.Exec(ctx, b.String(), pgx.QueryExecModeSimpleProtocol); err != nil {
			return feed.WriteFailed("removing the capture of feed "+string(f), err)
		}
		// The triggers are gone, and dropping them waited for every writer
		// of the tables that had begun; the write lock exclusive, taken
		// after the tables' locks as a writer takes them, waits for a
		// backfill's batch, and a later batch finds no capture
		// (backfill.go). What is recorded now is all there will
		// be: seal it while the document function is still there.
		if _, err := tx.Exec(ctx, s.sql.excludeWrite, s.writeKey(f)); err != nil {
			return feed.WriteFailed("removing the capture of feed "+string(f), err)
		}
		for {
			var recorded bool
			if err := tx.QueryRow(ctx, s.sql.recorded, string(f), int64(0)).Scan(&recorded); err != nil {
				return feed.WriteFailed("removing the capture of feed "+string(f), err)
			}
			if !recorded {
				break
			}
			if _, _, err := s.sealIn(ctx, tx, f, int64(feed.MaxBatchLimit), 0); err != nil {
				return feed.WriteFailed("sealing the changes feed "+string(f)+" recorded before its capture is removed", err)
			}
		}
		if _, err := tx.Exec(ctx, "DROP FUNCTION IF EXISTS "+s.names.captureDocsName(f)+"(text[])", pgx.QueryExecModeSimpleProtocol); err != nil {
			return feed.WriteFailed("removing the capture of feed "+string(f), err)
		}
		return nil
	})
	return found, err
}

// Captures lists the installed captures, by feed, each with its spec and
// its last backfill. Key is the spec's as given: empty for a capture keyed
// on the primary key. Changed is false.
// Uncovered and Stray are the gaps in each capture's triggers as they are
// now: partitions created or attached since its Capture, triggers disabled
// or dropped, tables detached that still carry them (a captured table that
// no longer exists is uncovered). Any gap means the feed misses or gains
// writes; Capture closes it.
func (s *Store) Captures(ctx context.Context) ([]CaptureInfo, error) {
	rows, err := s.db.Query(ctx, `SELECT c.feed, c.table_schema, c.table_name, c.spec, c.version,
	CASE WHEN b.finished_at IS NULL AND sh.rows IS NOT NULL THEN sh.rows ELSE b.rows END,
	b.started_at, greatest(b.updated_at, CASE WHEN b.finished_at IS NULL THEN sh.updated END), b.finished_at, b.version = c.version
FROM `+s.names.table("captures")+` AS c LEFT JOIN `+s.names.table("backfills")+` AS b ON b.feed = c.feed
LEFT JOIN LATERAL (SELECT sum(x.rows)::bigint AS rows, max(x.updated_at) AS updated FROM `+s.names.table("backfill_shares")+` AS x WHERE x.feed = c.feed) AS sh ON true
ORDER BY c.feed`)
	if err != nil {
		return nil, feed.Unreadable("reading the captures", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CaptureInfo, error) {
		var ci CaptureInfo
		var rows *int64
		var started, updated, finished *time.Time
		var current *bool
		err := r.Scan(&ci.Feed, &ci.Schema, &ci.Table, &ci.Spec, &ci.Version, &rows, &started, &updated, &finished, &current)
		ci.Key = ci.Spec.Key
		if rows != nil && started != nil && updated != nil && current != nil {
			ci.Backfill = &BackfillState{Rows: *rows, Started: *started, Updated: *updated, Current: *current}
			if finished != nil {
				ci.Backfill.Finished = *finished
			}
		}
		return ci, err
	})
	if err != nil {
		return nil, feed.Unreadable("reading the captures", err)
	}
	for i, ci := range list {
		st, err := s.captureState(ctx, s.db, ci.Feed, nil, ci.Schema, ci.Table)
		if err != nil {
			return nil, err
		}
		list[i].Uncovered, list[i].Stray = st.uncovered, st.strayTables
	}
	return list, nil
}

// relkindName says what a pg_class relkind other than a table is.
func relkindName(kind string) string {
	switch kind {
	case "v":
		return "a view"
	case "m":
		return "a materialized view"
	case "f":
		return "a foreign table"
	case "i", "I":
		return "an index"
	case "S":
		return "a sequence"
	case "c":
		return "a composite type"
	case "t":
		return "a TOAST table"
	}
	return "relkind " + kind
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
