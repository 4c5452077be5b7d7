package main

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/internal/pgtest"
)

func TestCaptureAndBackfillVerbs(t *testing.T) {
	schema := pgtest.Schema(t)
	cfg, st := migratedOn(t, schema)
	ctx := t.Context()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	table := `"` + schema + `".items`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, name text, secret text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` SELECT i, 'n' || i, 's' FROM generate_series(1, 25) AS i`); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := kairos(t, "capture", "add", "items", schema+".items", "--exclude", "secret", "-c", cfg); code != exitOK || !strings.HasPrefix(out, "installed: "+schema+".items -> feed items, key id") {
		t.Fatalf("capture add = exit %d, %q, %q", code, out, stderr)
	}
	if code, out, _ := kairos(t, "capture", "add", "items", schema+".items", "--exclude", "secret", "-c", cfg); code != exitOK || !strings.HasPrefix(out, "unchanged: ") {
		t.Fatalf("a second capture add = exit %d, %q", code, out)
	}
	if code, out, _ := kairos(t, "capture", "add", "items", schema+".items", "--print", "-c", cfg); code != exitOK || !strings.Contains(out, "CREATE TRIGGER") || !strings.HasPrefix(out, "-- Run this as one transaction") {
		t.Fatalf("capture add --print = exit %d, %q", code, out)
	}
	if code, out, _ := kairos(t, "capture", "list", "-c", cfg); code != exitOK || !strings.Contains(out, "items") || !strings.Contains(out, "(primary key)") ||
		!strings.Contains(out, "--exclude secret") || !strings.Contains(out, "  none  ") {
		t.Fatalf("capture list = exit %d, %q; want the key, the document's flag and no backfill", code, out)
	}
	if code, _, stderr := kairos(t, "capture", "add", "other", schema+".items", "--key", "nope", "-c", cfg); code != exitUsage || !strings.Contains(stderr, `"nope"`) || !strings.Contains(stderr, "--key[0]") {
		t.Fatalf("capture add with an unknown key column = exit %d, %q; want %d naming it", code, stderr, exitUsage)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET name = 'changed' WHERE id <= 5`); err != nil {
		t.Fatal(err)
	}
	if head, err := st.Head(ctx, "items"); err != nil || head != 5 {
		t.Fatalf("after an update of 5 rows the head is %d, %v; want 5", head, err)
	}
	if code, _, stderr := kairos(t, "backfill", "items", "--batch", "-1", "-c", cfg); code != exitUsage || !strings.Contains(stderr, "--batch") {
		t.Fatalf("backfill --batch -1 = exit %d, %q; want %d naming --batch", code, stderr, exitUsage)
	}
	code, out, stderr := kairos(t, "backfill", "items", "--batch", "10", "-c", cfg)
	if code != exitOK || !strings.HasPrefix(out, "backfilled 25 rows into feed items") || !strings.Contains(stderr, "rows/s") || !strings.HasSuffix(stderr, "done\n") {
		t.Fatalf("backfill = exit %d, %q, %q", code, out, stderr)
	}
	if code, out, _ := kairos(t, "capture", "list", "-c", cfg); code != exitOK || !strings.Contains(out, "done, 25 rows, ") {
		t.Fatalf("capture list after the backfill = exit %d, %q; want it done", code, out)
	}
	if code, _, _ := kairos(t, "backfill", "none", "-c", cfg); code != exitUsage {
		t.Fatalf("backfill of a feed that captures nothing = exit %d; want %d", code, exitUsage)
	}
	if code, out, _ := kairos(t, "capture", "remove", "items", "-c", cfg); code != exitOK || out != "removed the capture of feed items\n" {
		t.Fatalf("capture remove = exit %d, %q", code, out)
	}
	if code, _, _ := kairos(t, "capture", "remove", "items", "-c", cfg); code != exitFailure {
		t.Fatalf("a second capture remove = exit %d; want %d", code, exitFailure)
	}
}

// TestCaptureListGaps: capture list warns of a partition created after the
// capture, and --check exits 1 until capture add runs again.
func TestCaptureListGaps(t *testing.T) {
	schema := pgtest.Schema(t)
	cfg, _ := migratedOn(t, schema)
	ctx := t.Context()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	q := `"` + schema + `".`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+q+`orders (id int, region text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
		CREATE TABLE `+q+`orders_eu PARTITION OF `+q+`orders FOR VALUES IN ('eu')`); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := kairos(t, "capture", "add", "orders", schema+".orders", "-c", cfg); code != exitOK || !strings.HasPrefix(out, "installed: ") {
		t.Fatalf("capture add = exit %d, %q, %q", code, out, stderr)
	}
	if code, out, stderr := kairos(t, "capture", "list", "--check", "-c", cfg); code != exitOK || strings.Contains(out, "warning") {
		t.Fatalf("capture list --check with no gap = exit %d, %q, %q; want %d and no warning", code, out, stderr, exitOK)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+q+`orders_us PARTITION OF `+q+`orders FOR VALUES IN ('us')`); err != nil {
		t.Fatal(err)
	}
	warning := "warning: feed orders: " + schema + ".orders_us lacks a capture trigger or has one disabled"
	if code, out, _ := kairos(t, "capture", "list", "-c", cfg); code != exitOK || !strings.Contains(out, warning) {
		t.Fatalf("capture list with a new partition = exit %d, %q; want %d and %q", code, out, exitOK, warning)
	}
	if code, out, stderr := kairos(t, "capture", "list", "--check", "-c", cfg); code != exitFailure || !strings.Contains(out, warning) || !strings.Contains(stderr, "1 of 1 captures has a gap") {
		t.Fatalf("capture list --check with a new partition = exit %d, %q, %q; want %d", code, out, stderr, exitFailure)
	}
	if code, out, _ := kairos(t, "capture", "add", "orders", schema+".orders", "-c", cfg); code != exitOK || !strings.HasPrefix(out, "installed: ") {
		t.Fatalf("capture add again = exit %d, %q", code, out)
	}
	if code, out, _ := kairos(t, "capture", "list", "--check", "-c", cfg); code != exitOK || strings.Contains(out, "warning") {
		t.Fatalf("capture list --check after capture add again = exit %d, %q; want %d", code, out, exitOK)
	}
}

// TestCaptureAddRefusesAMove: capture add of a feed that captures another
// table is refused, and changes nothing, unless --move is given; names in
// SQL's quotes, or a schema left empty, are refused before anything runs.
func TestCaptureAddRefusesAMove(t *testing.T) {
	schema := pgtest.Schema(t)
	cfg, _ := migratedOn(t, schema)
	ctx := t.Context()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	q := `"` + schema + `".`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+q+`products (id int PRIMARY KEY); CREATE TABLE `+q+`lines (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := kairos(t, "capture", "add", "products", schema+".products", "-c", cfg); code != exitOK || !strings.HasPrefix(out, "installed: ") {
		t.Fatalf("capture add = exit %d, %q, %q", code, out, stderr)
	}
	if code, _, stderr := kairos(t, "describe", "products", "-c", cfg); code != exitFailure || !strings.Contains(stderr, "kairos backfill products") {
		t.Fatalf("describe of a captured feed nothing wrote = exit %d, %q; want %d and what to run", code, stderr, exitFailure)
	}
	code, out, stderr := kairos(t, "capture", "add", "products", schema+".lines", "-c", cfg)
	if code != exitUsage || !strings.Contains(stderr, "captures table "+schema+".products already") || !strings.Contains(stderr, "--move") {
		t.Fatalf("capture add of a captured feed onto another table = exit %d, %q, %q; want %d naming the table and --move", code, out, stderr, exitUsage)
	}
	if code, out, _ := kairos(t, "capture", "list", "-c", cfg); code != exitOK || !strings.Contains(out, schema+".products") || strings.Contains(out, schema+".lines") {
		t.Fatalf("capture list after a refused move = exit %d, %q; want products captured, lines not", code, out)
	}
	code, out, stderr = kairos(t, "capture", "add", "products", schema+".lines", "--move", "-c", cfg)
	if code != exitOK || !strings.HasPrefix(out, "moved from "+schema+".products: "+schema+".lines -> feed products") || !strings.Contains(out, "--new-generation") {
		t.Fatalf("capture add --move = exit %d, %q, %q", code, out, stderr)
	}
	if code, out, _ := kairos(t, "capture", "list", "-c", cfg); code != exitOK || strings.Contains(out, schema+".products") || !strings.Contains(out, schema+".lines") {
		t.Fatalf("capture list after the move = exit %d, %q; want lines captured, products not", code, out)
	}
	for _, arg := range []string{`"` + schema + `"."lines"`, ".lines", schema + "."} {
		if code, _, stderr := kairos(t, "capture", "add", "other", arg, "-c", cfg); code != exitUsage || !strings.Contains(stderr, "TABLE") {
			t.Fatalf("capture add other %s = exit %d, %q; want %d", arg, code, stderr, exitUsage)
		}
	}
	if code, _, stderr := kairos(t, "capture", "add", "bad/name", schema+".lines", "-c", cfg); code != exitUsage || strings.Count(stderr, "invalid input") != 1 {
		t.Fatalf("capture add with a bad feed name = exit %d, %q; want %d, said once", code, stderr, exitUsage)
	}
}
