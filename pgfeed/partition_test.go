package pgfeed_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/pgfeed"
)

// partitionedDDL is a partitioned table two levels deep: orders by region,
// eu a leaf, us partitioned again by id range, and a plain table beside it.
const partitionedDDL = `CREATE TABLE %[1]s.orders (id int NOT NULL, region text NOT NULL, qty int NOT NULL DEFAULT 0,
		PRIMARY KEY (id, region)) PARTITION BY LIST (region);
	CREATE TABLE %[1]s.orders_eu PARTITION OF %[1]s.orders FOR VALUES IN ('eu');
	CREATE TABLE %[1]s.orders_us PARTITION OF %[1]s.orders FOR VALUES IN ('us') PARTITION BY RANGE (id);
	CREATE TABLE %[1]s.orders_us_low PARTITION OF %[1]s.orders_us FOR VALUES FROM (MINVALUE) TO (1000);
	CREATE TABLE %[1]s.orders_us_high PARTITION OF %[1]s.orders_us FOR VALUES FROM (1000) TO (MAXVALUE);
	CREATE TABLE %[1]s.plain (id int PRIMARY KEY, v text)`

// ordersTable is the documents the orders feed must hold.
func (e capEnv) ordersTable() string {
	return `SELECT id::text || '/' || region, to_jsonb(r)::text FROM ` + e.q("orders") + ` AS r`
}

// countTriggers counts the user triggers on table (a name of e's schema).
func (e capEnv) countTriggers(t testing.TB, table string) int {
	t.Helper()
	var n int
	if err := e.d.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal`, e.q(table)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCapturePartitionedEveryWrite drives every kind of write at a
// captured partitioned table, naming the partitioned table, a leaf, and a
// partitioned partition, and checks after each that the feed's documents
// are the table's rows and that the statement wrote each key it changed
// once (in the locked mode the head moves once per key written, so a
// write captured twice, by the parent's triggers and a partition's, moves
// it twice). Rows moved between partitions leave a tombstone for the old
// key; a TRUNCATE of a partition tombstones its rows, one of the
// partitioned table moves the feed to a new generation. Both write modes.
func TestCapturePartitionedEveryWrite(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, partitionedDDL)
			e.concurrent = mode == feed.WriteConcurrent
			partitionedEveryWrite(t, e)
		})
	}
}

func partitionedEveryWrite(t *testing.T, e capEnv) {
	ctx := t.Context()
	const f = feed.FeedName("orders")
	e.inMode(t, f)
	e.inMode(t, "plain")
	info, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Changed || !slices.Equal(info.Key, []string{"id", "region"}) || len(info.Uncovered)+len(info.Stray) != 0 {
		t.Fatalf("Capture = %+v; want a change keyed on (id, region) with no gaps", info)
	}
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: "plain", Schema: e.d.schema, Table: "plain"}); err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]int{"orders": 5, "orders_eu": 4, "orders_us": 4, "orders_us_low": 4, "orders_us_high": 4} {
		if n := e.countTriggers(t, table); n != want {
			t.Fatalf("table %s has %d triggers; want %d", table, n, want)
		}
	}
	table := e.ordersTable()
	step := func(name string, wantMoved int64, sql string, args ...any) {
		t.Helper()
		_, before := e.head(t, f)
		e.exec(t, sql, args...)
		if _, after := e.head(t, f); int64(after-before) != wantMoved {
			t.Fatalf("%s: the head moved by %d; want %d", name, after-before, wantMoved)
		}
		e.same(t, name, f, e.want(t, table))
	}
	tombstones := func(name string, want ...string) {
		t.Helper()
		if got := e.tombstones(t, f); !slices.Equal(got, want) {
			t.Fatalf("%s: the tombstones are %q; want %q", name, got, want)
		}
	}
	refused := func(name, says, sql string) {
		t.Helper()
		g0, h0 := e.head(t, f)
		before := e.feedRows(t, f)
		_, err := e.d.pool.Exec(ctx, sql)
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Fatalf("%s = %v; want PostgreSQL's refusal saying %q", name, err, says)
		}
		if g, h := e.head(t, f); g != g0 || h != h0 || len(e.feedRows(t, f)) != len(before) {
			t.Fatalf("%s: refused, yet the feed moved from (%d, %d) to (%d, %d)", name, g0, h0, g, h)
		}
	}
	orders, eu, us, usLow := e.q("orders"), e.q("orders_eu"), e.q("orders_us"), e.q("orders_us_low")

	// Through the partitioned table.
	step("insert through the parent", 1, `INSERT INTO `+orders+` VALUES (1, 'eu', 1)`)
	step("multi-row insert through the parent", 3, `INSERT INTO `+orders+` VALUES (2, 'eu', 2), (3, 'us', 3), (1500, 'us', 4)`)
	step("update of every row through the parent", 4, `UPDATE `+orders+` SET qty = qty + 10`)
	step("update through the parent moving a row to another partition", 2, `UPDATE `+orders+` SET region = 'us' WHERE id = 2`)
	tombstones("after the move", "2/eu")
	step("update through the parent moving a row between sub-partitions", 2, `UPDATE `+orders+` SET id = 1003 WHERE id = 3`)
	tombstones("after the second move", "2/eu", "3/us")
	step("insert on conflict through the parent", 2, `INSERT INTO `+orders+` VALUES (1, 'eu', 100), (5, 'eu', 5)
		ON CONFLICT (id, region) DO UPDATE SET qty = excluded.qty`)
	step("merge through the parent", 2, `MERGE INTO `+orders+` AS o USING (VALUES (1, 'eu', 7), (6, 'us', 6)) AS s(id, region, qty)
		ON o.id = s.id AND o.region = s.region
		WHEN MATCHED THEN UPDATE SET qty = s.qty WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.region, s.qty)`)
	copyInto := func(name, table string, rows [][]any) {
		t.Helper()
		_, before := e.head(t, f)
		n, err := e.d.pool.CopyFrom(ctx, pgx.Identifier{e.d.schema, table}, []string{"id", "region", "qty"}, pgx.CopyFromRows(rows))
		if err != nil || n != int64(len(rows)) {
			t.Fatalf("%s: CopyFrom = %d, %v", name, n, err)
		}
		if _, after := e.head(t, f); int64(after-before) != n {
			t.Fatalf("%s moved the head by %d; want %d", name, after-before, n)
		}
		e.same(t, name, f, e.want(t, e.ordersTable()))
	}
	copyInto("copy through the parent", "orders", [][]any{{int32(7), "eu", int32(7)}, {int32(2007), "us", int32(7)}})
	step("delete through the parent", 2, `DELETE FROM `+orders+` WHERE id IN (5, 6)`)

	// Through a leaf.
	step("insert through a leaf", 1, `INSERT INTO `+eu+` VALUES (10, 'eu', 10)`)
	step("update through a leaf", 3, `UPDATE `+eu+` SET qty = qty + 1`)
	refused("update through a leaf moving a row out of it", "violates partition constraint", `UPDATE `+eu+` SET region = 'us' WHERE id = 10`)
	step("insert on conflict through a leaf", 2, `INSERT INTO `+eu+` VALUES (10, 'eu', 0), (11, 'eu', 11)
		ON CONFLICT (id, region) DO UPDATE SET qty = excluded.qty`)
	step("merge through a leaf", 2, `MERGE INTO `+eu+` AS o USING (VALUES (10, 'eu', 9), (12, 'eu', 12)) AS s(id, region, qty)
		ON o.id = s.id AND o.region = s.region
		WHEN MATCHED THEN UPDATE SET qty = s.qty WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.region, s.qty)`)
	copyInto("copy into a leaf", "orders_us_low", [][]any{{int32(20), "us", int32(20)}, {int32(21), "us", int32(21)}})
	step("delete through a leaf", 1, `DELETE FROM `+usLow+` WHERE id = 21`)

	// Through a partitioned partition.
	step("insert through a sub-partitioned table", 2, `INSERT INTO `+us+` VALUES (30, 'us', 30), (3000, 'us', 30)`)
	step("update through a sub-partitioned table moving a row between its partitions", 2, `UPDATE `+us+` SET id = 1030 WHERE id = 30`)
	refused("update through a sub-partitioned table moving a row out of it", "violates partition constraint", `UPDATE `+us+` SET region = 'eu' WHERE id = 1030`)
	step("insert on conflict through a sub-partitioned table", 2, `INSERT INTO `+us+` VALUES (1030, 'us', 0), (31, 'us', 31)
		ON CONFLICT (id, region) DO UPDATE SET qty = excluded.qty`)
	step("merge through a sub-partitioned table", 1, `MERGE INTO `+us+` AS o USING (VALUES (31, 'us', 1)) AS s(id, region, qty)
		ON o.id = s.id AND o.region = s.region WHEN MATCHED THEN DELETE`)
	copyInto("copy into a sub-partitioned table", "orders_us", [][]any{{int32(40), "us", int32(40)}, {int32(4000), "us", int32(40)}})
	step("delete through a sub-partitioned table", 2, `DELETE FROM `+us+` WHERE id IN (40, 4000)`)

	// A rolled-back transaction leaves nothing; a rolled-back savepoint
	// leaves nothing of its part.
	g0, h0 := e.head(t, f)
	err = pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		for _, sql := range []string{`INSERT INTO ` + orders + ` VALUES (50, 'eu', 0)`, `DELETE FROM ` + eu + ` WHERE id = 10`, `UPDATE ` + us + ` SET qty = 0`} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return errors.New("roll back")
	})
	if err == nil || err.Error() != "roll back" {
		t.Fatal(err)
	}
	if g, h := e.head(t, f); g != g0 || h != h0 {
		t.Fatalf("a rollback moved the feed from (%d, %d) to (%d, %d)", g0, h0, g, h)
	}
	e.same(t, "rollback", f, e.want(t, table))
	err = pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+eu+` VALUES (60, 'eu', 0)`); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		for _, sql := range []string{`INSERT INTO ` + orders + ` VALUES (61, 'us', 0)`, `DELETE FROM ` + us + ` WHERE id = 1030`, `TRUNCATE ` + eu} {
			if _, err := sp.Exec(ctx, sql); err != nil {
				return err
			}
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

	// TRUNCATE of a leaf tombstones its rows, in the same generation.
	leafKeys := func(table string) []string {
		var keys []string
		for k := range e.want(t, `SELECT id::text || '/' || region, '' FROM `+e.q(table)) {
			keys = append(keys, k)
		}
		return keys
	}
	g0, _ = e.head(t, f)
	gone := leafKeys("orders_eu")
	step("truncate of a leaf", int64(len(gone)), `TRUNCATE `+eu)
	for _, k := range gone {
		if r, ok := e.feedRows(t, f)[k]; !ok || r.doc != nil {
			t.Fatalf("after the leaf's TRUNCATE key %s is %+v; want a tombstone", k, r)
		}
	}
	// Of a sub-partitioned table: its partitions' rows.
	gone = leafKeys("orders_us")
	step("truncate of a sub-partitioned table", int64(len(gone)), `TRUNCATE `+us)
	// Of a leaf and a plain table captured into another feed: the leaf's
	// rows tombstoned, the plain table's feed in a new generation.
	e.exec(t, `INSERT INTO `+orders+` VALUES (70, 'eu', 0), (71, 'us', 0); INSERT INTO `+e.q("plain")+` VALUES (1, 'x')`)
	pg0, _ := e.head(t, "plain")
	step("truncate of a leaf and a plain table", 1, `TRUNCATE `+eu+`, `+e.q("plain"))
	if g, _ := e.head(t, f); g != g0 {
		t.Fatalf("TRUNCATEs of partitions moved the generation from %d to %d", g0, g)
	}
	if g, _ := e.head(t, "plain"); g != pg0+1 || len(e.feedRows(t, "plain")) != 0 {
		t.Fatalf("the plain table's TRUNCATE left its feed at generation %d with %d rows; want %d and none", g, len(e.feedRows(t, "plain")), pg0+1)
	}
	refused("truncate only of the partitioned table", "cannot truncate only a partitioned table", `TRUNCATE ONLY `+orders)

	// Of the partitioned table: a new generation, emptied, and its
	// partitions' triggers write nothing (no tombstone moves the head).
	// A TRUNCATE of a partition later in the same transaction tombstones
	// again.
	e.exec(t, `INSERT INTO `+orders+` VALUES (80, 'eu', 0), (81, 'us', 0)`)
	_, h0 = e.head(t, f)
	step("truncate of the partitioned table", 0, `TRUNCATE `+orders)
	if g, _ := e.head(t, f); g != g0+1 {
		t.Fatalf("the partitioned table's TRUNCATE left the generation at %d; want %d", g, g0+1)
	}
	tombstones("after the partitioned table's TRUNCATE")
	if _, h := e.head(t, f); h != h0 {
		t.Fatalf("the partitioned table's TRUNCATE moved the head from %d to %d: its partitions' triggers tombstoned rows the reset removes anyway", h0, h)
	}
	err = pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		for _, sql := range []string{`INSERT INTO ` + orders + ` VALUES (90, 'eu', 0)`, `TRUNCATE ` + orders,
			`INSERT INTO ` + orders + ` VALUES (91, 'eu', 0), (92, 'us', 0)`, `TRUNCATE ` + eu} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.same(t, "truncate of the partitioned table, then of a leaf, in one transaction", f, e.want(t, table))
	tombstones("after the leaf's TRUNCATE following the parent's", "91/eu")
	if g, _ := e.head(t, f); g != g0+2 {
		t.Fatalf("the generation is %d; want %d", g, g0+2)
	}
	// A leaf named before its partitioned table: its trigger fires before
	// the partitioned table's and tombstones its rows, which the reset then
	// removes: the new generation has nothing of it.
	e.exec(t, `INSERT INTO `+orders+` VALUES (100, 'eu', 0), (101, 'us', 0)`)
	e.exec(t, `TRUNCATE `+eu+`, `+orders)
	e.same(t, "truncate of a leaf and its partitioned table", f, e.want(t, table))
	tombstones("after the TRUNCATE of a leaf and its partitioned table")
	if g, _ := e.head(t, f); g != g0+3 {
		t.Fatalf("the generation is %d; want %d", g, g0+3)
	}
}

// TestCapturePartitionsChange: partitions created, attached, detached,
// and triggers disabled after Capture are gaps that Captures reports and
// Backfill refuses, naming the table, until Capture runs again and closes
// them; a disabled trigger of a plain table is a gap too.
func TestCapturePartitionsChange(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, partitionedDDL)
	ctx := t.Context()
	const f = feed.FeedName("orders")
	spec := pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "orders"}
	first, err := e.s.Capture(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	quiet := pgfeed.BackfillOptions{Feed: f, Progress: func(pgfeed.BackfillProgress) {}}
	s := e.d.schema
	gaps := func(step string, feedName feed.FeedName, uncovered, stray []string) {
		t.Helper()
		list, err := e.s.Captures(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ci := range list {
			if ci.Feed != feedName {
				continue
			}
			if !slices.Equal(ci.Uncovered, uncovered) || !slices.Equal(ci.Stray, stray) {
				t.Fatalf("%s: Captures has uncovered %q and stray %q; want %q and %q", step, ci.Uncovered, ci.Stray, uncovered, stray)
			}
			return
		}
		t.Fatalf("%s: Captures has no feed %s", step, feedName)
	}
	refused := func(step, says string) {
		t.Helper()
		_, err := e.s.Backfill(ctx, quiet)
		var inv *feed.InvalidError
		if !errors.As(err, &inv) || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "run Capture again") {
			t.Fatalf("%s: Backfill = %v; want a refusal naming %s and saying run Capture again", step, err, says)
		}
	}
	recapture := func(step string) pgfeed.CaptureInfo {
		t.Helper()
		info, err := e.s.Capture(ctx, spec)
		if err != nil || !info.Changed || len(info.Uncovered)+len(info.Stray) != 0 {
			t.Fatalf("%s: Capture again = %+v, %v; want a change that leaves no gap", step, info, err)
		}
		gaps(step+", captured again", f, nil, nil)
		// As a new generation: the rows of a detached partition leave the
		// feed only so.
		if _, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: f, NewGeneration: true, Progress: func(pgfeed.BackfillProgress) {}}); err != nil {
			t.Fatalf("%s: Backfill after Capture again: %v", step, err)
		}
		e.same(t, step+", backfilled", f, e.want(t, e.ordersTable()))
		return info
	}
	gaps("captured", f, nil, nil)

	// A partition created under the table.
	e.exec(t, `CREATE TABLE `+e.q("orders_as")+` PARTITION OF `+e.q("orders")+` FOR VALUES IN ('as');
		INSERT INTO `+e.q("orders_as")+` VALUES (1, 'as', 1)`)
	gaps("a partition created", f, []string{s + ".orders_as"}, nil)
	refused("a partition created", s+".orders_as")
	info := recapture("a partition created")
	if info.Version == first.Version {
		t.Fatalf("the version %s did not change with a new partition", info.Version)
	}
	if again, err := e.s.Capture(ctx, spec); err != nil || again.Changed {
		t.Fatalf("a repeated Capture = %+v, %v; want no change", again, err)
	}
	_, h := e.head(t, f)
	e.exec(t, `UPDATE `+e.q("orders_as")+` SET qty = 2`)
	if _, h2 := e.head(t, f); h2 != h+1 {
		t.Fatalf("an update of the new partition moved the head from %d to %d; want one move", h, h2)
	}

	// A table with rows attached, one level down.
	e.exec(t, `CREATE TABLE `+e.q("orders_us_mid")+` (LIKE `+e.q("orders")+`);
		INSERT INTO `+e.q("orders_us_mid")+` VALUES (1000, 'us', 1), (1001, 'us', 2);
		ALTER TABLE `+e.q("orders_us_high")+` RENAME TO orders_us_top;
		ALTER TABLE `+e.q("orders_us")+` DETACH PARTITION `+e.q("orders_us_top")+`;
		ALTER TABLE `+e.q("orders_us")+` ATTACH PARTITION `+e.q("orders_us_mid")+` FOR VALUES FROM (1000) TO (2000)`)
	gaps("a partition attached and one detached", f, []string{s + ".orders_us_mid"}, []string{s + ".orders_us_top"})
	refused("a partition attached", s+".orders_us_mid")
	recapture("a partition attached and one detached")
	if n := e.countTriggers(t, "orders_us_top"); n != 0 {
		t.Fatalf("the detached partition kept %d triggers after Capture again", n)
	}
	_, h = e.head(t, f)
	e.exec(t, `INSERT INTO `+e.q("orders_us_top")+` VALUES (5000, 'us', 0)`)
	if _, h2 := e.head(t, f); h2 != h {
		t.Fatalf("a write to the detached partition moved the head from %d to %d", h, h2)
	}

	// Only detached: the stray table alone is the gap.
	e.exec(t, `ALTER TABLE `+e.q("orders")+` DETACH PARTITION `+e.q("orders_as"))
	gaps("a partition detached", f, nil, []string{s + ".orders_as"})
	refused("a partition detached", s+".orders_as")
	recapture("a partition detached")

	// A trigger disabled: the partition is uncovered.
	e.exec(t, `ALTER TABLE `+e.q("orders_eu")+` DISABLE TRIGGER USER`)
	gaps("a partition's triggers disabled", f, []string{s + ".orders_eu"}, nil)
	refused("a partition's triggers disabled", s+".orders_eu")
	recapture("a partition's triggers disabled")

	// A plain table's disabled trigger is a gap as well.
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: "plain", Schema: s, Table: "plain"}); err != nil {
		t.Fatal(err)
	}
	var name string
	if err := e.d.pool.QueryRow(ctx, `SELECT tgname FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname LIKE '%_update'`, e.q("plain")).Scan(&name); err != nil {
		t.Fatal(err)
	}
	e.exec(t, `ALTER TABLE `+e.q("plain")+` DISABLE TRIGGER `+pgx.Identifier{name}.Sanitize())
	gaps("a plain table's trigger disabled", "plain", []string{s + ".plain"}, nil)
	if _, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "plain", Progress: func(pgfeed.BackfillProgress) {}}); err == nil || !strings.Contains(err.Error(), "run Capture again") {
		t.Fatalf("Backfill of a plain table with a disabled trigger = %v; want a refusal", err)
	}
	if info, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: "plain", Schema: s, Table: "plain"}); err != nil || !info.Changed {
		t.Fatalf("Capture again = %+v, %v; want a change", info, err)
	}
	gaps("a plain table captured again", "plain", nil, nil)
}

// TestCapturePartitionedSQLAndUncapture: the printed script puts the
// triggers on every partition, run by hand it leaves Capture nothing to
// do, and Uncapture removes the triggers from every partition.
func TestCapturePartitionedSQLAndUncapture(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, partitionedDDL)
	ctx := t.Context()
	spec := pgfeed.CaptureSpec{Feed: "orders", Schema: e.d.schema, Table: "orders"}
	script, err := e.s.CaptureSQL(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"orders", "orders_eu", "orders_us", "orders_us_low", "orders_us_high"} {
		if !strings.Contains(script, "AFTER INSERT ON "+pgx.Identifier{e.d.schema, table}.Sanitize()+" REFERENCING") {
			t.Fatalf("the script has no insert trigger on %s:\n%s", table, script)
		}
	}
	if n := strings.Count(script, "CREATE TRIGGER"); n != 5+4*4 {
		t.Fatalf("the script creates %d triggers; want 21", n)
	}
	if err := pgx.BeginFunc(ctx, e.d.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
		return err
	}); err != nil {
		t.Fatalf("running the script: %v", err)
	}
	if info, err := e.s.Capture(ctx, spec); err != nil || info.Changed {
		t.Fatalf("Capture after the script = %+v, %v; want no change", info, err)
	}
	e.exec(t, `INSERT INTO `+e.q("orders_us_low")+` VALUES (1, 'us', 1)`)
	e.same(t, "script", "orders", e.want(t, e.ordersTable()))

	if ok, err := e.s.Uncapture(ctx, "orders"); !ok || err != nil {
		t.Fatalf("Uncapture = %v, %v", ok, err)
	}
	for _, table := range []string{"orders", "orders_eu", "orders_us", "orders_us_low", "orders_us_high"} {
		if n := e.countTriggers(t, table); n != 0 {
			t.Fatalf("after Uncapture table %s has %d triggers", table, n)
		}
	}
	_, h := e.head(t, "orders")
	e.exec(t, `INSERT INTO `+e.q("orders")+` VALUES (2, 'eu', 1); INSERT INTO `+e.q("orders_eu")+` VALUES (3, 'eu', 1); TRUNCATE `+e.q("orders_us"))
	if _, h2 := e.head(t, "orders"); h2 != h {
		t.Fatalf("after Uncapture writes moved the head from %d to %d", h, h2)
	}
}

// TestCaptureMovedThenBackfill: a capture moved to another table backfills
// at once, and the tables it left, partitions included, lose their
// triggers. (The version once hashed the drop of the earlier table's
// triggers, which the Backfill's own resolution no longer saw, so it
// refused until a second Capture.)
func TestCaptureMovedThenBackfill(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, partitionedDDL+`;
		CREATE TABLE %[1]s.other (id int PRIMARY KEY, v text);
		INSERT INTO %[1]s.other VALUES (1, 'a'), (2, 'b')`)
	ctx := t.Context()
	const f = feed.FeedName("moved")
	quiet := pgfeed.BackfillOptions{Feed: f, Progress: func(pgfeed.BackfillProgress) {}}
	for _, table := range []string{"plain", "other", "orders", "plain"} {
		info, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: table})
		if err != nil || !info.Changed {
			t.Fatalf("Capture of %s = %+v, %v; want a change", table, info, err)
		}
		if _, err := e.s.Backfill(ctx, quiet); err != nil {
			t.Fatalf("Backfill right after moving the capture to %s: %v", table, err)
		}
		list, err := e.s.Captures(ctx)
		if err != nil || len(list) != 1 || list[0].Table != table || len(list[0].Uncovered)+len(list[0].Stray) != 0 {
			t.Fatalf("Captures = %+v, %v; want the capture of %s with no gaps", list, err, table)
		}
	}
	for _, table := range []string{"other", "orders", "orders_eu", "orders_us", "orders_us_low", "orders_us_high"} {
		if n := e.countTriggers(t, table); n != 0 {
			t.Fatalf("table %s, captured earlier, kept %d triggers", table, n)
		}
	}
}

// TestCapturePartitionedBackfill: a backfill of a partitioned table reads
// every partition through the parent, in place and as a new generation, in
// both write modes.
func TestCapturePartitionedBackfill(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, partitionedDDL+`;
				INSERT INTO %[1]s.orders SELECT i, CASE WHEN i %% 2 = 0 THEN 'eu' ELSE 'us' END, i FROM generate_series(1, 2500) AS i`)
			e.concurrent = mode == feed.WriteConcurrent
			ctx := t.Context()
			const f = feed.FeedName("orders")
			e.inMode(t, f)
			if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: f, Schema: e.d.schema, Table: "orders"}); err != nil {
				t.Fatal(err)
			}
			res, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: f, BatchSize: 300, Progress: func(pgfeed.BackfillProgress) {}})
			if err != nil || res.Rows != 2500 {
				t.Fatalf("Backfill = %+v, %v; want 2500 rows", res, err)
			}
			e.same(t, "in place", f, e.want(t, e.ordersTable()))
			e.exec(t, `DELETE FROM `+e.q("orders_eu")+` WHERE id < 100; UPDATE `+e.q("orders_us")+` SET qty = 0 WHERE id > 2000`)
			g0, _ := e.head(t, f)
			res, err = e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: f, BatchSize: 700, NewGeneration: true, Progress: func(pgfeed.BackfillProgress) {}})
			if err != nil || res.Generation != g0+1 {
				t.Fatalf("Backfill as a new generation = %+v, %v; want generation %d", res, err, g0+1)
			}
			e.same(t, "new generation", f, e.want(t, e.ordersTable()))
			if ts := e.tombstones(t, f); len(ts) != 0 {
				t.Fatalf("the new generation has tombstones %q", ts)
			}
		})
	}
}

// TestCapturePartitionedBadInput: a partition alone, a key only a
// partition's index or an invalid index covers, and either end of an
// inheritance tree are refused, naming what to do or why, and leave no
// trigger anywhere.
func TestCapturePartitionedBadInput(t *testing.T) {
	t.Parallel()
	e := newCapEnv(t, partitionedDDL+`;
		CREATE UNIQUE INDEX ON %[1]s.orders_eu (id);
		CREATE TABLE %[1]s.halfway (id int NOT NULL, r text NOT NULL) PARTITION BY LIST (r);
		CREATE TABLE %[1]s.halfway_a PARTITION OF %[1]s.halfway FOR VALUES IN ('a');
		CREATE UNIQUE INDEX halfway_key ON ONLY %[1]s.halfway (id, r);
		CREATE TABLE %[1]s.ih (id int PRIMARY KEY, v text);
		CREATE TABLE %[1]s.ic (extra int, PRIMARY KEY (id)) INHERITS (%[1]s.ih)`)
	ctx := t.Context()
	s := e.d.schema
	q := func(table string) string { return pgx.Identifier{s, table}.Sanitize() }
	for _, c := range []struct {
		name  string
		spec  pgfeed.CaptureSpec
		field string
		says  []string
	}{
		{"a leaf alone", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "orders_eu"}, "spec.table", []string{"a partition of " + q("orders"), "capture " + q("orders")}},
		{"a sub-partitioned table alone", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "orders_us"}, "spec.table", []string{"a partition of " + q("orders")}},
		{"a leaf of a sub-partitioned table alone", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "orders_us_low"}, "spec.table", []string{"a partition of " + q("orders")}},
		{"a key only a partition's index covers", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "orders", Key: []string{"id"}}, "spec.key", []string{"no unique index", "a partition's own index"}},
		{"a key only an invalid index covers", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "halfway", Key: []string{"id", "r"}}, "spec.key", []string{"no unique index", "ON ONLY"}},
		{"a partitioned table without a primary key", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "halfway"}, "spec.key", []string{"no primary key"}},
		{"an inheritance parent", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "ih"}, "spec.table", []string{"has inheritance children (" + q("ic") + ")"}},
		{"an inheritance child", pgfeed.CaptureSpec{Feed: "f", Schema: s, Table: "ic"}, "spec.table", []string{"an inheritance child of " + q("ih")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.s.Capture(ctx, c.spec)
			var inv *feed.InvalidError
			if !errors.As(err, &inv) || !strings.Contains(err.Error(), c.field+":") {
				t.Fatalf("Capture = %v; want an InvalidError on %s", err, c.field)
			}
			for _, says := range c.says {
				if !strings.Contains(err.Error(), says) {
					t.Fatalf("Capture = %v; want it to say %q", err, says)
				}
			}
			if _, err := e.s.CaptureSQL(ctx, c.spec); err == nil {
				t.Fatal("CaptureSQL accepted what Capture refused")
			}
		})
	}
	var triggers, captures int
	if err := e.d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
			WHERE c.relnamespace = $1::regnamespace AND NOT g.tgisinternal),
		(SELECT count(*) FROM `+e.q("feed_captures")+`)`, pgx.Identifier{s}.Sanitize()).Scan(&triggers, &captures); err != nil {
		t.Fatal(err)
	}
	if triggers != 0 || captures != 0 {
		t.Fatalf("refused specs left %d triggers and %d captures", triggers, captures)
	}
}
