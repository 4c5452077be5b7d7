package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/kairos-es/kairos/feed"
)

// Sentinels of New's refusals of a table (see New).
var (
	// ErrNoTable: the table does not exist and Options.Create is off.
	ErrNoTable = errors.New("mysql: the table does not exist")
	// ErrTableShape: the table's columns or primary key are not the sink's.
	ErrTableShape = errors.New("mysql: the table does not have the sink's shape")
)

const (
	// suffixShadow and suffixRetired, followed by suffixRandLen hex digits,
	// name a resync's shadow table and the live copy it replaced.
	suffixShadow  = "__r"
	suffixRetired = "__o"
	suffixRandLen = 8
	// stmtRoom is what the statement text and packet headers of an upsert
	// take besides its rows, and rowRoom what each row adds besides its key
	// and document (its SELECT and placeholders, parameter types and length
	// prefixes), both with room to spare: together they decide how a batch
	// is split under max_allowed_packet.
	stmtRoom = 1024
	rowRoom  = 64
	// floorPrefix, followed by suffixRandLen hex digits, names the CHECK
	// constraint that holds a resync copy's floor (see the package doc).
	floorPrefix = "kairos_floor_"
	// floorRetries bounds how often one statement is sent again after its
	// table's floor refused it: more than once only when publishes follow
	// each other while it is sent.
	floorRetries = 4
)

// Sink mirrors a feed into one table of a MySQL or MariaDB database. The
// package doc says what it guarantees. It is safe for concurrent use.
type Sink struct {
	db       *sql.DB
	own      bool // Open opened db, and Close closes it
	opts     Options
	packet   int // the bytes one statement may take
	maxDoc   int // the largest document that fits a statement alone
	retireRe *regexp.Regexp

	mu     sync.Mutex
	floors map[string]feed.Seq // by table name: the highest floor seen there
}

// New returns a sink over db (its connections' default database holds the
// table), once the server answered and the table has the sink's shape:
// columns `key` VARBINARY, `seq` BIGINT, `doc` LONGTEXT or JSON that allows
// NULL, and a primary key on `key` alone. A missing table is created when
// opts.Create is set, and is ErrNoTable otherwise; a table of another shape is
// ErrTableShape. New also reads max_allowed_packet, which bounds each
// statement (see MaxDocumentBytes), and refuses a session whose sql_mode is
// not strict, where the server would cut a value too long for its column
// instead of refusing it. Close does not close db.
func New(ctx context.Context, db *sql.DB, opts Options) (*Sink, error) {
	if db == nil {
		return nil, feed.Invalid("mysql.db", "must not be nil")
	}
	return newSink(ctx, db, false, 0, opts)
}

// Open is New over a pool it opens from dsn, in the driver's form
// (user:password@tcp(host:3306)/database?param=value); Close closes it. A
// DSN that cannot be parsed is refused naming mysql.dsn, its password never
// repeated.
func Open(ctx context.Context, dsn string, opts Options) (*Sink, error) {
	if dsn == "" {
		return nil, feed.Invalid("mysql.dsn", "must not be empty")
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return nil, feed.Invalid("mysql.dsn", "cannot be parsed: %s", redact(err.Error(), dsn))
	}
	if cfg.DBName == "" {
		return nil, feed.Invalid("mysql.dsn", "names no database (…/database after the address); the table lives in it")
	}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, feed.Invalid("mysql.dsn", "is refused by the driver: %s", redact(err.Error(), dsn))
	}
	db := sql.OpenDB(conn)
	s, err := newSink(ctx, db, true, cfg.MaxAllowedPacket, opts)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// redact takes a DSN's password out of a message about it.
func redact(msg, dsn string) string {
	at := strings.LastIndex(dsn, "@")
	if at < 0 {
		return msg
	}
	colon := strings.Index(dsn[:at], ":")
	if colon < 0 || colon+1 >= at {
		return msg
	}
	return strings.ReplaceAll(msg, dsn[colon+1:at], "***")
}

func newSink(ctx context.Context, db *sql.DB, own bool, clientPacket int, opts Options) (*Sink, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("mysql: the server does not answer: %w", err)
	}
	var (
		database sql.NullString
		packet   int
		mode     string
	)
	if err := db.QueryRowContext(ctx, `SELECT DATABASE(), @@max_allowed_packet, @@SESSION.sql_mode`).Scan(&database, &packet, &mode); err != nil {
		return nil, fmt.Errorf("mysql: reading the server's settings: %w", err)
	}
	if !database.Valid {
		return nil, fmt.Errorf("mysql: the connection has no default database; name one in the DSN, the table %s lives in it", opts.Table)
	}
	if !strings.Contains(mode, "STRICT_TRANS_TABLES") && !strings.Contains(mode, "STRICT_ALL_TABLES") {
		return nil, fmt.Errorf("mysql: the session's sql_mode (%s) is not strict, so the server would cut values too long for their columns instead of refusing them; add STRICT_TRANS_TABLES", mode)
	}
	if clientPacket > 0 && clientPacket < packet {
		packet = clientPacket // the driver refuses larger packets itself
	}
	s := &Sink{
		db: db, own: own, opts: opts, packet: packet,
		maxDoc:   packet - stmtRoom - rowRoom - feed.MaxKeyLen,
		retireRe: regexp.MustCompile(`^` + regexp.QuoteMeta(opts.Table) + `(` + suffixShadow + `|` + suffixRetired + `)[0-9a-f]{` + fmt.Sprint(suffixRandLen) + `}$`),
	}
	if s.maxDoc < 1 {
		return nil, fmt.Errorf("mysql: the server's max_allowed_packet (%d bytes) leaves no room for a document", packet)
	}
	if err := s.checkTable(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// createTable is the table Options.Create makes. `key` is VARBINARY: it
// compares bytes, so two distinct keys never collide (a utf8mb4 collation
// folds case, accents or trailing spaces, depending on the server), and 512
// bytes fit an InnoDB index whatever the row format. `doc` is LONGTEXT in
// utf8mb4, stored as sent: MySQL's JSON type would rewrite numbers as
// doubles and refuse those beyond a double's range, which a feed document
// may hold.
func (s *Sink) createTable(ctx context.Context) error {
	check := ""
	if !s.opts.NoJSONCheck {
		// Unnamed: MySQL keeps constraint names unique per database, so a
		// named one could not be copied by the shadow's CREATE TABLE LIKE;
		// both servers name it themselves, per table.
		check = ",\n  CHECK (`doc` IS NULL OR JSON_VALID(`doc`))"
	}
	_, err := s.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+quote(s.opts.Table)+` (
  `+"`key`"+` VARBINARY(512) NOT NULL,
  `+"`seq`"+` BIGINT NOT NULL,
  `+"`doc`"+` LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  PRIMARY KEY (`+"`key`"+`)`+check+`
) ENGINE=InnoDB`)
	if err != nil {
		return fmt.Errorf("mysql: creating table %s: %w", s.opts.Table, err)
	}
	return nil
}

// checkTable checks the live table's shape, creating it first when asked.
func (s *Sink) checkTable(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		cols, pk, err := s.shape(ctx, s.opts.Table)
		if err != nil {
			return err
		}
		if len(cols) == 0 {
			if !s.opts.Create || attempt > 0 {
				return fmt.Errorf("%w: %s (set mysql.create to create it)", ErrNoTable, s.opts.Table)
			}
			if err := s.createTable(ctx); err != nil {
				return err
			}
			continue
		}
		want := map[string][]string{"key": {"varbinary"}, "seq": {"bigint"}, "doc": {"longtext", "json"}}
		for name, types := range want {
			c, ok := cols[name]
			switch {
			case !ok:
				return fmt.Errorf("%w: %s has no column `%s`", ErrTableShape, s.opts.Table, name)
			case !contains(types, c.typ):
				return fmt.Errorf("%w: %s.%s is %s, want %s", ErrTableShape, s.opts.Table, name, c.typ, strings.Join(types, " or "))
			case name == "doc" && !c.nullable:
				return fmt.Errorf("%w: %s.doc is NOT NULL; a deleted key keeps its seq in a row whose doc is NULL", ErrTableShape, s.opts.Table)
			}
		}
		if len(pk) != 1 || pk[0] != "key" {
			return fmt.Errorf("%w: the primary key of %s is (%s), want (key)", ErrTableShape, s.opts.Table, strings.Join(pk, ", "))
		}
		return nil
	}
}

type column struct {
	typ      string
	nullable bool
}

// shape reads a table's columns and primary key; no columns: no table.
func (s *Sink) shape(ctx context.Context, table string) (map[string]column, []string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE, IS_NULLABLE FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, table)
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: reading the columns of %s: %w", table, err)
	}
	cols := map[string]column{}
	for rows.Next() {
		var name, typ, nullable string
		if err := rows.Scan(&name, &typ, &nullable); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("mysql: reading the columns of %s: %w", table, err)
		}
		cols[strings.ToLower(name)] = column{typ: strings.ToLower(typ), nullable: nullable == "YES"}
	}
	if err := rows.Close(); err != nil {
		return nil, nil, fmt.Errorf("mysql: reading the columns of %s: %w", table, err)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("mysql: reading the columns of %s: %w", table, err)
	}
	rows, err = s.db.QueryContext(ctx, `SELECT COLUMN_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX`, table)
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: reading the primary key of %s: %w", table, err)
	}
	defer rows.Close()
	var pk []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, nil, fmt.Errorf("mysql: reading the primary key of %s: %w", table, err)
		}
		pk = append(pk, strings.ToLower(name))
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("mysql: reading the primary key of %s: %w", table, err)
	}
	return cols, pk, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// quote quotes a validated identifier (Options.resolve refuses backticks).
func quote(ident string) string { return "`" + ident + "`" }

// Table is the live table's name.
func (s *Sink) Table() string { return s.opts.Table }

// MaxDocumentBytes is the largest document (bytes of its JSON) the sink
// stores: what fits one statement of max_allowed_packet with the longest key.
// A larger document is rejected, the rest of its batch applied.
func (s *Sink) MaxDocumentBytes() int { return s.maxDoc }

// Close closes the pool when Open opened it; a sink from New leaves its pool
// to the caller.
func (s *Sink) Close() error {
	if s.own {
		return s.db.Close()
	}
	return nil
}

// Apply upserts the batch's documents and tombstones into the live table,
// each guarded by seq (see the package doc).
func (s *Sink) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	return s.apply(ctx, s.opts.Table, records)
}

func (s *Sink) apply(ctx context.Context, table string, records []feed.Record) ([]feed.Rejection, error) {
	var rejs []feed.Rejection
	rows := records
	for i, r := range records {
		if len(r.Doc) > s.maxDoc {
			if len(rows) == len(records) {
				rows = append([]feed.Record(nil), records[:i]...)
			}
			rejs = append(rejs, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: fmt.Sprintf(
				"mysql: the document is %d bytes, more than the %d that fit one statement under the server's max_allowed_packet (%d)", len(r.Doc), s.maxDoc, s.packet)})
			continue
		}
		if len(rows) < len(records) {
			rows = append(rows, r)
		}
	}
	for len(rows) > 0 {
		n, size := 0, stmtRoom
		for n < len(rows) && n < MaxRowsPerStatement {
			size += rowRoom + len(rows[n].Key) + len(rows[n].Doc)
			if n > 0 && size > s.packet {
				break
			}
			n++
		}
		chunk := rows[:n]
		rows = rows[n:]
		err := s.upsert(ctx, table, chunk)
		if err == nil {
			continue
		}
		if !recordLevel(err) {
			return nil, fmt.Errorf("mysql: upserting %d records into %s: %w", len(chunk), table, err)
		}
		// One record of the chunk is refused for its own sake: find which,
		// one statement a record, so the rest still lands.
		for _, r := range chunk {
			err := s.upsert(ctx, table, []feed.Record{r})
			switch {
			case err == nil:
			case recordLevel(err):
				rejs = append(rejs, feed.Rejection{Key: r.Key, Seq: r.Seq, Reason: "mysql: the server refuses the row: " + err.Error()})
			default:
				return nil, fmt.Errorf("mysql: upserting a record into %s: %w", table, err)
			}
		}
	}
	return rejs, nil
}

// upsert writes rows (tombstones as a NULL doc) in one statement, guarded
// by seq. doc is assigned before seq: both servers assign ON DUPLICATE KEY
// UPDATE's columns left to right, and doc's test must still see the stored
// seq.
//
// The new values come through VALUES(col), which both servers accept.
// MySQL deprecates it from 8.0.20 (a warning, not an error, through 8.4)
// in favour of a row alias (INSERT … AS new), which MariaDB does not
// parse. The other form MySQL suggests, an INSERT … SELECT from a derived
// table of placeholders, is worse: MariaDB types such a column as CHAR and
// strips a key's trailing spaces, so "a " would overwrite "a"
// (TestAwkwardKeysAndDocuments catches it).
//
// Rows below the floor this sink knows for the table are left out. The
// table's own floor constraint refuses any other below its floor, in the
// statement itself, so a table published by another process since is never
// written below its floor: the refusal makes the sink read that floor,
// leave out what is below it and send the rest again. The floor is not
// tested in each VALUES row instead because, on MariaDB 10.11, any
// expression in the rows made a 500-row upsert about a third slower.
func (s *Sink) upsert(ctx context.Context, table string, rows []feed.Record) error {
	for attempt := 0; ; attempt++ {
		if floor := s.floor(table); floor > 0 {
			kept := make([]feed.Record, 0, len(rows))
			for _, r := range rows {
				if r.Seq >= floor {
					kept = append(kept, r)
				}
			}
			rows = kept
		}
		if len(rows) == 0 {
			return nil
		}
		_, err := s.db.ExecContext(ctx, upsertSQL(table, len(rows)), upsertArgs(rows)...)
		if err == nil || !floorRefusal(err) {
			return err
		}
		if attempt == floorRetries {
			// Not wrapped: a refusal by the floor is no record's rejection.
			return fmt.Errorf("mysql: the floor of %s kept moving while a batch was sent: %v", table, err)
		}
		f, err := s.readFloor(ctx, table)
		if err != nil {
			return err
		}
		s.learnFloor(table, f)
	}
}

// floor is the highest floor the sink has seen on table: a record below it
// is of an older generation than the table's copy.
func (s *Sink) floor(table string) feed.Seq {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.floors[table]
}

// learnFloor records f as a floor of table, unless a higher one is known:
// floors only rise, generation after generation.
func (s *Sink) learnFloor(table string, f feed.Seq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.floors == nil {
		s.floors = map[string]feed.Seq{}
	}
	s.floors[table] = max(s.floors[table], f)
}

// moveFloor forgets the floor known for a shadow table and, when it was
// published as live, records it for live.
func (s *Sink) moveFloor(shadow, live string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.floors[shadow]; ok && live != "" {
		s.floors[live] = max(s.floors[live], f)
	}
	delete(s.floors, shadow)
}

// floorRefusal reports whether err is a table's floor constraint refusing a
// row, which both servers name in the message.
func floorRefusal(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && (me.Number == 4025 || me.Number == 3819) && strings.Contains(me.Message, floorPrefix)
}

// readFloor reads the floor the table's floor constraint holds, 0 when it
// has none. The constraint names are random, and copied only by CREATE
// TABLE … LIKE, which copies the clause too, so any constraint of that name
// holds that table's floor.
func (s *Sink) readFloor(ctx context.Context, table string) (feed.Seq, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT cc.CHECK_CLAUSE FROM information_schema.TABLE_CONSTRAINTS tc
JOIN information_schema.CHECK_CONSTRAINTS cc ON cc.CONSTRAINT_SCHEMA = tc.CONSTRAINT_SCHEMA AND cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME
WHERE tc.TABLE_SCHEMA = DATABASE() AND tc.TABLE_NAME = ? AND tc.CONSTRAINT_TYPE = 'CHECK' AND tc.CONSTRAINT_NAME LIKE ?`, table, `kairos\_floor\_%`)
	if err != nil {
		return 0, fmt.Errorf("mysql: reading the floor of %s: %w", table, err)
	}
	defer rows.Close()
	var floor feed.Seq
	for rows.Next() {
		var clause string
		if err := rows.Scan(&clause); err != nil {
			return 0, fmt.Errorf("mysql: reading the floor of %s: %w", table, err)
		}
		// "`seq` >= 123" on MariaDB, "(`seq` >= 123)" on MySQL.
		digits := strings.Trim(clause[strings.LastIndex(clause, ">=")+2:], " )")
		n, err := strconv.ParseInt(digits, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("mysql: the floor constraint of %s reads %q, not `seq` >= a seq", table, clause)
		}
		floor = max(floor, feed.Seq(n))
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("mysql: reading the floor of %s: %w", table, err)
	}
	return floor, nil
}

// upsertSQL is the guarded multi-row upsert of n rows into table.
func upsertSQL(table string, n int) string {
	var b strings.Builder
	b.Grow(200 + 8*n)
	b.WriteString("INSERT INTO " + quote(table) + " (`key`, `seq`, `doc`) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("(?,?,?)")
	}
	b.WriteString(" ON DUPLICATE KEY UPDATE `doc` = IF(`seq` < VALUES(`seq`), VALUES(`doc`), `doc`), `seq` = IF(`seq` < VALUES(`seq`), VALUES(`seq`), `seq`)")
	return b.String()
}

// upsertArgs are upsertSQL's arguments for rows: the key, seq and document
// (nil for a tombstone) of each.
func upsertArgs(rows []feed.Record) []any {
	args := make([]any, 0, 3*len(rows))
	for _, r := range rows {
		var d any
		if r.Doc != nil {
			d = []byte(r.Doc)
		}
		args = append(args, []byte(r.Key), int64(r.Seq), d)
	}
	return args
}

// recordLevel reports whether err refuses a row for its own sake, so that
// the row is a rejection and the rest of its batch still lands, rather than
// a fault of the sink. Classified by the server's error number.
func recordLevel(err error) bool {
	var me *gomysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1048, // ER_BAD_NULL_ERROR: a column the table added refuses NULL
		1118, // ER_TOO_BIG_ROWSIZE
		1264, // ER_WARN_DATA_OUT_OF_RANGE
		1292, // ER_TRUNCATED_WRONG_VALUE
		1366, // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD: an incorrect string value
		1406, // ER_DATA_TOO_LONG: a key longer than the table's column
		3140, // ER_INVALID_JSON_TEXT (MySQL's JSON column)
		3146, // ER_INVALID_TYPE_FOR_JSON
		3157, // ER_JSON_DOCUMENT_TOO_DEEP (MySQL)
		3819, // ER_CHECK_CONSTRAINT_VIOLATED (MySQL)
		4025: // ER_CONSTRAINT_FAILED (MariaDB)
		return true
	}
	return false
}

// OpenResync opens a shadow table, created LIKE the live one, for a resync.
// Every shadow and retired copy an earlier resync of this table left behind
// (a crash, an abort that could not reach the server) is dropped first.
func (s *Sink) OpenResync(ctx context.Context, generation feed.Generation) (feed.ResyncTarget, error) {
	if generation < feed.FirstGeneration {
		return nil, feed.Invalid("generation", "is %d; generations start at 1", generation)
	}
	if err := s.dropLeftovers(ctx); err != nil {
		return nil, err
	}
	r := &resync{s: s, shadow: s.opts.Table + suffixShadow + randHex(), retired: s.opts.Table + suffixRetired + randHex()}
	if _, err := s.db.ExecContext(ctx, "CREATE TABLE "+quote(r.shadow)+" LIKE "+quote(s.opts.Table)); err != nil {
		return nil, fmt.Errorf("mysql: creating the shadow table %s: %w", r.shadow, err)
	}
	return r, nil
}

func (s *Sink) dropLeftovers(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, `SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?`,
		strings.NewReplacer(`\`, `\\`, `_`, `\_`, `%`, `\%`).Replace(s.opts.Table)+`\_\_%`)
	if err != nil {
		return fmt.Errorf("mysql: listing leftover resync tables: %w", err)
	}
	var drop []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("mysql: listing leftover resync tables: %w", err)
		}
		if s.retireRe.MatchString(name) {
			drop = append(drop, quote(name))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("mysql: listing leftover resync tables: %w", err)
	}
	if len(drop) == 0 {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+strings.Join(drop, ", ")); err != nil {
		return fmt.Errorf("mysql: dropping leftover resync tables: %w", err)
	}
	return nil
}

func randHex() string {
	var b [suffixRandLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// resync is one shadow table being filled.
type resync struct {
	s       *Sink
	shadow  string
	retired string
	floored bool // the shadow has its own floor constraint
	done    bool // published or aborted
}

func (r *resync) Apply(ctx context.Context, records []feed.Record) ([]feed.Rejection, error) {
	if r.done {
		return nil, errors.New("mysql: Apply on a resync that was published or aborted")
	}
	if !r.floored && len(records) > 0 {
		floor := records[0].Seq
		for _, rec := range records {
			floor = min(floor, rec.Seq)
		}
		if err := r.recordFloor(ctx, floor); err != nil {
			return nil, err
		}
	}
	return r.s.apply(ctx, r.shadow, records)
}

// SetFloor gives a shadow that was sent no record its floor, the same
// constraint a first batch gives it; see feed.FloorSetter.
func (r *resync) SetFloor(ctx context.Context, floor feed.Seq) error {
	if floor < 1 {
		return feed.Invalid("floor", "is %d; seqs start at 1", floor)
	}
	if r.done {
		return errors.New("mysql: SetFloor on a resync that was published or aborted")
	}
	return r.recordFloor(ctx, floor)
}

// recordFloor gives the shadow its floor (the lowest seq of its first
// batch, or SetFloor's) before any row is written, in place of the live
// table's, which CREATE TABLE … LIKE copied (a lower one, or none). The
// shadow is still empty, so adding the constraint checks no row.
func (r *resync) recordFloor(ctx context.Context, floor feed.Seq) error {
	rows, err := r.s.db.QueryContext(ctx, `SELECT CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND CONSTRAINT_TYPE = 'CHECK' AND CONSTRAINT_NAME LIKE ?`, r.shadow, `kairos\_floor\_%`)
	if err != nil {
		return fmt.Errorf("mysql: reading the constraints of the shadow table %s: %w", r.shadow, err)
	}
	var alter []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("mysql: reading the constraints of the shadow table %s: %w", r.shadow, err)
		}
		alter = append(alter, "DROP CONSTRAINT "+quote(name))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("mysql: reading the constraints of the shadow table %s: %w", r.shadow, err)
	}
	alter = append(alter, "ADD CONSTRAINT "+quote(floorPrefix+randHex())+" CHECK (`seq` >= "+strconv.FormatInt(int64(floor), 10)+")")
	if _, err := r.s.db.ExecContext(ctx, "ALTER TABLE "+quote(r.shadow)+" "+strings.Join(alter, ", ")); err != nil {
		return fmt.Errorf("mysql: recording the floor of the shadow table %s: %w", r.shadow, err)
	}
	r.s.learnFloor(r.shadow, floor)
	r.floored = true
	return nil
}

// Publish swaps the shadow in with one RENAME TABLE, which both servers
// perform atomically: a reader sees the old table or the new one, never
// neither. The retired copy is dropped after; should that fail, the next
// OpenResync drops it.
func (r *resync) Publish(ctx context.Context) error {
	if r.done {
		return errors.New("mysql: Publish on a resync that was published or aborted")
	}
	live := quote(r.s.opts.Table)
	if _, err := r.s.db.ExecContext(ctx, "RENAME TABLE "+live+" TO "+quote(r.retired)+", "+quote(r.shadow)+" TO "+live); err != nil {
		return fmt.Errorf("mysql: publishing %s: %w", r.shadow, err)
	}
	r.done = true
	r.s.moveFloor(r.shadow, r.s.opts.Table)
	// The swap has happened: an error now would make the worker redo the
	// whole resync for a copy nobody serves. Left behind, the retired copy
	// is dropped by the next OpenResync.
	_, _ = r.s.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+quote(r.retired))
	return nil
}

// Abort drops the shadow table, and nothing else.
func (r *resync) Abort(ctx context.Context) error {
	if r.done {
		return nil
	}
	if _, err := r.s.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+quote(r.shadow)); err != nil {
		return fmt.Errorf("mysql: dropping the shadow table %s: %w", r.shadow, err)
	}
	r.done = true
	r.s.moveFloor(r.shadow, "")
	return nil
}

var _ feed.Sink = (*Sink)(nil)
