package pgtable

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kairos-es/kairos/feed"
)

// DB is what the sink needs of the target database: a *pgxpool.Pool, usually
// one of its own (the target is rarely the feed's database). It must be safe
// for concurrent use.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// MaxDocumentBytes is the largest document the sink stores: 0, no limit of its
// own. Every document a feed hands out fits jsonb already (feed.ValidateDocument
// refuses the others when they are written), so none reaches the table too
// large.
const MaxDocumentBytes = 0

// The shadow table of a resync is the live table's name, shadowInfix and 8 hex
// digits; the table a publish moves the old copy to, oldInfix and 8 hex digits.
const (
	shadowInfix     = "_resync_"
	oldInfix        = "_old_"
	shadowSuffixLen = len(shadowInfix) + 8
)

// floorComment is the table comment that records a copy's floor (see the
// package doc), the seq written after it in decimal; floorPattern reads it
// back in SQL, anything else reading as no floor.
const (
	floorComment = "kairos-pgtable floor "
	floorPattern = "^kairos-pgtable floor ([0-9]+)$"
)

// Sink mirrors a feed into one PostgreSQL table; the package doc states what it
// guarantees. It is safe for concurrent use.
type Sink struct {
	db    DB
	o     resolved
	table string // quoted schema.table
	sql   string // the upsert into table
}

var _ feed.Sink = (*Sink)(nil)

// New returns a sink writing to the table opts names through db, having
// checked that the database answers and that the table has the columns opts
// expects (creating it first when opts.Create says so). Invalid options are an
// *feed.InvalidError naming the field; a table of the wrong shape is one too,
// naming the option it contradicts.
func New(ctx context.Context, db DB, opts Options) (*Sink, error) {
	o, err := opts.validate()
	if err != nil {
		return nil, err
	}
	if db == nil {
		return nil, feed.Invalid("db", "must not be nil")
	}
	s := &Sink{db: db, o: o, table: qualify(o.Schema, o.Table)}
	s.sql = s.upsertSQL(s.table)
	if _, err := db.Exec(ctx, "SELECT 1"); err != nil {
		return nil, fmt.Errorf("pgtable: reaching the target database: %w", err)
	}
	if o.Create {
		if err := s.create(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.checkShape(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Table returns the target table's schema-qualified, quoted name, as SQL can
// use it.
func (s *Sink) Table() string { return s.table }

// Close releases nothing: the pool belongs to the caller, who closes it. It is
// there so that every sink reads the same way.
func (s *Sink) Close() {}

func quote(id string) string { return `"` + id + `"` } // identifiers are validated: no quote inside

func qualify(schema, table string) string { return quote(schema) + "." + quote(table) }

// sqlType is a column type as SQL spells it in a cast and a CREATE TABLE.
func sqlType(t string) string {
	if t == TypeTimestamptz {
		return "timestamptz"
	}
	return t
}

// upsertSQL is the one statement of every Apply into table: the batch as
// arrays, whose text does not depend on the batch's size, upserted under the
// seq guard and the table's floor. A tombstone is a row with a NULL document
// (see the package doc), so puts and deletes go through the same guard in the
// same statement. The floor is read from the comment of the table the name
// resolves to when the statement runs: the INSERT then holds a lock on that
// same table, which a publish's rename waits for, so the floor read is always
// the written table's.
func (s *Sink) upsertSQL(table string) string {
	o := s.o
	cols := []string{quote(o.KeyColumn), quote(o.SeqColumn), quote(o.DocColumn)}
	sel := []string{"u.k", "u.s", "u.d::jsonb"}
	arrays := []string{"$1::text[]", "$2::bigint[]", "$3::text[]"}
	aliases := []string{"k", "s", "d"}
	for i, c := range o.Columns {
		cols = append(cols, quote(c.Name))
		a := fmt.Sprintf("c%d", i)
		aliases = append(aliases, a)
		arrays = append(arrays, fmt.Sprintf("$%d::text[]", i+4))
		if c.Type == TypeText {
			sel = append(sel, "u."+a)
		} else {
			sel = append(sel, "u."+a+"::"+sqlType(c.Type))
		}
	}
	set := make([]string, 0, len(cols)-1)
	for _, c := range cols[1:] {
		set = append(set, c+" = excluded."+c)
	}
	floor := fmt.Sprintf(`coalesce((SELECT substring(obj_description(to_regclass('%s'), 'pg_class') FROM '%s')::bigint), 0)`, table, floorPattern)
	return fmt.Sprintf(`INSERT INTO %s AS t (%s) SELECT %s FROM unnest(%s) AS u(%s) WHERE u.s >= %s ON CONFLICT (%s) DO UPDATE SET %s WHERE t.%s < excluded.%s`,
		table, strings.Join(cols, ", "), strings.Join(sel, ", "), strings.Join(arrays, ", "), strings.Join(aliases, ", "), floor,
		quote(o.KeyColumn), strings.Join(set, ", "), quote(o.SeqColumn), quote(o.SeqColumn))
}

func (s *Sink) create(ctx context.Context) error {
	o := s.o
	defs := []string{
		quote(o.KeyColumn) + " text PRIMARY KEY",
		quote(o.SeqColumn) + " bigint NOT NULL",
		quote(o.DocColumn) + " jsonb",
	}
	for _, c := range o.Columns {
		defs = append(defs, quote(c.Name)+" "+sqlType(c.Type))
	}
	if _, err := s.db.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+quote(o.Schema)); err != nil && !isCode(err, "42P06", "23505") {
		return fmt.Errorf("pgtable: creating schema %s: %w", quote(o.Schema), err)
	}
	if _, err := s.db.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+s.table+" ("+strings.Join(defs, ", ")+")"); err != nil && !isCode(err, "42P07", "23505") {
		return fmt.Errorf("pgtable: creating table %s: %w", s.table, err)
	}
	return nil
}

// checkShape refuses a table without the columns the sink writes, of the
// types it casts to, or without a unique index on the key alone (ON CONFLICT
// needs one).
func (s *Sink) checkShape(ctx context.Context) error {
	o := s.o
	rows, err := s.db.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, s.table)
	if err != nil {
		return fmt.Errorf("pgtable: reading the columns of %s: %w", s.table, err)
	}
	have := map[string]string{}
	for rows.Next() {
		var n, t string
		if err := rows.Scan(&n, &t); err != nil {
			rows.Close()
			return fmt.Errorf("pgtable: reading the columns of %s: %w", s.table, err)
		}
		have[n] = t
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgtable: reading the columns of %s: %w", s.table, err)
	}
	if len(have) == 0 {
		return feed.Invalid("pgtable.table", "%s does not exist; create it, or set create to have the sink create it", s.table)
	}
	want := func(field, col, typ string) error {
		got, ok := have[col]
		switch {
		case !ok:
			return feed.Invalid(field, "%s has no column %q", s.table, col)
		case typ == TypeText && (got == "text" || strings.HasPrefix(got, "character varying")),
			typ == TypeNumeric && strings.HasPrefix(got, "numeric"),
			typ == TypeTimestamptz && got == "timestamp with time zone",
			got == typ:
			return nil
		}
		return feed.Invalid(field, "column %q of %s is %s, not %s", col, s.table, got, typ)
	}
	if err := want("pgtable.key_column", o.KeyColumn, TypeText); err != nil {
		return err
	}
	if err := want("pgtable.seq_column", o.SeqColumn, TypeBigint); err != nil {
		return err
	}
	if err := want("pgtable.doc_column", o.DocColumn, TypeJSONB); err != nil {
		return err
	}
	for i, c := range o.Columns {
		if err := want(fmt.Sprintf("pgtable.columns[%d].type", i), c.Name, c.Type); err != nil {
			return err
		}
	}
	var unique bool
	err = s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)`,
		s.table, o.KeyColumn).Scan(&unique)
	if err != nil {
		return fmt.Errorf("pgtable: reading the indexes of %s: %w", s.table, err)
	}
	if !unique {
		return feed.Invalid("pgtable.key_column", "%s has no primary key or unique index on %q alone, which the seq-guarded upsert needs", s.table, o.KeyColumn)
	}
	return nil
}

// Apply upserts the batch into the live table in one statement; see the
// package doc for what is a rejection and what an error.
func (s *Sink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	return s.apply(ctx, s.table, s.sql, records)
}

// batch is a batch as the upsert's arrays.
type batch struct {
	keys []string
	seqs []int64
	docs []pgtype.Text
	cols [][]pgtype.Text
}

func (b *batch) args() []any {
	a := make([]any, 0, 3+len(b.cols))
	a = append(a, b.keys, b.seqs, b.docs)
	for _, c := range b.cols {
		a = append(a, c)
	}
	return a
}

func (s *Sink) apply(ctx context.Context, table, sql string, records []feed.Record) ([]feed.Rejection, error) {
	if len(records) == 0 {
		return nil, nil
	}
	var rej []feed.Rejection
	b := batch{
		keys: make([]string, 0, len(records)),
		seqs: make([]int64, 0, len(records)),
		docs: make([]pgtype.Text, 0, len(records)),
		cols: make([][]pgtype.Text, len(s.o.Columns)),
	}
	for i := range b.cols {
		b.cols[i] = make([]pgtype.Text, 0, len(records))
	}
	kept := make([]feed.Record, 0, len(records))
	vals := make([]pgtype.Text, len(s.o.Columns))
next:
	for _, r := range records {
		clear(vals)
		if !r.Deleted() && len(s.o.Columns) > 0 {
			// Conversions are checked here, so that a document a column
			// cannot hold is rejected alone and the batch stays one statement.
			v, err := decode(r.Doc)
			if err != nil {
				rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: err.Error()})
				continue
			}
			for i, c := range s.o.Columns {
				x := lookup(v, s.o.paths[i])
				if x == nil {
					continue
				}
				t, ok, err := convert(x, c.Type)
				if err != nil {
					rej = append(rej, feed.Rejection{Key: r.Key, Seq: r.Seq,
						Reason: fmt.Sprintf("column %q (%s) at %s: %v", c.Name, c.Type, c.Path, err)})
					continue next
				}
				vals[i] = pgtype.Text{String: t, Valid: ok}
			}
		}
		kept = append(kept, r)
		b.keys = append(b.keys, string(r.Key))
		b.seqs = append(b.seqs, int64(r.Seq))
		b.docs = append(b.docs, pgtype.Text{String: string(r.Doc), Valid: !r.Deleted()})
		for i := range b.cols {
			b.cols[i] = append(b.cols[i], vals[i])
		}
	}
	if len(kept) == 0 {
		return rej, nil
	}
	_, err := s.db.Exec(ctx, sql, b.args()...)
	if err == nil {
		return rej, nil
	}
	if !rowFault(err) {
		return nil, fmt.Errorf("pgtable: applying %d records to %s: %w", len(kept), table, err)
	}
	if len(kept) == 1 {
		return append(rej, rowRejection(kept[0], err)), nil
	}
	// One row broke what the client could not check (a constraint of the
	// user's, a value PostgreSQL's cast refuses): find it row by row, with the
	// same statement, and apply the rest.
	for i, r := range kept {
		one := batch{keys: b.keys[i : i+1], seqs: b.seqs[i : i+1], docs: b.docs[i : i+1], cols: make([][]pgtype.Text, len(b.cols))}
		for j := range b.cols {
			one.cols[j] = b.cols[j][i : i+1]
		}
		if _, err := s.db.Exec(ctx, sql, one.args()...); err != nil {
			if !rowFault(err) {
				return nil, fmt.Errorf("pgtable: applying record %q to %s: %w", r.Key, table, err)
			}
			rej = append(rej, rowRejection(r, err))
		}
	}
	return rej, nil
}

// rowFault reports whether err is PostgreSQL refusing a row's values (a data
// exception, an integrity constraint, an index row too large), which is the
// record's rejection, rather than a fault of the database, which is an error
// and retried: connections, timeouts, serialization failures and the rest.
func rowFault(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23") || pe.Code == "54000"
}

func rowRejection(r feed.Record, err error) feed.Rejection {
	var pe *pgconn.PgError
	errors.As(err, &pe)
	reason := fmt.Sprintf("PostgreSQL refused the row: %s (SQLSTATE %s)", pe.Message, pe.Code)
	if pe.ColumnName != "" {
		reason = fmt.Sprintf("column %q: %s", pe.ColumnName, reason)
	}
	return feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: reason}
}

func isCode(err error, codes ...string) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	for _, c := range codes {
		if pe.Code == c {
			return true
		}
	}
	return false
}

// OpenResync drops the shadow tables earlier resyncs left (a crash, or a
// resync of a worker that has since lost its lease) and creates a fresh one
// LIKE the live table, indexes, defaults and constraints included, in one
// transaction. The target it returns is a *Resync.
func (s *Sink) OpenResync(ctx context.Context, generation feed.Generation) (feed.ResyncTarget, error) {
	if generation < 1 {
		return nil, feed.Invalid("generation", "is %d; it must be 1 or more", generation)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	r := &Resync{s: s, name: s.o.Table + shadowInfix + hex.EncodeToString(b[:])}
	r.table = qualify(s.o.Schema, r.name)
	r.sql = s.upsertSQL(r.table)
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND starts_with(c.relname::text, $2)`, s.o.Schema, s.o.Table+shadowInfix)
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, n := range names {
			if !shadowOf(s.o.Table, n) {
				continue
			}
			if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+qualify(s.o.Schema, n)); err != nil {
				return err
			}
		}
		if _, err = tx.Exec(ctx, "CREATE TABLE "+r.table+" (LIKE "+s.table+" INCLUDING ALL)"); err != nil {
			return err
		}
		return copyGrants(ctx, tx, s.table, r.table)
	})
	if err != nil {
		return nil, fmt.Errorf("pgtable: opening a resync of %s for generation %d: %w", s.table, generation, err)
	}
	return r, nil
}

// shadowOf reports whether name is a shadow table of table.
func shadowOf(table, name string) bool {
	rest, ok := strings.CutPrefix(name, table+shadowInfix)
	if !ok || len(rest) != 8 {
		return false
	}
	_, err := hex.DecodeString(rest)
	return err == nil && strings.ToLower(rest) == rest
}

// Resync is a shadow table being filled: the feed.ResyncTarget OpenResync
// returns.
type Resync struct {
	s       *Sink
	name    string // unquoted, in the sink's schema
	table   string // quoted and qualified
	sql     string
	floored bool // the shadow's comment holds its floor
	done    bool
}

var (
	_ feed.ResyncTarget = (*Resync)(nil)
	_ feed.FloorSetter  = (*Resync)(nil)
)

// Table returns the shadow table's schema-qualified, quoted name: where an
// operator looks at a resync in progress, or a test attaches a trigger.
func (r *Resync) Table() string { return r.table }

// Apply follows Sink.Apply, into the shadow table.
func (r *Resync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if r.done {
		return nil, fmt.Errorf("pgtable: resync of %s: Apply after Publish or Abort", r.s.table)
	}
	if !r.floored && len(records) > 0 {
		// The first batch's lowest seq is the copy's floor. It is recorded
		// before the batch is written, so no row of the copy is ever without
		// it; a batch retried after this statement has the same seqs.
		floor := records[0].Seq
		for _, rec := range records {
			floor = min(floor, rec.Seq)
		}
		if err := r.recordFloor(ctx, floor); err != nil {
			return nil, err
		}
	}
	return r.s.apply(ctx, r.table, r.sql, records)
}

// SetFloor records floor as the shadow's, for a copy that was sent no
// record; see feed.FloorSetter. Like a first batch's, it is the shadow's
// table comment, so the rename carries it onto the live table.
func (r *Resync) SetFloor(ctx context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	if r.done {
		return fmt.Errorf("pgtable: resync of %s: SetFloor after Publish or Abort", r.s.table)
	}
	return r.recordFloor(ctx, floor)
}

// recordFloor writes floor as the shadow's table comment.
func (r *Resync) recordFloor(ctx context.Context, floor feed.Seq) error {
	if _, err := r.s.db.Exec(ctx, "COMMENT ON TABLE "+r.table+" IS '"+floorComment+strconv.FormatInt(int64(floor), 10)+"'"); err != nil {
		return fmt.Errorf("pgtable: recording the floor of the resync of %s: %w", r.s.table, err)
	}
	r.floored = true
	return nil
}

// Publish renames the live table away and the shadow into its place, and
// drops the old copy, in one transaction: a reader sees the old table or the
// new one, never neither.
func (r *Resync) Publish(ctx context.Context) error {
	if r.done {
		return fmt.Errorf("pgtable: resync of %s: Publish after Publish or Abort", r.s.table)
	}
	s := r.s
	var b [4]byte
	_, _ = rand.Read(b[:])
	old := s.o.Table + oldInfix + hex.EncodeToString(b[:])
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		for _, q := range []string{
			"ALTER TABLE " + s.table + " RENAME TO " + quote(old),
			"ALTER TABLE " + r.table + " RENAME TO " + quote(s.o.Table),
			"DROP TABLE " + qualify(s.o.Schema, old),
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return renameIndexes(ctx, tx, s.o.Schema, s.table, r.name, s.o.Table)
	})
	if err != nil {
		return fmt.Errorf("pgtable: publishing the resync of %s: %w", s.table, err)
	}
	r.done = true
	return nil
}

// Abort drops the shadow table, and nothing else.
func (r *Resync) Abort(ctx context.Context) error {
	r.done = true
	if _, err := r.s.db.Exec(ctx, "DROP TABLE IF EXISTS "+r.table); err != nil {
		return fmt.Errorf("pgtable: aborting the resync of %s: %w", r.s.table, err)
	}
	return nil
}

// renameIndexes gives the indexes LIKE named after the shadow (and the
// constraints they back) the names they would have had on the live table,
// "orders_pkey" rather than "orders_resync_1a2b3c4d_pkey", now that the old
// copy's are gone, so that the table reads the same after every resync.
func renameIndexes(ctx context.Context, tx pgx.Tx, schema, table, from, to string) error {
	rows, err := tx.Query(ctx, `SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = to_regclass($1) AND starts_with(c.relname::text, $2)`, table, from)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := tx.Exec(ctx, "ALTER INDEX "+qualify(schema, n)+" RENAME TO "+quote(to+strings.TrimPrefix(n, from))); err != nil {
			return err
		}
	}
	return nil
}

// copyGrants grants on shadow what is granted on live, since LIKE copies no
// privileges: the roles that read the table keep reading it after a publish.
func copyGrants(ctx context.Context, tx pgx.Tx, live, shadow string) error {
	rows, err := tx.Query(ctx, `SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
			a.privilege_type, a.is_grantable
		FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = to_regclass($1) AND a.grantee <> c.relowner`, live)
	if err != nil {
		return err
	}
	type grant struct {
		to, what  string
		grantable bool
	}
	grants, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (grant, error) {
		var g grant
		err := row.Scan(&g.to, &g.what, &g.grantable)
		return g, err
	})
	if err != nil {
		return err
	}
	for _, g := range grants {
		q := "GRANT " + g.what + " ON " + shadow + " TO " + g.to
		if g.grantable {
			q += " WITH GRANT OPTION"
		}
		if _, err := tx.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}
