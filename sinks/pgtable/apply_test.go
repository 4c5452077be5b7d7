package pgtable_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/sinks/pgtable"
)

// countingDB counts the statements a sink sends.
type countingDB struct {
	pgtable.DB
	execs atomic.Int64
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.execs.Add(1)
	return c.DB.Exec(ctx, sql, args...)
}

// TestMappedColumns: mapped values land typed; a document a column cannot
// hold is rejected alone, the reason naming the column, and the batch is
// still one statement.
func TestMappedColumns(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	db := &countingDB{DB: tg.pool}
	s, err := pgtable.New(t.Context(), db, pgtable.Options{Schema: tg.schema, Table: "orders", Create: true, Columns: []pgtable.Column{
		{Name: "qty", Path: "$.qty", Type: pgtable.TypeInteger},
		{Name: "total", Path: "$.total", Type: pgtable.TypeNumeric},
		{Name: "big", Type: pgtable.TypeBigint},
		{Name: "paid", Type: pgtable.TypeBoolean},
		{Name: "at", Type: pgtable.TypeTimestamptz},
		{Name: "who", Path: "$.customer.name", Type: pgtable.TypeText},
		{Name: "lines", Type: pgtable.TypeJSONB},
	}})
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{ // key → the column its rejection must name
		"b-qty-string":   "qty",
		"b-qty-fraction": "qty",
		"b-qty-range":    "qty",
		"b-big-range":    "big",
		"b-paid":         "paid",
		"b-at":           "at",
		"b-total":        "total",
		"b-who":          "who",
	}
	db.execs.Store(0)
	rej, err := s.Apply(t.Context(), []feed.Record{
		rec("ok", 1, `{"qty":3,"total":12.50,"big":9007199254740993,"paid":true,"at":"2024-05-01T10:00:00+02:00","customer":{"name":"Zoë"},"lines":[{"sku":"a"}]}`),
		rec("b-qty-string", 2, `{"qty":"3"}`),
		rec("b-qty-fraction", 3, `{"qty":1.5}`),
		rec("ok-exp", 4, `{"qty":1e3,"big":-9223372036854775808}`),
		rec("b-qty-range", 5, `{"qty":2147483648}`),
		rec("b-big-range", 6, `{"big":9223372036854775808}`),
		rec("b-paid", 7, `{"paid":"yes"}`),
		rec("b-at", 8, `{"at":"yesterday"}`),
		rec("b-total", 9, `{"total":"12"}`),
		rec("b-who", 10, `{"customer":{"name":{"first":"a"}}}`),
		rec("ok-nulls", 11, `{"qty":null,"customer":"not an object"}`),
	})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if n := db.execs.Load(); n != 1 {
		t.Errorf("a batch with rejections took %d statements, want 1", n)
	}
	got := map[string]string{}
	for _, r := range rej {
		got[string(r.Key)] = r.Reason
		if r.Seq == 0 {
			t.Errorf("rejection of %s has no seq", r.Key)
		}
	}
	for k, col := range bad {
		if !strings.Contains(got[k], fmt.Sprintf("column %q", col)) {
			t.Errorf("rejection of %s = %q, want one naming column %q", k, got[k], col)
		}
	}
	if len(rej) != len(bad) {
		t.Errorf("rejections = %+v, want exactly %d", rej, len(bad))
	}
	var qty, qtyExp *int32
	var total, who, lines, big, bigExp string
	var paid bool
	var at time.Time
	err = tg.read.QueryRow(t.Context(), `SELECT a.qty, a.total::text, a.big::text, a.paid, a.at, a.who, a.lines::text, e.qty, e.big::text
		FROM `+s.Table()+` a, `+s.Table()+` e WHERE a.key = 'ok' AND e.key = 'ok-exp'`).Scan(&qty, &total, &big, &paid, &at, &who, &lines, &qtyExp, &bigExp)
	if err != nil {
		t.Fatal(err)
	}
	if *qty != 3 || total != "12.50" || big != "9007199254740993" || !paid || !at.Equal(time.Date(2024, 5, 1, 8, 0, 0, 0, time.UTC)) || who != "Zoë" || lines != `[{"sku": "a"}]` {
		t.Errorf("mapped columns = %d %s %s %v %v %s %s", *qty, total, big, paid, at, who, lines)
	}
	if *qtyExp != 1000 || bigExp != "-9223372036854775808" {
		t.Errorf("1e3 → %d, min int64 → %s", *qtyExp, bigExp)
	}
	var nulls int
	if err := tg.read.QueryRow(t.Context(), `SELECT count(*) FROM `+s.Table()+` WHERE key = 'ok-nulls' AND qty IS NULL AND who IS NULL`).Scan(&nulls); err != nil || nulls != 1 {
		t.Errorf("null and unreachable paths: %d rows with NULLs, %v", nulls, err)
	}
	// A tombstone clears the mapped columns with the document.
	applyOK(t, s, rec("ok", 20, ""))
	if err := tg.read.QueryRow(t.Context(), `SELECT count(*) FROM `+s.Table()+` WHERE key = 'ok' AND doc IS NULL AND qty IS NULL AND seq = 20`).Scan(&nulls); err != nil || nulls != 1 {
		t.Errorf("after a tombstone: %d rows, %v", nulls, err)
	}
}

// TestServerRefusesRow: a row PostgreSQL refuses (here a constraint of the
// user's) is rejected alone, with SQLSTATE class 23 named, the rest applied.
func TestServerRefusesRow(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, pgtable.Options{Table: "u", Create: true, Columns: []pgtable.Column{{Name: "email", Type: pgtable.TypeText}}})
	tg.exec(t, `CREATE UNIQUE INDEX ON `+s.Table()+` (email)`)
	rej, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `{"email":"x@y"}`), rec("b", 2, `{"email":"x@y"}`), rec("c", 3, `{"email":"z@y"}`)})
	if err != nil || len(rej) != 1 || rej[0].Key != "b" || !strings.Contains(rej[0].Reason, "23505") {
		t.Fatalf("Apply = %+v, %v; want b rejected for its unique violation", rej, err)
	}
	got, err := tg.contents(t.Context(), "u")
	if err != nil || len(got) != 2 || got["a"] == nil || got["c"] == nil {
		t.Errorf("contents = %v, %v; want a and c", got, err)
	}
}

// TestFault: with the target gone, Apply, a resync's Apply and Publish are
// errors, never rejections; after restore the same calls leave everything.
func TestFault(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	applyOK(t, s, rec("a", 1, `{"n":1}`))
	r, err := s.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	batch := []feed.Record{rec("b", 2, `{"n":2}`), rec("a", 3, "")}
	restore := tg.fault(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if rej, err := s.Apply(ctx, batch); err == nil || len(rej) != 0 {
		t.Errorf("Apply with the target gone = %v, %v; want an error and no rejection", rej, err)
	}
	if rej, err := r.Apply(ctx, batch); err == nil || len(rej) != 0 {
		t.Errorf("resync Apply with the target gone = %v, %v; want an error and no rejection", rej, err)
	}
	if err := r.Publish(ctx); err == nil {
		t.Error("Publish with the target gone: no error")
	}
	restore()
	applyOK(t, s, batch...)
	if got, _ := tg.contents(t.Context(), "docs"); len(got) != 1 || got["b"] == nil {
		t.Errorf("after restore: %v, want b alone", got)
	}
	applyOK(t, r, batch...)
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, _ := tg.contents(t.Context(), "docs"); len(got) != 1 || got["b"] == nil {
		t.Errorf("after the resync's publish: %v, want b alone", got)
	}
}

// TestReopenAfterCrash: a resync a crashed process left half-filled is
// dropped by the next OpenResync of a sink built afresh, which starts empty.
func TestReopenAfterCrash(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	applyOK(t, s, rec("live", 1, `1`))
	// A reading role (a predefined one: roles are the cluster's, not the
	// test's) keeps its grant across the publish.
	tg.exec(t, `GRANT SELECT, UPDATE ON `+s.Table()+` TO pg_monitor`)
	r, err := s.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	applyOK(t, r, rec("half", 2, `2`)) // then the process dies
	s2 := tg.sink(t, harnessOptions)
	r2, err := s2.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	var tables int
	if err := tg.read.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, tg.schema).Scan(&tables); err != nil || tables != 2 {
		t.Errorf("tables after a second OpenResync = %d, %v; want the live one and one shadow", tables, err)
	}
	applyOK(t, r2, rec("fresh", 3, `3`))
	if err := r2.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, _ := tg.contents(t.Context(), "docs"); len(got) != 1 || got["fresh"] == nil {
		t.Errorf("after publish: %v, want fresh alone (nothing of the crashed resync)", got)
	}
	var sel, upd, del bool
	if err := tg.read.QueryRow(t.Context(), `SELECT has_table_privilege('pg_monitor', $1, 'SELECT'), has_table_privilege('pg_monitor', $1, 'UPDATE'),
		has_table_privilege('pg_monitor', $1, 'DELETE')`, s.Table()).Scan(&sel, &upd, &del); err != nil || !sel || !upd || del {
		t.Errorf("pg_monitor's privileges after publish: select %v, update %v, delete %v (%v); want select and update", sel, upd, del, err)
	}
	var indexes []string
	rows, err := tg.read.Query(t.Context(), `SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY 1`, tg.schema)
	if err == nil {
		for rows.Next() {
			var n string
			_ = rows.Scan(&n)
			indexes = append(indexes, n)
		}
		err = rows.Err()
	}
	if err != nil || len(indexes) != 1 || indexes[0] != "docs_pkey" {
		t.Errorf("indexes after publish = %v, %v; want the live table's own name, docs_pkey", indexes, err)
	}
	// The stale resync's shadow is gone: its calls are errors.
	if _, err := r.Apply(t.Context(), []feed.Record{rec("x", 9, `9`)}); err == nil {
		t.Error("Apply to a dropped shadow: no error")
	}
}

// TestAtomicPublish: readers in a loop while Publish runs see the old copy
// or the new one, never a mix, an empty table or a missing one.
func TestAtomicPublish(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	var old, fresh []feed.Record
	for i := range 200 {
		old = append(old, rec(fmt.Sprintf("k%03d", i), feed.Seq(i+1), `"old"`))
		fresh = append(fresh, rec(fmt.Sprintf("k%03d", i+100), feed.Seq(i+1000), `"new"`))
	}
	applyOK(t, s, old...)
	for round := range 3 {
		r, err := s.OpenResync(t.Context(), feed.Generation(round+2))
		if err != nil {
			t.Fatal(err)
		}
		applyOK(t, r, fresh...)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var reads atomic.Int64
		errs := make(chan error, 4)
		var alive atomic.Int64
		alive.Store(2)
		for range 2 {
			wg.Go(func() {
				defer alive.Add(-1)
				for {
					select {
					case <-stop:
						return
					default:
					}
					got, err := tg.contents(t.Context(), "docs")
					if err != nil {
						errs <- err
						return
					}
					reads.Add(1)
					kinds := map[string]int{}
					for _, d := range got {
						kinds[string(d)]++
					}
					if len(got) != 200 || len(kinds) != 1 {
						errs <- fmt.Errorf("a reader saw %d documents of %d versions", len(got), len(kinds))
						return
					}
				}
			})
		}
		// Readers that fail stop, so the waits below end with them.
		for reads.Load() < 2 && alive.Load() == 2 {
			time.Sleep(time.Millisecond)
		}
		err = r.Publish(t.Context())
		for n := reads.Load(); reads.Load() < n+2 && alive.Load() == 2; {
			time.Sleep(time.Millisecond)
		}
		close(stop)
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		if err != nil {
			t.Fatal(err)
		}
		old, fresh = fresh, old
		for i := range fresh {
			fresh[i].Seq += 10000 * feed.Seq(round+1)
		}
	}
}

// TestAwkwardRecords: keys and documents that are hard on a target
// round-trip: RunSink's extended cases, until the suite has them.
func TestAwkwardRecords(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	big := `{"blob":"` + strings.Repeat("x", 1<<20) + `"}`
	edge := `[1e131071, -1e131071, 0.` + strings.Repeat("0", 16382) + `1, 123456789012345678901234567890.5]`
	recs := []feed.Record{}
	want := map[string]string{}
	for i, k := range []string{".", "/", "a:b", "*", ">", "%", "with space", `'"quoted"'`, "😀 emoji", "日本語", strings.Repeat("k", feed.MaxKeyLen)} {
		d := fmt.Sprintf(`{"i":%d,"nested":{"a":[{"b":"ü"}]}}`, i)
		recs = append(recs, rec(k, feed.Seq(i+1), d))
		want[k] = d
	}
	recs = append(recs, rec("big", 100, big), rec("edge", 101, edge))
	want["big"], want["edge"] = big, edge
	applyOK(t, s, recs...)
	got, err := tg.contents(t.Context(), "docs")
	if err != nil {
		t.Fatal(err)
	}
	for k, d := range want {
		if !feedtest.JSONEqual(got[feed.Key(k)], []byte(d)) {
			t.Errorf("%.20q: stored %.60s, want %.60s", k, got[feed.Key(k)], d)
		}
	}
	if len(got) != len(want) {
		t.Errorf("stored %d documents, want %d", len(got), len(want))
	}
}

// TestErrorsAreNotRejections: a statement that fails for a reason of the
// database (here its table is gone) is an error, the batch not rejected.
func TestErrorsAreNotRejections(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	tg.exec(t, `DROP TABLE `+s.Table())
	rej, err := s.Apply(t.Context(), []feed.Record{rec("a", 1, `1`), rec("b", 2, `2`)})
	var pe *pgconn.PgError
	if len(rej) != 0 || !errors.As(err, &pe) || pe.Code != "42P01" {
		t.Errorf("Apply to a dropped table = %v, %v; want the 42P01 error and no rejection", rej, err)
	}
}

// TestNoResurrection: a tombstone's seq is remembered, so an older document
// arriving after a newer delete (a stale call) does not bring the key back,
// in the live table and in a resync's.
func TestNoResurrection(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	check := func(what string, a interface {
		Apply(context.Context, []feed.Record) ([]feed.Rejection, error)
	}, published bool) {
		applyOK(t, a, rec("a", 1, `"a1"`))
		applyOK(t, a, rec("a", 5, ""), rec("never", 6, ""))
		applyOK(t, a, rec("a", 3, `"a3"`), rec("never", 4, `"n4"`)) // stale
		if published {
			if got, _ := tg.contents(t.Context(), "docs"); len(got) != 0 {
				t.Errorf("%s: after a stale put older than the deletes: %v, want nothing", what, got)
			}
		}
	}
	check("live", s, true)
	r, err := s.OpenResync(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	check("resync", r, false)
	if err := r.Publish(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, _ := tg.contents(t.Context(), "docs"); len(got) != 0 {
		t.Errorf("after publishing a resync with a stale put: %v, want nothing", got)
	}
}

// TestTimeoutIsAnError: a statement that cannot finish in time (its table
// locked by another session) is an error, the batch not rejected.
func TestTimeoutIsAnError(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	tx, err := tg.read.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `LOCK TABLE `+s.Table()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if rej, err := s.Apply(ctx, []feed.Record{rec("a", 1, `1`), rec("b", 2, `2`)}); err == nil || len(rej) != 0 {
		t.Errorf("Apply against a locked table = %v, %v; want an error and no rejection", rej, err)
	}
}

// TestRacingApplies: calls racing on the same keys with different seqs end
// with each key's highest seq.
func TestRacingApplies(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, harnessOptions)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for round := range 20 {
				var batch []feed.Record
				for k := range 50 {
					seq := feed.Seq(round*4 + w + 1)
					batch = append(batch, rec(fmt.Sprintf("k%02d", k), seq, fmt.Sprintf(`{"n":%d}`, seq)))
				}
				if rej, err := s.Apply(t.Context(), batch); err != nil || len(rej) != 0 {
					t.Errorf("Apply = %v, %v", rej, err)
					return
				}
			}
		})
	}
	wg.Wait()
	var wrong int
	if err := tg.read.QueryRow(t.Context(), `SELECT count(*) FROM `+s.Table()+` WHERE seq <> 80 OR n <> 80`).Scan(&wrong); err != nil || wrong != 0 {
		t.Errorf("%d keys did not end at the highest seq (%v)", wrong, err)
	}
}
