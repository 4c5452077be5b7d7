package pgfeed_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// Tokens of the functions' sources that may name an object: a name before
// a parenthesis (a function), any name (a type), a run of operator
// characters (an operator).
var (
	shadowCalls     = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*\(`)
	shadowNames     = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	shadowOperators = regexp.MustCompile(`[-+*/<>=~!@#%^&|?]+`)
)

// shadowSQL creates, in the schema of its first parameter, an object of the
// same name and signature as each object of pg_catalog that a token of the
// second names (the kinds above: f, i, o): functions and operators that
// raise "shadow … reached", and domains that no value satisfies; and a
// case-insensitive collation named "C". It counts what it created by kind.
// A signature PL/pgSQL cannot take (internal, "any") is skipped.
const shadowSQL = `
DO $do$
DECLARE
    evil text := current_setting('kairos.evil');
    r record;
    body text;
BEGIN
    FOR r IN SELECT p.oid, p.proname, pg_get_function_arguments(p.oid) AS args, pg_get_function_result(p.oid) AS res
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind IN ('f', 'a', 'w')
            AND p.proname IN (SELECT t.name FROM shadow_tokens t WHERE t.kind = 'f')
    LOOP
        body := format('BEGIN RAISE EXCEPTION %L; END', format('shadow function %s reached', r.oid::regprocedure));
        BEGIN
            EXECUTE format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', evil, r.proname, r.args, r.res, body);
            INSERT INTO shadow_made VALUES ('function', r.oid::regprocedure::text);
        EXCEPTION WHEN others THEN NULL;
        END;
    END LOOP;
    FOR r IN SELECT o.oid, o.oprname, o.oprleft, o.oprright, o.oprresult FROM pg_catalog.pg_operator o
        WHERE o.oprnamespace = 'pg_catalog'::regnamespace
            AND o.oprname IN (SELECT t.name FROM shadow_tokens t WHERE t.kind = 'o')
    LOOP
        body := format('BEGIN RAISE EXCEPTION %L; END', format('shadow operator %s reached', r.oid::regoperator));
        BEGIN
            IF r.oprleft = 0 THEN
                EXECUTE format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', evil, 'op' || r.oid,
                    format_type(r.oprright, NULL), format_type(r.oprresult, NULL), body);
                EXECUTE format('CREATE OPERATOR %I.%s (RIGHTARG = %s, FUNCTION = %I.%I)', evil, r.oprname,
                    format_type(r.oprright, NULL), evil, 'op' || r.oid);
            ELSE
                EXECUTE format('CREATE FUNCTION %I.%I(%s, %s) RETURNS %s LANGUAGE plpgsql AS %L', evil, 'op' || r.oid,
                    format_type(r.oprleft, NULL), format_type(r.oprright, NULL), format_type(r.oprresult, NULL), body);
                EXECUTE format('CREATE OPERATOR %I.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %I.%I)', evil, r.oprname,
                    format_type(r.oprleft, NULL), format_type(r.oprright, NULL), evil, 'op' || r.oid);
            END IF;
            INSERT INTO shadow_made VALUES ('operator', r.oid::regoperator::text);
        EXCEPTION WHEN others THEN NULL;
        END;
    END LOOP;
    EXECUTE format('CREATE COLLATION %I."C" (provider = icu, locale = %L, deterministic = false)', evil, 'und-u-ks-level2');
    INSERT INTO shadow_made VALUES ('collation', 'C');
    -- Types last, so that the types of the signatures above are
    -- pg_catalog's: in the schema, and in pg_temp, which a writer's
    -- search_path searches first for types unless it places it.
    FOR r IN SELECT t.typname FROM pg_catalog.pg_type t
        WHERE t.typnamespace = 'pg_catalog'::regnamespace AND t.typtype IN ('b', 'e', 'r', 'm') AND t.typname !~ '^_'
            AND t.typname IN (SELECT x.name FROM shadow_tokens x WHERE x.kind = 'i')
    LOOP
        BEGIN
            EXECUTE format('CREATE DOMAIN %I.%I AS pg_catalog.%I CHECK (false)', evil, r.typname, r.typname);
            EXECUTE format('CREATE DOMAIN pg_temp.%I AS pg_catalog.%I CHECK (false)', r.typname, r.typname);
            INSERT INTO shadow_made VALUES ('type', r.typname);
        EXCEPTION WHEN others THEN NULL;
        END;
    END LOOP;
END
$do$`

// TestCaptureWriterCannotShadowNames: a keyed capture trigger runs as the
// role that ran Capture but under the writer's search_path (it pins none,
// to save what a pinned path costs every call), so every name it resolves
// must be one no writer can stand in for. A writer with a schema of its own
// shadows every function, operator and type of pg_catalog that the feed's
// functions name (each shadow raises, or refuses every value), adds a
// case-insensitive collation "C", puts the schema ahead of pg_catalog and
// the application's schema after it, and creates temporary tables named
// like the captured tables and the transition tables. Then it writes every
// kind of change, in both write modes and, in the concurrent one, in READ
// COMMITTED (the trigger's own insert) and REPEATABLE READ (through record,
// which pins its own path): every write must succeed, and the feed must
// equal the tables. A trigger that left one name bare runs the writer's
// object with the capture owner's rights: a shadow raises, a temporary
// table's rows or a case-blind comparison make the feed differ.
func TestCaptureWriterCannotShadowNames(t *testing.T) {
	t.Parallel()
	for _, mode := range writeModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			app := pgtest.Schema(t)
			d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
			e := capEnv{d: d, s: newStore(t, d, pgfeed.Options{}), concurrent: mode == feed.WriteConcurrent}
			a := `"` + app + `".`
			e.exec(t, `CREATE SCHEMA "`+app+`";
				CREATE TABLE `+a+`items (id int, tag text, name text NOT NULL, note text, PRIMARY KEY (id, tag));
				CREATE TABLE `+a+`plain (k text PRIMARY KEY, v text NOT NULL);
				CREATE TABLE `+a+`parts (id int, region text, v text NOT NULL, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
				CREATE TABLE `+a+`parts_eu PARTITION OF `+a+`parts FOR VALUES IN ('eu');
				CREATE TABLE `+a+`parts_us PARTITION OF `+a+`parts FOR VALUES IN ('us')`)
			// The writer's schema has the role's name, so that even its
			// default search_path ("$user", public) finds it.
			role := "kairos_s_" + strings.TrimPrefix(app, "t_")
			e.exec(t, `CREATE ROLE `+role+` LOGIN`)
			t.Cleanup(func() {
				c := context.Background()
				_, _ = e.d.pool.Exec(c, `DROP SCHEMA IF EXISTS `+role+` CASCADE`)
				_, _ = e.d.pool.Exec(c, `DROP OWNED BY `+role)
				_, _ = e.d.pool.Exec(c, `DROP ROLE `+role)
			})
			e.exec(t, `CREATE SCHEMA `+role+` AUTHORIZATION `+role)
			e.exec(t, `GRANT USAGE ON SCHEMA "`+app+`" TO `+role)
			e.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA "`+app+`" TO `+role)

			feeds := []struct {
				f     feed.FeedName
				spec  pgfeed.CaptureSpec
				table string // (key, document) of every row
			}{
				{"items", pgfeed.CaptureSpec{Table: "items", Exclude: []string{"note"}},
					`SELECT id::text || '/' || tag, (to_jsonb(r) - 'note')::text FROM ` + a + `items AS r`},
				{"plain", pgfeed.CaptureSpec{Table: "plain"}, `SELECT k, to_jsonb(r)::text FROM ` + a + `plain AS r`},
				{"parts", pgfeed.CaptureSpec{Table: "parts"}, `SELECT id::text || '/' || region, to_jsonb(r)::text FROM ` + a + `parts AS r`},
			}
			for _, c := range feeds {
				e.inMode(t, c.f)
				c.spec.Feed, c.spec.Schema = c.f, app
				if _, err := e.s.Capture(ctx, c.spec); err != nil {
					t.Fatal(err)
				}
			}
			if e.concurrent {
				for _, c := range feeds {
					sealCtx, stopSealer := context.WithCancel(ctx)
					sealed := make(chan error, 1)
					go func() { sealed <- e.s.RunSealer(sealCtx, c.f) }()
					t.Cleanup(func() { stopSealer(); <-sealed })
				}
			}

			// The tokens of every function of the feed's schema: the
			// triggers, the document functions, and what they call.
			var src string
			if err := e.d.pool.QueryRow(ctx, `SELECT string_agg(prosrc, E'\n') FROM pg_proc WHERE pronamespace = $1::regnamespace`, d.schema).Scan(&src); err != nil {
				t.Fatal(err)
			}
			tokens := map[[2]string]bool{}
			for _, m := range shadowCalls.FindAllStringSubmatch(src, -1) {
				tokens[[2]string{"f", strings.ToLower(m[1])}] = true
			}
			for _, m := range shadowNames.FindAllString(src, -1) {
				tokens[[2]string{"i", strings.ToLower(m)}] = true
			}
			for _, m := range shadowOperators.FindAllString(src, -1) {
				tokens[[2]string{"o", m}] = true
			}

			// One session, the writer's, for everything below: its
			// temporary objects and its search_path are the session's.
			pool := pgtest.PoolWith(t, pgtest.URL(), func(cfg *pgxpool.Config) {
				cfg.ConnConfig.User = role
				cfg.MaxConns = 1
				cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			})
			w, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Release()
			wexec := func(sql string, args ...any) error {
				_, err := w.Exec(ctx, sql, args...)
				return err
			}
			if err := wexec(`CREATE TEMP TABLE shadow_tokens (kind text, name text); CREATE TEMP TABLE shadow_made (kind text, name text)`); err != nil {
				t.Fatal(err)
			}
			// Tables a bare name could reach (made before the shadows of
			// their column types): the transition tables' names,
			// and the captured tables', each holding a row of its own.
			if err := wexec(`CREATE TEMP TABLE kairos_new (id int, tag text, name text, note text);
				CREATE TEMP TABLE kairos_old (id int, tag text, name text, note text);
				CREATE TEMP TABLE items (id int, tag text, name text, note text);
				CREATE TEMP TABLE parts_eu (id int, region text, v text);
				CREATE TEMP TABLE parts_us (id int, region text, v text);
				INSERT INTO kairos_new VALUES (99, 'temp', 'temp', NULL);
				INSERT INTO kairos_old VALUES (98, 'temp', 'temp', NULL);
				INSERT INTO items VALUES (97, 'temp', 'temp', NULL);
				INSERT INTO parts_eu VALUES (96, 'eu', 'temp');
				INSERT INTO parts_us VALUES (95, 'us', 'temp')`); err != nil {
				t.Fatal(err)
			}
			for tok := range tokens {
				if err := wexec(`INSERT INTO shadow_tokens VALUES ($1, $2)`, tok[0], tok[1]); err != nil {
					t.Fatal(err)
				}
			}
			if err := wexec(`SELECT set_config('kairos.evil', $1, false)`, role); err != nil {
				t.Fatal(err)
			}
			if err := wexec(shadowSQL); err != nil {
				t.Fatalf("creating the shadows: %v", err)
			}
			// The shadows must stand in for what the trigger names, or this
			// test proves nothing.
			rows, err := w.Query(ctx, `SELECT kind || ' ' || name FROM shadow_made`)
			if err != nil {
				t.Fatal(err)
			}
			made, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				"function cardinality(anyarray)", "function pg_advisory_xact_lock_shared(bigint)", "function current_setting(text)",
				"function array_agg(anynonarray)", "function to_jsonb(anyelement)", "function replace(text,text,text)",
				"function array_position(anycompatiblearray,anycompatible)", "function octet_length(text)", "function set_config(text,text,boolean)",
				"function pg_partition_tree(regclass)", "function strpos(text,text)",
				"operator =(text,text)", "operator ||(text,text)", "operator -(jsonb,text[])", "operator *=(record,record)",
				"operator =(integer,integer)", "operator >(integer,integer)", "operator <=(integer,integer)", "operator =(name,name)",
				"collation C", "type text", "type jsonb", "type oid", "type regclass",
			} {
				if !slices.Contains(made, want) {
					t.Fatalf("no shadow %s among the %d made", want, len(made))
				}
			}
			t.Logf("%d shadows", len(made))
			if err := wexec(`SET search_path = ` + role + `, pg_catalog, "` + app + `"`); err != nil {
				t.Fatal(err)
			}

			// The writer's own statements name no operator or type bare.
			eq := " OPERATOR(pg_catalog.=) "
			isolations := []string{"READ COMMITTED"}
			if e.concurrent {
				isolations = append(isolations, "REPEATABLE READ")
			}
			for pass, iso := range isolations {
				// Each pass writes ids of its own: pass 0 11–15, pass 1 21–25.
				id := func(i int) string { return fmt.Sprint((pass+1)*10 + i) }
				step := func(name string, f feed.FeedName, sql string) {
					t.Helper()
					name = iso + ", " + name
					if err := wexec(`BEGIN ISOLATION LEVEL ` + iso + `; ` + sql + `; COMMIT`); err != nil {
						_ = wexec(`ROLLBACK`)
						t.Fatalf("%s, as the writer: %v", name, err)
					}
					for _, c := range feeds {
						if c.f == f {
							e.same(t, name, f, e.want(t, c.table))
						}
					}
				}
				step("insert", "items", `INSERT INTO `+a+`items VALUES (`+id(1)+`, 'a', 'one', 'x'), (`+id(2)+`, 'b', 'two', 'y'), (`+id(3)+`, 'c', 'three', 'z')`)
				step("upsert", "items", `INSERT INTO `+a+`items VALUES (`+id(1)+`, 'a', 'uno', 'x'), (`+id(4)+`, 'd', 'four', 'w')
					ON CONFLICT (id, tag) DO UPDATE SET name = excluded.name`)
				step("upsert that inserts", "items", `INSERT INTO `+a+`items VALUES (`+id(5)+`, 'e', 'five', 'v') ON CONFLICT (id, tag) DO UPDATE SET name = excluded.name`)
				_, h0 := e.head(t, "items")
				step("update of a column the document leaves out", "items", `UPDATE `+a+`items SET note = 'changed'`)
				if _, h := e.head(t, "items"); !e.concurrent && h != h0 {
					t.Fatalf("%s: an update of the left-out column moved the head from %d to %d", iso, h0, h)
				}
				step("update", "items", `UPDATE `+a+`items SET name = 'dos' WHERE id`+eq+id(2))
				// A key whose case alone changed: the old key must be a
				// tombstone, which a case-blind comparison would miss.
				step("update of a key's case", "items", `UPDATE `+a+`items SET tag = 'B' WHERE id`+eq+id(2))
				if ts := e.tombstones(t, "items"); !slices.Contains(ts, id(2)+"/b") {
					t.Fatalf("%s: after the key's update the tombstones are %q; want %s/b among them", iso, ts, id(2))
				}
				step("delete", "items", `DELETE FROM `+a+`items WHERE id`+eq+id(3))
				step("insert by text key", "plain", `INSERT INTO `+a+`plain VALUES ('k`+id(1)+`', 'v'), ('k`+id(2)+`', 'w')`)
				step("update of the whole row's document", "plain", `UPDATE `+a+`plain SET v = 'v2' WHERE k`+eq+`'k`+id(1)+`'`)
				step("delete by text key", "plain", `DELETE FROM `+a+`plain WHERE k`+eq+`'k`+id(2)+`'`)
				// A key the feed refuses: the writer gets the feed's own
				// error, from record or write, not a shadow's.
				err := wexec(`BEGIN ISOLATION LEVEL ` + iso + `; INSERT INTO ` + a + `plain VALUES ('', 'empty'); COMMIT`)
				_ = wexec(`ROLLBACK`)
				if err == nil || !strings.Contains(err.Error(), "key is empty") {
					t.Fatalf("%s: an empty key, as the writer: %v; want the feed's refusal of an empty key", iso, err)
				}
				step("insert into partitions", "parts", `INSERT INTO `+a+`parts VALUES (`+id(1)+`, 'eu', 'a'), (`+id(2)+`, 'us', 'b'), (`+id(3)+`, 'eu', 'c')`)
				step("truncate of a partition", "parts", `TRUNCATE `+a+`parts_eu`)
				if ts := e.tombstones(t, "parts"); !slices.Contains(ts, id(1)+"/eu") || slices.Contains(ts, "96/eu") {
					t.Fatalf("%s: after the partition's truncate the tombstones are %q; want %s/eu among them, and none of the writer's own table", iso, ts, id(1))
				}
			}
			truncate := func(f feed.FeedName, table string) {
				t.Helper()
				g0, _ := e.head(t, f)
				if err := wexec(`TRUNCATE ` + a + table); err != nil {
					t.Fatalf("truncate of %s, as the writer: %v", table, err)
				}
				if g, _ := e.head(t, f); g != g0+1 || len(e.feedRows(t, f)) != 0 {
					t.Fatalf("after the truncate of %s the feed is at generation %d with %d rows; want generation %d, empty", table, g, len(e.feedRows(t, f)), g0+1)
				}
			}
			truncate("parts", "parts")
			truncate("items", "items")
		})
	}
}
