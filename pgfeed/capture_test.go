package pgfeed_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// capEnv is a migrated schema with a store and a table of the test's own in
// the same schema.
type capEnv struct {
	d db
	s *pgfeed.Store
	// concurrent says the test's feeds are in the concurrent write mode:
	// feedRows and head seal every unsealed row first, as a sealer would.
	concurrent bool
}

// writeModes are the write modes the capture tests run in.
var writeModes = []feed.WriteMode{feed.WriteLocked, feed.WriteConcurrent}

// inMode puts f in e's write mode.
func (e capEnv) inMode(t testing.TB, f feed.FeedName) {
	t.Helper()
	if !e.concurrent {
		return
	}
	if err := e.s.SetWriteMode(t.Context(), f, feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
}

// unsealed counts f's writes waiting for the sealer (unsealed rows and
// recorded keys) and reads its head, without sealing.
func (e capEnv) unsealed(t testing.TB, f feed.FeedName) (int64, feed.Seq) {
	t.Helper()
	var n, h int64
	err := e.d.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM "`+e.d.schema+`".feed_unsealed WHERE feed = $1)
			+ (SELECT coalesce(sum(n), 0) FROM "`+e.d.schema+`".feed_changes WHERE feed = $1)::bigint,
		coalesce((SELECT head FROM "`+e.d.schema+`".feed_generations WHERE feed = $1), 0)`, string(f)).Scan(&n, &h)
	if err != nil {
		t.Fatal(err)
	}
	return n, feed.Seq(h)
}

// settle seals f's unsealed rows in the concurrent mode, round after round
// until one seals nothing.
func (e capEnv) settle(t testing.TB, f feed.FeedName) {
	t.Helper()
	if !e.concurrent {
		return
	}
	for {
		n, err := e.s.SealRound(t.Context(), f)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// newCapEnv migrates a fresh schema and runs ddl there, with %[1]s standing
// for the quoted schema.
func newCapEnv(t *testing.T, ddl string) capEnv {
	t.Helper()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	e := capEnv{d: d, s: newStore(t, d, pgfeed.Options{})}
	e.exec(t, fmt.Sprintf(ddl, `"`+d.schema+`"`))
	return e
}

func (e capEnv) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := e.d.pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// q qualifies a table name of the test's schema.
func (e capEnv) q(table string) string { return `"` + e.d.schema + `".` + table }

// feedRow is one row of the feed as stored.
type feedRow struct {
	seq int64
	doc *string // nil: a tombstone
}

// feedRows reads every row of f, by key.
func (e capEnv) feedRows(t testing.TB, f feed.FeedName) map[string]feedRow {
	t.Helper()
	e.settle(t, f)
	rows, err := e.d.pool.Query(t.Context(), `SELECT key, seq, doc::text FROM "`+e.d.schema+`".feed_rows
		WHERE feed = coalesce((SELECT store FROM "`+e.d.schema+`".feed_generations WHERE feed = $1), $1)`, string(f))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]feedRow{}
	for rows.Next() {
		var k string
		var r feedRow
		if err := rows.Scan(&k, &r.seq, &r.doc); err != nil {
			t.Fatal(err)
		}
		out[k] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// live is f's documents by key (tombstones left out).
func (e capEnv) live(t testing.TB, f feed.FeedName) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, r := range e.feedRows(t, f) {
		if r.doc != nil {
			out[k] = *r.doc
		}
	}
	return out
}

// tombstones is f's deleted keys, sorted.
func (e capEnv) tombstones(t testing.TB, f feed.FeedName) []string {
	t.Helper()
	var out []string
	for k, r := range e.feedRows(t, f) {
		if r.doc == nil {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// want runs query, which returns (key text, doc jsonb) per row, as the
// documents the feed must hold.
func (e capEnv) want(t testing.TB, query string) map[string]string {
	t.Helper()
	rows, err := e.d.pool.Query(t.Context(), query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{ k, d string }, error) {
		var v struct{ k, d string }
		return v, r.Scan(&v.k, &v.d)
	})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, v := range out {
		m[v.k] = v.d
	}
	return m
}

// same fails unless the feed's live documents are exactly want's.
func (e capEnv) same(t testing.TB, step string, f feed.FeedName, want map[string]string) {
	t.Helper()
	got := e.live(t, f)
	if !maps.Equal(got, want) {
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: key %q: feed has %q, table %q", step, k, got[k], v)
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("%s: key %q: feed has %q, the table has no such row", step, k, v)
			}
		}
		t.FailNow()
	}
}

func (e capEnv) head(t testing.TB, f feed.FeedName) (feed.Generation, feed.Seq) {
	t.Helper()
	e.settle(t, f)
	g, err := e.s.Generation(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	h, err := e.s.Head(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	return g, h
}

// TestCaptureEveryWrite drives every kind of plain-SQL write at a captured
// table and checks after each that the feed's documents are the table's
// rows, that deleted keys are tombstones, and that each statement was one
// feed write (its rows at consecutive seqs, the head moved once per
// statement by the number of keys it touched). It runs in both write
// modes; in the concurrent one the feed is switched before Capture (items)
// and after it (shift), and every check seals first, so the head moves by
// the keys a statement wrote once they are sealed.
func TestCaptureEveryWrite(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, `CREATE TABLE %[1]s.items (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL DEFAULT 0)`)
			e.concurrent = mode == feed.WriteConcurrent
			captureEveryWrite(t, e)
		})
	}
}

func captureEveryWrite(t *testing.T, e capEnv) {
	ctx := t.Context()
	const f = feed.FeedName("items")
	e.inMode(t, f)
	info, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "items"})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Changed || !slices.Equal(info.Key, []string{"id"}) {
		t.Fatalf("Capture = %+v; want a change keyed on id", info)
	}
	table := `SELECT id::text, to_jsonb(r)::text FROM ` + e.q("items") + ` AS r`
	step := func(name string, wantMoved int64, sql string, args ...any) {
		t.Helper()
		_, before := e.head(t, f)
		e.exec(t, sql, args...)
		if e.concurrent {
			// The trigger recorded the statement's keys (every row it
			// touched: the sealer leaves out what did not change), and no
			// seq.
			if n, h := e.unsealed(t, f); n < wantMoved || h != before {
				t.Fatalf("%s: %d writes unsealed and the head at %d before sealing; want at least %d and %d", name, n, h, wantMoved, before)
			}
		}
		_, after := e.head(t, f)
		if int64(after-before) != wantMoved {
			t.Fatalf("%s: the head moved by %d; want %d", name, after-before, wantMoved)
		}
		e.same(t, name, f, e.want(t, table))
	}

	step("insert", 1, `INSERT INTO `+e.q("items")+` VALUES (1, 'one', 1)`)
	step("multi-row insert", 3, `INSERT INTO `+e.q("items")+` VALUES (2, 'two', 2), (3, 'three', 3), (4, 'four', 4)`)
	step("update of many rows", 4, `UPDATE `+e.q("items")+` SET qty = qty * 10`)
	step("update of no row", 0, `UPDATE `+e.q("items")+` SET qty = 0 WHERE id < 0`)
	step("update that changes no row", 0, `UPDATE `+e.q("items")+` SET qty = qty`)
	step("update that changes one row of four", 1, `UPDATE `+e.q("items")+` SET qty = CASE WHEN id = 2 THEN qty + 1 ELSE qty END`)
	step("update of the key", 2, `UPDATE `+e.q("items")+` SET id = 100 WHERE id = 1`)
	if got := e.tombstones(t, f); !slices.Equal(got, []string{"1"}) {
		t.Fatalf("after moving key 1 to 100 the tombstones are %q; want [1]", got)
	}
	step("delete", 2, `DELETE FROM `+e.q("items")+` WHERE id IN (3, 100)`)
	if got := e.tombstones(t, f); !slices.Equal(got, []string{"1", "100", "3"}) {
		t.Fatalf("after the delete the tombstones are %q; want [1 100 3]", got)
	}
	step("insert on conflict", 2, `INSERT INTO `+e.q("items")+` VALUES (4, 'four again', 44), (7, 'seven', 7)
		ON CONFLICT (id) DO UPDATE SET name = excluded.name, qty = excluded.qty`)
	step("insert on conflict do nothing", 0, `INSERT INTO `+e.q("items")+` VALUES (4, 'ignored', 0) ON CONFLICT DO NOTHING`)

	// COPY, through pgx's CopyFrom.
	_, before := e.head(t, f)
	n, err := e.d.pool.CopyFrom(ctx, pgx.Identifier{e.d.schema, "items"}, []string{"id", "name", "qty"},
		pgx.CopyFromRows([][]any{{int32(10), "ten", int32(10)}, {int32(11), "eleven", int32(11)}}))
	if err != nil || n != 2 {
		t.Fatalf("CopyFrom = %d, %v", n, err)
	}
	if _, after := e.head(t, f); after-before != 2 {
		t.Fatalf("COPY moved the head by %d; want 2", after-before)
	}
	e.same(t, "copy", f, e.want(t, table))

	// A transaction that writes one key twice leaves one row, at its last
	// seq, with its last document.
	err = pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE `+e.q("items")+` SET name = 'first' WHERE id = 10`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+e.q("items")+` SET name = 'second' WHERE id = 10`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.same(t, "a key written twice", f, e.want(t, table))
	if _, h := e.head(t, f); e.feedRows(t, f)["10"].seq != int64(h) {
		t.Fatalf("key 10 is at seq %d; want the head %d, its last write", e.feedRows(t, f)["10"].seq, h)
	}

	// A rolled-back transaction leaves nothing; a rolled-back savepoint
	// leaves nothing of its part.
	g0, h0 := e.head(t, f)
	tx, err := e.d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+e.q("items")+` VALUES (50, 'rolled back', 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+e.q("items")+` WHERE id = 10`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if g, h := e.head(t, f); g != g0 || h != h0 {
		t.Fatalf("a rollback moved the feed from (%d, %d) to (%d, %d)", g0, h0, g, h)
	}
	e.same(t, "rollback", f, e.want(t, table))
	err = pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.q("items")+` VALUES (60, 'kept', 0)`); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx) // a savepoint
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO `+e.q("items")+` VALUES (61, 'rolled back', 0)`); err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `DELETE FROM `+e.q("items")+` WHERE id = 11`); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, h := e.head(t, f); h != h0+1 {
		t.Fatalf("a transaction with one kept insert and a rolled-back savepoint moved the head from %d to %d; want %d", h0, h, h0+1)
	}
	e.same(t, "savepoint", f, e.want(t, table))
	if _, ok := e.feedRows(t, f)["61"]; ok {
		t.Fatal("key 61, inserted in a rolled-back savepoint, is in the feed")
	}

	// Every key moves one up onto its neighbour's old key (the key is
	// deferrable, so the statement may): keys 2 and 3 are both deleted and
	// written in one statement, and must keep documents.
	e.exec(t, `CREATE TABLE `+e.q("shift")+` (id int PRIMARY KEY DEFERRABLE, v text);
		INSERT INTO `+e.q("shift")+` VALUES (1, 'a'), (2, 'b'), (3, 'c')`)
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: "shift", Schema: e.d.schema, Table: "shift"}); err != nil {
		t.Fatal(err)
	}
	e.inMode(t, "shift")
	e.exec(t, `UPDATE `+e.q("shift")+` SET v = v || '!'`)
	e.settle(t, "shift") // in the concurrent mode, sealed before the shift as the locked mode's write is
	e.exec(t, `UPDATE `+e.q("shift")+` SET id = id + 1`)
	e.same(t, "shift of the keys", "shift", e.want(t, `SELECT id::text, to_jsonb(r)::text FROM `+e.q("shift")+` AS r`))
	if got := e.tombstones(t, "shift"); !slices.Equal(got, []string{"1"}) {
		t.Fatalf("after the shift the tombstones are %q; want [1]", got)
	}
	if _, h := e.head(t, "shift"); h != 3+4 {
		t.Fatalf("after the shift the head is %d; want 7 (3 updated keys, then the 6 changes of the shift on 4 keys, compacted)", h)
	}

	// TRUNCATE moves the feed to a new generation, emptied; writes in the
	// same transaction after it land in the new generation.
	err = pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `TRUNCATE `+e.q("items")); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+e.q("items")+` VALUES (70, 'after truncate', 0)`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := e.head(t, f); g != g0+1 {
		t.Fatalf("TRUNCATE left the generation at %d; want %d", g, g0+1)
	}
	e.same(t, "truncate", f, e.want(t, table))
	if ts := e.tombstones(t, f); len(ts) != 0 {
		t.Fatalf("the new generation has tombstones %q; want none", ts)
	}
}

// TestCaptureCompositeKeyAndDocuments captures a table whose name and
// columns need quoting, keyed on two columns whose values hold the
// encoding's own characters, with a column excluded, and then with a
// document expression: NULL makes a tombstone, JSON null is refused as Write
// refuses it.
//
// In the concurrent mode the first spec is keyed (see the package doc's #
// Keyed capture): the sealer finds each row again from its key text, so the
// keys' escapes must come undone, and a key the feed refuses fails the
// writer's statement there too.
func TestCaptureCompositeKeyAndDocuments(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, `CREATE TABLE %[1]s."Order Lines" ("Order" text, "select" int, secret text, shown bool NOT NULL DEFAULT true,
		PRIMARY KEY ("Order", "select"))`)
			e.concurrent = mode == feed.WriteConcurrent
			captureCompositeKeyAndDocuments(t, e)
		})
	}
}

func captureCompositeKeyAndDocuments(t *testing.T, e capEnv) {
	ctx := t.Context()
	const f = feed.FeedName("lines")
	e.inMode(t, f)
	spec := pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "Order Lines", Exclude: []string{"secret"}}
	if _, err := e.s.Capture(ctx, spec); err != nil {
		t.Fatal(err)
	}
	e.exec(t, `INSERT INTO `+e.q(`"Order Lines"`)+` VALUES ('a/b', 1, 's', true), ('50%', 2, 's', true), ('%2F', 3, 's', false), ('x', 4, 's', true)`)
	want := map[string]string{
		"a%2Fb/1": `{"Order": "a/b", "shown": true, "select": 1}`,
		"50%25/2": `{"Order": "50%", "shown": true, "select": 2}`,
		"%252F/3": `{"Order": "%2F", "shown": false, "select": 3}`,
		"x/4":     `{"Order": "x", "shown": true, "select": 4}`,
	}
	e.same(t, "composite keys", f, want)
	// A key over 512 bytes fails the writer's statement, keyed or not.
	_, err := e.d.pool.Exec(ctx, `INSERT INTO `+e.q(`"Order Lines"`)+` VALUES (repeat('k', 600), 1, 's', true)`)
	if err == nil || !strings.Contains(err.Error(), "more than the 512 allowed") {
		t.Fatalf("an insert with a 600-byte key = %v; want the feed's refusal", err)
	}
	for k, d := range want {
		parts, err := pgfeed.SplitKey(feed.Key(k))
		var doc map[string]any
		if err := json.Unmarshal([]byte(d), &doc); err != nil {
			t.Fatal(err)
		}
		if err != nil || len(parts) != 2 || parts[0] != doc["Order"] || parts[1] != fmt.Sprint(doc["select"]) {
			t.Errorf("SplitKey(%q) = %q, %v; want the row's Order and select", k, parts, err)
		}
	}

	// A document expression replaces the spec: rows not shown are absent.
	spec.Exclude = nil
	spec.Document = `CASE WHEN r.shown THEN jsonb_build_object('order', r."Order", 'line', r."select") END`
	e.exec(t, `UPDATE `+e.q(`"Order Lines"`)+` SET secret = 't'`) // changes no document
	if _, h := e.head(t, f); h != 4 {
		t.Fatalf("after an update of the excluded column the head is %d; want 4", h)
	}
	info, err := e.s.Capture(ctx, spec)
	if err != nil || !info.Changed {
		t.Fatalf("Capture with a document = %+v, %v; want a change", info, err)
	}
	e.exec(t, `UPDATE `+e.q(`"Order Lines"`)+` SET shown = NOT shown`)
	e.same(t, "document expression", f, map[string]string{"%252F/3": `{"line": 3, "order": "%2F"}`})

	// JSON null fails the writer's statement, and it writes nothing.
	spec.Document = `CASE WHEN r.shown THEN to_jsonb(r.secret) ELSE 'null'::jsonb END`
	if _, err := e.s.Capture(ctx, spec); err != nil {
		t.Fatal(err)
	}
	_, err = e.d.pool.Exec(ctx, `UPDATE `+e.q(`"Order Lines"`)+` SET secret = 'z'`)
	if err == nil || !strings.Contains(err.Error(), "JSON null") {
		t.Fatalf("an update whose document is JSON null = %v; want the feed's refusal", err)
	}
	// A key over 512 bytes fails the writer's statement likewise.
	_, err = e.d.pool.Exec(ctx, `INSERT INTO `+e.q(`"Order Lines"`)+` VALUES (repeat('k', 600), 1, 's', true)`)
	if err == nil || !strings.Contains(err.Error(), "more than the 512 allowed") {
		t.Fatalf("an insert with a 600-byte key = %v; want the feed's refusal", err)
	}
}

// TestCaptureUpdateWritesOnlyChanges: an UPDATE writes the feed rows of the
// documents it changed and no others, where "changed" is what a sink would
// see: an UPDATE of a column the document leaves out writes nothing, one
// that changes a number's scale only (1.0 to 1.00, equal as jsonb) writes
// the new document, and one that changes a key's text only (numeric 1.0 to
// 1.00, equal as keys of the table) tombstones the old key. With a document
// expression a row is unchanged only when every column is.
//
// In the concurrent mode the first spec is keyed: the sealer, not the
// trigger, leaves unchanged documents out, and finds the row of key 1.0
// again by its key text, not by numeric equality.
func TestCaptureUpdateWritesOnlyChanges(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, `CREATE TABLE %[1]s.prices (id numeric PRIMARY KEY, price numeric NOT NULL, note text NOT NULL)`)
			e.concurrent = mode == feed.WriteConcurrent
			captureUpdateWritesOnlyChanges(t, e)
		})
	}
}

func captureUpdateWritesOnlyChanges(t *testing.T, e capEnv) {
	ctx := t.Context()
	const f = feed.FeedName("prices")
	e.inMode(t, f)
	spec := pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "prices", Exclude: []string{"note"}}
	if _, err := e.s.Capture(ctx, spec); err != nil {
		t.Fatal(err)
	}
	table := `SELECT id::text, (to_jsonb(r) - 'note')::text FROM ` + e.q("prices") + ` AS r`
	step := func(name string, wantMoved int64, sql string) {
		t.Helper()
		_, before := e.head(t, f)
		e.exec(t, sql)
		if _, after := e.head(t, f); int64(after-before) != wantMoved {
			t.Fatalf("%s: the head moved by %d; want %d", name, after-before, wantMoved)
		}
		e.same(t, name, f, e.want(t, table))
	}
	step("insert", 2, `INSERT INTO `+e.q("prices")+` VALUES (1.0, 1.0, 'a'), (2, 5, 'a')`)
	step("update of the left-out column", 0, `UPDATE `+e.q("prices")+` SET note = 'b'`)
	step("update of the scale of a price", 1, `UPDATE `+e.q("prices")+` SET price = 1.00 WHERE id = 1`)
	if got := e.live(t, f)["1.0"]; !strings.Contains(got, `"price": 1.00`) {
		t.Fatalf("after price 1.0 became 1.00 the feed has %s", got)
	}
	step("update of the scale of a key", 2, `UPDATE `+e.q("prices")+` SET id = 1.00 WHERE id = 1`)
	if got := e.tombstones(t, f); !slices.Equal(got, []string{"1.0"}) {
		t.Fatalf("after key 1.0 became 1.00 the tombstones are %q; want [1.0]", got)
	}

	spec.Exclude, spec.Document = nil, `jsonb_build_object('price', r.price)`
	if _, err := e.s.Capture(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// The feed keeps the old shape of a document until a write or a
	// backfill replaces it: an unchanged row is not rewritten.
	if _, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: f, Progress: func(pgfeed.BackfillProgress) {}}); err != nil {
		t.Fatal(err)
	}
	table = `SELECT id::text, jsonb_build_object('price', r.price)::text FROM ` + e.q("prices") + ` AS r`
	step("document expression, update of no column", 0, `UPDATE `+e.q("prices")+` SET note = note`)
	step("document expression, update of a column it leaves out", 2, `UPDATE `+e.q("prices")+` SET note = 'c'`)
}

// TestCaptureBadInput: every spec the catalog refuses is an InvalidError
// naming the field and the name, and leaves nothing installed.
func TestCaptureBadInput(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, `CREATE TABLE %[1]s.nopk (a int, b text);
		CREATE TABLE %[1]s.t (id int PRIMARY KEY, code text NOT NULL UNIQUE, at timestamptz UNIQUE, n int, nick text UNIQUE);
		CREATE VIEW %[1]s.v AS SELECT 1 AS id`)
	ctx := t.Context()
	s := e.d.schema
	for _, c := range []struct {
		name  string
		spec  pgfeed.CaptureSpec
		field string
		says  string
	}{
		{"no primary key", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "nopk"}, "spec.key", "no primary key"},
		{"unknown key column", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Key: []string{"nope"}}, "spec.key[0]", `"nope"`},
		{"unknown included column", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Include: []string{"id", "Code"}}, "spec.include[1]", `"Code"`},
		{"unknown excluded column", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Exclude: []string{"x"}}, "spec.exclude[0]", `"x"`},
		{"missing schema", pgfeed.CaptureSpec{Feed: "f", Schema: s + "_none", Table: "t"}, "spec.schema", s + "_none"},
		{"missing table", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "T"}, "spec.table", `"T"`},
		{"a view", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "v"}, "spec.table", "which is a view, not a table"},
		{"bad feed name", pgfeed.CaptureSpec{Feed: "no spaces", Schema: s, Table: "t"}, "spec.feed", "no spaces"},
		{"no table", pgfeed.CaptureSpec{Feed: "f", Schema: s}, "spec.table", "empty"},
		{"key not unique", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Key: []string{"n"}}, "spec.key", "no unique index"},
		{"key of a session-dependent type", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Key: []string{"at"}}, "spec.key[0]", "timestamp with time zone"},
		{"nullable key column", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Key: []string{"nick"}}, "spec.key[0]", `column "nick" of table "` + s + `"."t", which may hold NULL`},
		{"nullable column of a composite key", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Key: []string{"id", "nick"}}, "spec.key[1]", `column "nick" of table "` + s + `"."t", which may hold NULL`},
		{"include and exclude", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Include: []string{"id"}, Exclude: []string{"n"}}, "spec.include", "both"},
		{"document with include", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Include: []string{"id"}, Document: "to_jsonb(r)"}, "spec.document", "include"},
		{"document that does not parse", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Document: "to_jsonb(r"}, "spec.document", "syntax"},
		{"document of an unknown column", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Document: "to_jsonb(r.nope)"}, "spec.document", "nope"},
		{"document smuggling a statement", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Document: "to_jsonb(r)); DROP TABLE " + e.q("nopk") + "; SELECT (1"}, "spec.document", "does not prepare"},
		{"document not jsonb", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Document: "r.n"}, "spec.document", "jsonb"},
		{"document calling an unqualified function", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "t", Document: "my_doc(r)"}, "spec.document", "my_doc"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.s.Capture(ctx, c.spec)
			var inv *feed.InvalidError
			if !errors.As(err, &inv) || !strings.Contains(err.Error(), c.field+":") || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Capture = %v; want an InvalidError on %s that says %q", err, c.field, c.says)
			}
			if _, err := e.s.CaptureSQL(ctx, c.spec); err == nil {
				t.Fatal("CaptureSQL accepted what Capture refused")
			}
		})
	}
	var triggers, captures, functions int
	if err := e.d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid IN ($1::regclass, $2::regclass) AND NOT tgisinternal),
		(SELECT count(*) FROM `+e.q("feed_captures")+`),
		(SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $3 AND p.proname ~ '^feed_[cd][0-9a-f]{10}$')`,
		e.q("nopk"), e.q("t"), s).Scan(&triggers, &captures, &functions); err != nil {
		t.Fatal(err)
	}
	if triggers != 0 || captures != 0 || functions != 0 {
		t.Fatalf("refused specs left %d triggers, %d captures and %d capture functions", triggers, captures, functions)
	}
}

// TestCaptureIdempotentConcurrentAndRemoved: processes that capture and
// uncapture one feed at once serialise (each call succeeds, and the table
// ends with exactly one trigger set); a repeated Capture changes nothing; a
// changed spec replaces the trigger; Uncapture stops the feed writes.
func TestCaptureIdempotentConcurrentAndRemoved(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, `CREATE TABLE %[1]s.t (id int PRIMARY KEY, a text, b text);
		CREATE TABLE %[1]s.u (id int PRIMARY KEY, c text)`)
	ctx := t.Context()
	const f = feed.FeedName("t")
	specs := []pgfeed.CaptureSpec{
		{Feed: f, Schema: e.d.schema, Table: "t"},
		{Feed: f, Schema: e.d.schema, Table: "t", Exclude: []string{"b"}},
		{Feed: f, Schema: e.d.schema, Table: "t", Include: []string{"a"}},
	}
	// Eight stores on pools of their own stand for eight processes.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		s := newStore(t, db{pool: pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement), schema: e.d.schema}, pgfeed.Options{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 6 {
				var err error
				if (i+j)%5 == 4 {
					_, err = s.Uncapture(ctx, f)
				} else {
					_, err = s.Capture(ctx, specs[(i+j)%len(specs)])
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a concurrent Capture or Uncapture failed: %v", err)
	}
	info, err := e.s.Capture(ctx, specs[1])
	if err != nil || len(info.Version) == 0 {
		t.Fatalf("Capture = %+v, %v", info, err)
	}
	again, err := e.s.Capture(ctx, specs[1])
	if err != nil || again.Changed || again.Version != info.Version {
		t.Fatalf("a repeated Capture = %+v, %v; want no change at version %s", again, err, info.Version)
	}
	countTriggers := func(table string) int {
		var n int
		if err := e.d.pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal`, e.q(table)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := countTriggers("t"); n != 4 {
		t.Fatalf("table t has %d triggers; want 4", n)
	}
	e.exec(t, `INSERT INTO `+e.q("t")+` VALUES (1, 'a', 'b')`)
	e.same(t, "excluding b", f, map[string]string{"1": `{"a": "a", "id": 1}`})

	// Moved to another table: the first loses its triggers.
	moved, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "u"})
	if err != nil || !moved.Changed {
		t.Fatalf("Capture of another table = %+v, %v", moved, err)
	}
	if nt, nu := countTriggers("t"), countTriggers("u"); nt != 0 || nu != 4 {
		t.Fatalf("after moving the capture, t has %d triggers and u %d; want 0 and 4", nt, nu)
	}
	list, err := e.s.Captures(ctx)
	if err != nil || len(list) != 1 || list[0].Table != "u" {
		t.Fatalf("Captures = %+v, %v; want the capture of u", list, err)
	}

	// Renamed since it was captured: Uncapture still finds its triggers.
	e.exec(t, `ALTER TABLE `+e.q("u")+` RENAME TO "U 2"`)
	if ok, err := e.s.Uncapture(ctx, f); !ok || err != nil {
		t.Fatalf("Uncapture = %v, %v; want true", ok, err)
	}
	if ok, err := e.s.Uncapture(ctx, f); ok || err != nil {
		t.Fatalf("a second Uncapture = %v, %v; want false, nil", ok, err)
	}
	_, h := e.head(t, f)
	e.exec(t, `INSERT INTO `+e.q(`"U 2"`)+` VALUES (1, 'c')`)
	if _, h2 := e.head(t, f); h2 != h || countTriggers(`"U 2"`) != 0 {
		t.Fatalf("after Uncapture a write moved the head from %d to %d", h, h2)
	}
}

// TestCaptureSQL: the printed script, run by hand, installs what Capture
// installs, and Capture then finds nothing to do.
func TestCaptureSQL(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, `CREATE TABLE %[1]s.t (id int PRIMARY KEY, a text)`)
	ctx := t.Context()
	spec := pgfeed.CaptureSpec{Feed: "t", Schema: e.d.schema, Table: "t"}
	script, err := e.s.CaptureSQL(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(script, "REFERENCING OLD TABLE AS kairos_old NEW TABLE AS kairos_new") {
		t.Fatalf("the script has no update trigger with transition tables:\n%s", script)
	}
	err = pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
		return err
	})
	if err != nil {
		t.Fatalf("running the script: %v", err)
	}
	info, err := e.s.Capture(ctx, spec)
	if err != nil || info.Changed {
		t.Fatalf("Capture after the script = %+v, %v; want no change", info, err)
	}
	e.exec(t, `INSERT INTO `+e.q("t")+` VALUES (1, 'x')`)
	e.same(t, "script", "t", map[string]string{"1": `{"a": "x", "id": 1}`})
}

// TestCaptureWriterNeedsNoFeedRights: a role that may write the captured
// table and nothing more (USAGE on the table's schema, which is not the
// feed's, and the table's own rights) is captured by every kind of write,
// in both write modes, the concurrent one with a sealer running. The
// trigger function runs as the role that ran Capture; run as the writer,
// it fails the writer's first statement with "permission denied for
// schema". The writer holds no EXECUTE on the function either, which
// firing a trigger does not ask for.
func TestCaptureWriterNeedsNoFeedRights(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			app := pgtest.Schema(t)
			d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
			e := capEnv{d: d, s: newStore(t, d, pgfeed.Options{}), concurrent: mode == feed.WriteConcurrent}
			ctx := t.Context()
			items := `"` + app + `".items`
			e.exec(t, `CREATE SCHEMA "`+app+`"; CREATE TABLE `+items+` (id int PRIMARY KEY, name text NOT NULL)`)
			// Roles belong to the cluster: one of the test's own name,
			// dropped after the pool that logs in as it is closed.
			role := "kairos_w_" + strings.TrimPrefix(app, "t_")
			e.exec(t, `CREATE ROLE `+role+` LOGIN`)
			t.Cleanup(func() {
				c := context.Background()
				_, _ = e.d.pool.Exec(c, `DROP OWNED BY `+role)
				_, _ = e.d.pool.Exec(c, `DROP ROLE `+role)
			})
			e.exec(t, `GRANT USAGE ON SCHEMA "`+app+`" TO `+role)
			e.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON `+items+` TO `+role)
			writer := pgtest.PoolWith(t, pgtest.URL(), func(cfg *pgxpool.Config) { cfg.ConnConfig.User = role })

			const f = feed.FeedName("items")
			e.inMode(t, f)
			if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: app, Table: "items"}); err != nil {
				t.Fatal(err)
			}
			if e.concurrent {
				sealCtx, stopSealer := context.WithCancel(ctx)
				sealed := make(chan error, 1)
				go func() { sealed <- e.s.RunSealer(sealCtx, f) }()
				t.Cleanup(func() { stopSealer(); <-sealed })
			}
			// The premise: the writer can reach nothing of the feed's.
			if _, err := writer.Exec(ctx, `SELECT FROM "`+d.schema+`".feed_rows`); err == nil || !strings.Contains(err.Error(), "permission denied for schema") {
				t.Fatalf("the writer's read of the feed's rows = %v; want permission denied for the feed's schema", err)
			}
			var mayExecute bool
			if err := e.d.pool.QueryRow(ctx, `SELECT has_function_privilege($1, p.oid, 'EXECUTE') FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
				WHERE n.nspname = $2 AND p.proname LIKE 'feed\_c%'`, role, d.schema).Scan(&mayExecute); err != nil {
				t.Fatal(err)
			}
			if mayExecute {
				t.Fatal("the writer may execute the trigger function; EXECUTE should be revoked from PUBLIC")
			}

			table := `SELECT id::text, to_jsonb(r)::text FROM ` + items + ` AS r`
			step := func(name, sql string) {
				t.Helper()
				if _, err := writer.Exec(ctx, sql); err != nil {
					t.Fatalf("%s, as the writer: %v", name, err)
				}
				e.same(t, name, f, e.want(t, table))
			}
			step("insert", `INSERT INTO `+items+` VALUES (1, 'one'), (2, 'two'), (3, 'three')`)
			step("update", `UPDATE `+items+` SET name = name || '!' WHERE id <= 2`)
			step("update of a key", `UPDATE `+items+` SET id = 30 WHERE id = 3`)
			if got := e.tombstones(t, f); !slices.Equal(got, []string{"3"}) {
				t.Fatalf("after the key's update the tombstones are %q; want [3]", got)
			}
			step("upsert", `INSERT INTO `+items+` VALUES (1, 'uno'), (4, 'four') ON CONFLICT (id) DO UPDATE SET name = excluded.name`)
			step("delete", `DELETE FROM `+items+` WHERE id = 2`)
			g, _ := e.head(t, f)
			step("truncate", `TRUNCATE `+items)
			if g2, _ := e.head(t, f); g2 != g+1 || len(e.feedRows(t, f)) != 0 {
				t.Fatalf("after the truncate the feed is at generation %d with %d rows; want generation %d, empty", g2, len(e.feedRows(t, f)), g+1)
			}
			step("insert after the truncate", `INSERT INTO `+items+` VALUES (5, 'five')`)
		})
	}
}

// TestCaptureCommitOrder is guarantee 2 for captured writes: eight plain-SQL
// writers insert into a captured table while a ninth holds its transaction
// open, with its insert made, for over a second, and a reader tails the
// feed throughout. The reader must see every seq from 1 to the head, each
// above the last. A trigger that handed out seqs without holding the feed
// lock to commit fails: the slow writer's seqs would commit below seqs the
// reader has passed. It runs in both write modes; in the concurrent one a
// sealer runs throughout and the slow writer's rows wait unsealed.
func TestCaptureCommitOrder(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, `CREATE TABLE %[1]s.t (id text PRIMARY KEY, n int)`)
			e.concurrent = mode == feed.WriteConcurrent
			captureCommitOrder(t, e)
		})
	}
}

func captureCommitOrder(t *testing.T, e capEnv) {
	ctx := t.Context()
	const f = feed.FeedName("order")
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "t"}); err != nil {
		t.Fatal(err)
	}
	e.inMode(t, f)
	if e.concurrent {
		// The sealer runs all along, as a runner runs it.
		sealCtx, stopSealer := context.WithCancel(ctx)
		sealed := make(chan error, 1)
		go func() { sealed <- e.s.RunSealer(sealCtx, f) }()
		t.Cleanup(func() { stopSealer(); <-sealed })
	}
	const writers, commits, perCommit = 8, 20, 3
	var (
		wg      sync.WaitGroup
		written atomic.Int64
		errs    = make(chan error, writers+1)
		started = make(chan struct{})
	)
	insert := e.q("t")
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range commits {
				if c == commits/2 && w == 0 {
					close(started)
				}
				var vals []string
				for k := range perCommit {
					vals = append(vals, fmt.Sprintf("('w%d-%d-%d', %d)", w, c, k, k))
				}
				if _, err := e.d.pool.Exec(ctx, `INSERT INTO `+insert+` VALUES `+strings.Join(vals, ", ")); err != nil {
					errs <- err
					return
				}
				written.Add(perCommit)
			}
		}()
	}
	var slowHeld time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-started
		err := pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+insert+` VALUES ('slow-1', 1), ('slow-2', 2)`); err != nil {
				return err
			}
			begin := time.Now()
			time.Sleep(1500 * time.Millisecond) // the feed lock (the rows' locks, concurrent) held all along
			slowHeld = time.Since(begin)
			return nil
		})
		if err != nil {
			errs <- err
			return
		}
		written.Add(2)
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	seen := map[feed.Seq]bool{}
	var last feed.Seq
	finished, settled := false, false
	for {
		select {
		case err := <-errs:
			t.Fatalf("writer: %v", err)
		case <-done:
			finished = true
		default:
		}
		b, err := e.s.ReadBatch(ctx, f, last, feed.BatchLimit{Records: 7})
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		for _, r := range b.Records {
			if r.Seq <= last {
				t.Fatalf("the reader at seq %d was handed seq %d", last, r.Seq)
			}
			last = r.Seq
			seen[r.Seq] = true
		}
		if len(b.Records) == 0 {
			if finished && e.concurrent && !settled {
				// Every writer has committed: seal what the sealer has not
				// yet, and read on.
				e.settle(t, f)
				settled = true
				continue
			}
			if finished {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Every row the feed holds was handed to the reader: a row that
	// committed below the reader's position would have been skipped.
	for k, r := range e.feedRows(t, f) {
		if !seen[feed.Seq(r.seq)] {
			t.Errorf("the tailing reader skipped key %s at seq %d (it read up to %d)", k, r.seq, last)
		}
	}
	_, head := e.head(t, f)
	want := int64(writers*commits*perCommit + 2)
	if int64(head) != want || written.Load() != want {
		t.Fatalf("head %d, written %d; want %d", head, written.Load(), want)
	}
	for q := feed.Seq(1); q <= head; q++ {
		if !seen[q] {
			t.Errorf("the tailing reader skipped seq %d (it read up to %d)", q, last)
		}
	}
	if slowHeld < time.Second {
		t.Errorf("the slow writer held its transaction %v; the test needs over a second", slowHeld)
	}
	e.same(t, "commit order", f, e.want(t, `SELECT id, to_jsonb(r)::text FROM `+insert+` AS r`))
}

// TestSplitKey: the composite-key encoding round-trips the encoding's own
// characters, and a key that is not of that shape is refused.
func TestSplitKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string][]string{
		"a%2Fb/1":   {"a/b", "1"},
		"50%25/%2F": {"50%", "/"},
		"x":         {"x"},
		"/":         {"", ""},
	} {
		got, err := pgfeed.SplitKey(feed.Key(key))
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("SplitKey(%q) = %q, %v; want %q", key, got, err, want)
		}
	}
	for _, bad := range []string{"50%/1", "a%2/b", "%"} {
		if _, err := pgfeed.SplitKey(feed.Key(bad)); err == nil {
			t.Errorf("SplitKey(%q) accepted a stray %%", bad)
		}
	}
}

// TestCaptureModeSwitch: a captured feed moves between the write modes
// while a captured writer holds its transaction open, and the switch waits
// for it, whichever mode it wrote in. To the locked mode, the writer's
// unsealed row must be sealed by the switch: a trigger's write that took
// the concurrent path without the feed's write lock shared would let the
// switch pass it, and its row would commit unsealed into a locked feed,
// where no sealer ever seals it. To the concurrent mode, the locked writer's
// row keeps its seq and later writes go unsealed.
func TestCaptureModeSwitch(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, `CREATE TABLE %[1]s.items (id int PRIMARY KEY, name text NOT NULL)`)
	ctx := t.Context()
	const f = feed.FeedName("items")
	table := `SELECT id::text, to_jsonb(r)::text FROM ` + e.q("items") + ` AS r`
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "items"}); err != nil {
		t.Fatal(err)
	}
	// switchWhileOpen opens a writer that inserts row id, switches f to
	// mode meanwhile, and commits the writer once the switch waits for it.
	switchWhileOpen := func(id int, mode feed.WriteMode) {
		t.Helper()
		tx, err := e.d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		var pid int32
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.q("items")+` VALUES ($1, 'open during the switch')`, id); err != nil {
			t.Fatal(err)
		}
		switched := make(chan error, 1)
		go func() { switched <- e.s.SetWriteMode(ctx, f, mode) }()
		for waiting := false; !waiting; {
			select {
			case err := <-switched:
				t.Fatalf("the switch to the %s mode returned (%v) while a captured writer was open", mode, err)
			default:
			}
			if err := e.d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, pid).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-switched; err != nil {
			t.Fatalf("SetWriteMode(%s): %v", mode, err)
		}
	}

	e.exec(t, `INSERT INTO `+e.q("items")+` VALUES (1, 'locked')`)
	switchWhileOpen(2, feed.WriteConcurrent)
	e.concurrent = true
	e.exec(t, `INSERT INTO `+e.q("items")+` VALUES (3, 'concurrent')`)
	if n, _ := e.unsealed(t, f); n != 1 {
		t.Fatalf("%d rows unsealed after a captured insert in the concurrent mode; want 1", n)
	}
	e.same(t, "after the switch to the concurrent mode", f, e.want(t, table))

	e.exec(t, `UPDATE `+e.q("items")+` SET name = name || '!' WHERE id = 3`)
	e.concurrent = false // no sealing by the test from here: the switch must
	switchWhileOpen(4, feed.WriteLocked)
	if n, _ := e.unsealed(t, f); n != 0 {
		t.Fatalf("%d rows unsealed in the locked mode after the switch", n)
	}
	e.exec(t, `INSERT INTO `+e.q("items")+` VALUES (5, 'locked again')`)
	e.same(t, "after the switch back to the locked mode", f, e.want(t, table))
	_, head := e.head(t, f)
	if rows := e.feedRows(t, f); rows["5"].seq != int64(head) {
		t.Fatalf("key 5, written last in the locked mode, is at seq %d; want the head %d", rows["5"].seq, head)
	}
}

// TestCapturesReportSpecAndBackfill: Captures gives each capture's spec as
// installed and how far its last backfill got: none, stopped (it resumes),
// done, and one read under an earlier spec (the next starts over).
func TestCapturesReportSpecAndBackfill(t *testing.T) {
	e := newCapEnv(t, `CREATE TABLE %[1]s.t (id int PRIMARY KEY, a text, b text);
		INSERT INTO %[1]s.t SELECT i, 'a', 'b' FROM generate_series(1, 25) AS i`)
	ctx := t.Context()
	const f = feed.FeedName("reported")
	spec := pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "t", Exclude: []string{"b"}}
	if _, err := e.s.Capture(ctx, spec); err != nil {
		t.Fatal(err)
	}
	state := func(step string) *pgfeed.BackfillState {
		t.Helper()
		list, err := e.s.Captures(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("%s: Captures = %+v, %v", step, list, err)
		}
		if got := list[0].Spec; got.Feed != f || got.Table != "t" || !slices.Equal(got.Exclude, spec.Exclude) {
			t.Fatalf("%s: Captures gives the spec %+v; want the one installed, %+v", step, got, spec)
		}
		return list[0].Backfill
	}
	if b := state("before a backfill"); b != nil {
		t.Fatalf("before a backfill: Backfill = %+v; want nil", b)
	}
	// A backfill cancelled after its first batch commits stops there (one
	// worker: with two, the other share's first batch may commit too).
	bctx, cancel := context.WithCancel(ctx)
	_, err := e.s.Backfill(bctx, pgfeed.BackfillOptions{Feed: f, BatchSize: 10, Workers: 1, Progress: func(pgfeed.BackfillProgress) { cancel() }})
	if err == nil {
		t.Fatal("a backfill cancelled after its first batch returned no error")
	}
	if b := state("stopped"); b == nil || b.Rows != 10 || !b.Finished.IsZero() || !b.Current || b.Started.IsZero() || b.Updated.Before(b.Started) {
		t.Fatalf("stopped: Backfill = %+v; want 10 rows, not finished, current", b)
	}
	if _, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: f, BatchSize: 10}); err != nil {
		t.Fatal(err)
	}
	if b := state("done"); b == nil || b.Rows != 25 || b.Finished.IsZero() || !b.Current {
		t.Fatalf("done: Backfill = %+v; want 25 rows, finished, current", b)
	}
	spec.Exclude = []string{"a", "b"}
	if _, err := e.s.Capture(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if b := state("after a new spec"); b == nil || b.Current {
		t.Fatalf("after a new spec: Backfill = %+v; want it read under an earlier spec", b)
	}
}
