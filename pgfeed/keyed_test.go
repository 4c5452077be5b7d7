package pgfeed_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// keyedEnv is a table t(id int PRIMARY KEY, v text) of rows 1..n captured
// into feed t in the concurrent mode, so its trigger records keys (see the
// package doc's # Keyed capture); nothing is sealed yet.
func keyedEnv(t *testing.T, n int) (capEnv, string) {
	t.Helper()
	e, table := backfillEnvIn(t, 0, capModes[1])
	if n > 0 {
		e.exec(t, fmt.Sprintf(`INSERT INTO %s SELECT i, 'v' || i FROM generate_series(1, %d) AS i`, e.q("t"), n))
	}
	return e, table
}

// recorded counts f's recorded keys and whether f's document function
// exists.
func (e capEnv) recorded(t testing.TB, f feed.FeedName) (keys int64, docs bool) {
	t.Helper()
	err := e.d.pool.QueryRow(t.Context(), `SELECT (SELECT coalesce(sum(n), 0) FROM `+e.q("feed_changes")+` WHERE feed = $1)::bigint,
		EXISTS (SELECT FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $2 AND p.proname LIKE 'feed\_d%')`,
		string(f), e.d.schema).Scan(&keys, &docs)
	if err != nil {
		t.Fatal(err)
	}
	return keys, docs
}

// rawRows reads f's feed rows as stored, sealing nothing first.
func (e capEnv) rawRows(t testing.TB, f feed.FeedName) map[string]string {
	t.Helper()
	rows, err := e.d.pool.Query(t.Context(), `SELECT key, doc::text FROM `+e.q("feed_rows")+`
		WHERE feed = coalesce((SELECT store FROM `+e.q("feed_generations")+` WHERE feed = $1), $1) AND doc IS NOT NULL`, string(f))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var k, d string
		if err := rows.Scan(&k, &d); err != nil {
			t.Fatal(err)
		}
		out[k] = d
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestKeyedCaptureWaitsVisibly: recorded keys show where an operator looks
// (Describe's unsealed count, TraceKey's Recorded), and a round seals them
// from the table: the latest row of a key written twice, a tombstone for
// a key deleted after it was sealed, nothing for a key inserted and deleted
// between two rounds.
func TestKeyedCaptureWaitsVisibly(t *testing.T) {
	t.Parallel()
	e, table := keyedEnv(t, 3)
	ctx := t.Context()
	e.exec(t, `UPDATE `+e.q("t")+` SET v = 'twice' WHERE id = 2`)
	e.exec(t, `INSERT INTO `+e.q("t")+` VALUES (9, 'gone before any round')`)
	e.exec(t, `DELETE FROM `+e.q("t")+` WHERE id = 9`)
	if n, _ := e.recorded(t, "t"); n != 6 {
		t.Fatalf("%d keys recorded by five statements touching 6 keys; want 6", n)
	}
	d, err := e.s.Describe(ctx, "t")
	if err != nil || d.Unsealed != 6 {
		t.Fatalf("Describe = %+v, %v; want 6 unsealed", d, err)
	}
	tr, err := e.s.Trace(ctx, "t", "2")
	if err != nil || !tr.Recorded || tr.Found {
		t.Fatalf("Trace(2) = %+v, %v; want a recorded change and no sealed row", tr, err)
	}
	e.same(t, "the first rounds", "t", e.want(t, table))
	if _, h := e.head(t, "t"); h != 3 {
		t.Fatalf("the head is %d after sealing keys 1, 2 and 3 (9 came and went); want 3", h)
	}
	if tr, err := e.s.Trace(ctx, "t", "2"); err != nil || tr.Recorded || !tr.Found {
		t.Fatalf("Trace(2) after sealing = %+v, %v; want a sealed row, nothing recorded", tr, err)
	}
	e.exec(t, `DELETE FROM `+e.q("t")+` WHERE id = 3`)
	e.same(t, "after a delete", "t", e.want(t, table))
	if ts := e.tombstones(t, "t"); len(ts) != 1 || ts[0] != "3" {
		t.Fatalf("tombstones %q; want [3]", ts)
	}
}

// TestKeyedUncaptureSealsFirst: keys recorded and not yet sealed when the
// capture is removed are sealed by Uncapture itself, before the document
// function they need goes; and a backfill that finds its capture removed
// between two batches fails, recording nothing no function could seal.
func TestKeyedUncaptureSealsFirst(t *testing.T) {
	t.Parallel()
	e, table := keyedEnv(t, 5)
	ctx := t.Context()
	e.exec(t, `UPDATE `+e.q("t")+` SET v = v || '!' WHERE id <= 2`)
	want := e.want(t, table)
	if n, docs := e.recorded(t, "t"); n == 0 || !docs {
		t.Fatalf("%d keys recorded, document function %v; want some, and the function", n, docs)
	}
	if found, err := e.s.Uncapture(ctx, "t"); err != nil || !found {
		t.Fatalf("Uncapture = %v, %v", found, err)
	}
	if n, docs := e.recorded(t, "t"); n != 0 || docs {
		t.Fatalf("after Uncapture %d keys are recorded and the document function is there: %v; want none and gone", n, docs)
	}
	if got := e.rawRows(t, "t"); len(got) != len(want) {
		t.Fatalf("Uncapture left the feed with %d documents; the table had %d when it ran", len(got), len(want))
	}
	e.same(t, "after Uncapture", "t", want)

	// A backfill whose capture goes between two batches.
	if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: "t", Schema: e.d.schema, Table: "t"}); err != nil {
		t.Fatal(err)
	}
	var batches int
	_, err := e.s.Backfill(ctx, pgfeed.BackfillOptions{Feed: "t", BatchSize: 2, Progress: func(p pgfeed.BackfillProgress) {
		if batches++; batches == 1 {
			if _, err := e.s.Uncapture(ctx, "t"); err != nil {
				t.Errorf("Uncapture: %v", err)
			}
		}
	}})
	var inv *feed.InvalidError
	if !errors.As(err, &inv) || !strings.Contains(err.Error(), "capture was removed") {
		t.Fatalf("a backfill whose capture was removed = %v; want an InvalidError saying so", err)
	}
	if n, _ := e.recorded(t, "t"); n != 0 {
		t.Fatalf("%d keys recorded with no capture left to seal them", n)
	}
}

// TestKeyedSpecReplacedBeforeSealing: keys recorded under one spec and
// sealed after Capture replaced it are sealed with the spec installed then,
// the document the feed's next write of the key would carry.
func TestKeyedSpecReplacedBeforeSealing(t *testing.T) {
	t.Parallel()
	e, _ := keyedEnv(t, 3)
	ctx := t.Context()
	for _, spec := range []pgfeed.CaptureSpec{
		{Feed: "t", Schema: e.d.schema, Table: "t", Exclude: []string{"v"}},
		{Feed: "t", Schema: e.d.schema, Table: "t", Document: `jsonb_build_object('upper', upper(r.v))`},
	} {
		e.exec(t, `UPDATE `+e.q("t")+` SET v = v || '+'`)
		if n, _ := e.recorded(t, "t"); n == 0 {
			t.Fatal("the update recorded nothing")
		}
		if _, err := e.s.Capture(ctx, spec); err != nil {
			t.Fatal(err)
		}
		doc := `(to_jsonb(r) - 'v')`
		if spec.Document != "" {
			doc = spec.Document
		}
		e.same(t, "sealed under the new spec", "t", e.want(t, `SELECT id::text, `+doc+`::text FROM `+e.q("t")+` AS r`))
	}
}

// TestKeyedSealerReadsAsTheCaptureOwner: the sealer reads recorded keys'
// rows through the document function, which runs as the role that ran
// Capture. A sealer that connects as a role that may not read the table
// (no grant, and row security that would show it no row) but holds
// EXECUTE on the function seals every document; one without EXECUTE fails
// its round loudly, where a function running as the sealer would have
// found no row and sealed tombstones.
func TestKeyedSealerReadsAsTheCaptureOwner(t *testing.T) {
	t.Parallel()
	e, table := keyedEnv(t, 4)
	ctx := t.Context()
	e.exec(t, `ALTER TABLE `+e.q("t")+` ENABLE ROW LEVEL SECURITY`)
	var docs string
	if err := e.d.pool.QueryRow(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname LIKE 'feed\_d%'`, e.d.schema).Scan(&docs); err != nil {
		t.Fatal(err)
	}
	sealer := func(role string, execute bool) *pgfeed.Store {
		t.Helper()
		e.exec(t, `CREATE ROLE `+role+` LOGIN`)
		t.Cleanup(func() {
			c := context.Background()
			_, _ = e.d.pool.Exec(c, `DROP OWNED BY `+role)
			_, _ = e.d.pool.Exec(c, `DROP ROLE `+role)
		})
		e.exec(t, `GRANT USAGE ON SCHEMA "`+e.d.schema+`" TO `+role)
		e.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "`+e.d.schema+`" TO `+role)
		e.exec(t, `REVOKE ALL ON `+e.q("t")+` FROM `+role)
		if execute {
			e.exec(t, `GRANT EXECUTE ON FUNCTION `+docs+` TO `+role)
		}
		cfg, err := pgxpool.ParseConfig(pgtest.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.User = role
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := pgfeed.New(ctx, pool, pgfeed.Options{Schema: e.d.schema, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	suffix := strings.TrimPrefix(e.d.schema, "t_")
	denied := sealer("kairos_nox_"+suffix, false)
	if _, err := denied.SealRound(ctx, "t"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("a round by a sealer without EXECUTE on the document function = %v; want permission denied", err)
	}
	if n, _ := e.recorded(t, "t"); n != 4 {
		t.Fatalf("the refused round left %d keys recorded; want all 4", n)
	}
	allowed := sealer("kairos_x_"+suffix, true)
	for {
		n, err := allowed.SealRound(ctx, "t")
		if err != nil {
			t.Fatalf("a round by a sealer with EXECUTE: %v", err)
		}
		if n == 0 {
			break
		}
	}
	if got := e.rawRows(t, "t"); len(got) != 4 {
		t.Fatalf("the sealer's rounds sealed %d documents of the 4 rows its role may not read; want all", len(got))
	}
	e.same(t, "sealed by another role", "t", e.want(t, table))
}

// TestKeyedRecordRefusesKeys: the trigger's record refuses what the feed
// refuses (an empty key, one over 512 bytes; a NULL key cannot come from
// a primary key) with the feed's message, leaving nothing recorded, in
// every mode a keyed capture writes in. It looks for such a key only when
// the whole array might hold one, so the test also writes one statement of
// many short keys, together far over 512 bytes, that must be taken whole,
// and one that hides a bad key among good ones.
func TestKeyedRecordRefusesKeys(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newCapEnv(t, `CREATE TABLE %[1]s.k (k text PRIMARY KEY, v int NOT NULL)`)
			e.concurrent = mode == feed.WriteConcurrent
			ctx := t.Context()
			if _, err := e.s.Capture(ctx, pgfeed.CaptureSpec{Feed: "k", Schema: e.d.schema, Table: "k"}); err != nil {
				t.Fatal(err)
			}
			e.inMode(t, "k")
			for _, c := range []struct{ name, values, want string }{
				{"an empty key", `(''::text, 1)`, "key is empty"},
				{"a 600-byte key", `(repeat('k', 600), 1)`, "more than the 512 allowed"},
				{"an empty key among 200 others", `('', 1), ` + strings.TrimSuffix(strings.Repeat("(md5(random()::text), 1), ", 200), ", "), "key is empty"},
				{"a long key among 200 others", strings.Repeat("(md5(random()::text), 1), ", 200) + `(repeat('x', 513), 1)`, "more than the 512 allowed"},
			} {
				_, err := e.d.pool.Exec(ctx, `INSERT INTO `+e.q("k")+` VALUES `+c.values)
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("an insert of %s = %v; want the feed's refusal saying %q", c.name, err, c.want)
				}
			}
			if n, _ := e.unsealed(t, "k"); n != 0 {
				t.Fatalf("after the refused inserts %d writes wait; want none", n)
			}
			e.exec(t, `INSERT INTO `+e.q("k")+` SELECT 'key-' || i, i FROM generate_series(1, 300) AS i`)
			if n, _ := e.unsealed(t, "k"); e.concurrent && n != 300 {
				t.Fatalf("after an insert of 300 keys, far over 512 bytes in all, %d keys wait; want 300", n)
			}
			e.same(t, "300 keys in one statement", "k", e.want(t, `SELECT k, to_jsonb(r)::text FROM `+e.q("k")+` AS r`))
		})
	}
}
