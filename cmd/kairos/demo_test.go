package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/sinks/bleve"
	"github.com/kairos-es/kairos/sinks/file"
)

// checkDemoOutput asserts what every run of the demo shows, and returns the
// number of live documents it says it verified.
func checkDemoOutput(t *testing.T, out, dir string) int {
	t.Helper()
	for _, want := range []string{
		"the sinks' files go to " + dir,
		"the sinks' files stay in " + dir,
		"feed orders  generation 1",
		"feed orders  generation 2",
		"  SINK    CURSOR",
		"  file    2/",
		"  search  2/",
		"caught up in",
		"count the file (orders.jsonl, generation 2)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	hits := regexp.MustCompile(`customer:grace → (\d+) hits; the first (\d+):\n(   order-\d+  grace .*\n)+`).FindAllStringSubmatch(out, -1)
	if len(hits) != 2 || hits[1][1] != hits[0][1] || hits[1][2] != hits[0][2] {
		t.Fatalf("want two searches with the same hits, got %q:\n%s", hits, out)
	}
	total, _ := strconv.Atoi(hits[0][1])
	if shown, _ := strconv.Atoi(hits[0][2]); total == 0 || shown != min(3, total) {
		t.Errorf("want up to three of the hits shown, got %q:\n%s", hits[0][0], out)
	}
	m := regexp.MustCompile(`each hold exactly the feed's (\d+) live documents`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the output does not say the sinks were verified:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	if n == 0 {
		t.Fatalf("the demo verified an empty feed:\n%s", out)
	}
	return n
}

// sinkDocs reads back what the demo left in dir: the file's live documents
// and the index's, which must hold the same ones.
func sinkDocs(t *testing.T, dir string) map[feed.Key]json.RawMessage {
	t.Helper()
	snap, err := file.Load(filepath.Join(dir, demoFile))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Generation != 2 {
		t.Errorf("the file is generation %d's copy, want the rebuild's, 2", snap.Generation)
	}
	s, err := bleve.NewSearcher(filepath.Join(dir, demoIndex))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, err := s.DocCount(); err != nil || int(n) != len(snap.Docs) {
		t.Fatalf("the index holds %d documents (%v), the file %d", n, err, len(snap.Docs))
	}
	for k, want := range snap.Docs {
		got, ok, err := s.Document(t.Context(), k)
		if err != nil || !ok || !sameJSON(got, want) {
			t.Fatalf("the index holds %s (%v, %v) for %s, the file %s", got, ok, err, k, want)
		}
		var o order
		if err := json.Unmarshal(got, &o); err != nil || o.ItemCount == 0 {
			t.Fatalf("%s is not version 2's document: %s", k, got)
		}
	}
	return snap.Docs
}

func TestDemoPostgres(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	if err := pool.Ping(t.Context()); err != nil {
		pgtest.Unavailable(t, "the test database", err)
	}
	schema := pgtest.Schema(t)
	dir := filepath.Join(t.TempDir(), "demo")
	code, out, stderr := kairos(t, "demo", "--database-url", pgtest.URL(), "--schema", schema, "--keep", "--events", "600", "--dir", dir)
	if code != exitOK {
		t.Fatalf("demo = exit %d, stderr %q, output:\n%s", code, stderr, out)
	}
	if !strings.Contains(out, "running on PostgreSQL") || !strings.Contains(out, "schema "+schema+" kept") {
		t.Fatalf("the demo did not run on PostgreSQL:\n%s", out)
	}
	n := checkDemoOutput(t, out, dir)

	// The schema was kept: the feed's live documents are the sinks'.
	feeds, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer feeds.Close()
	live, err := liveDocs(t.Context(), feeds, demoFeed)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != n {
		t.Fatalf("the feed holds %d live documents, the demo said %d", len(live), n)
	}
	if err := sameDocs("the sinks", live, sinkDocs(t, dir)); err != nil {
		t.Fatal(err)
	}
	if g, err := feeds.Generation(t.Context(), demoFeed); err != nil || g != 2 {
		t.Fatalf("the feed is at generation %d (%v), want 2", g, err)
	}

	// Without --keep the schema goes.
	code, out, stderr = kairos(t, "demo", "--database-url", pgtest.URL(), "--schema", schema, "--events", "50", "--dir", dir)
	if code != exitOK || !strings.Contains(out, "schema "+schema+" dropped") {
		t.Fatalf("demo without --keep = exit %d, %q:\n%s", code, stderr, out)
	}
	var schemas int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&schemas); err != nil || schemas != 0 {
		t.Fatalf("after the demo %d schemas are named %s (%v)", schemas, schema, err)
	}
}

func TestDemoMemory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	for run := range 2 { // the second run starts over in the first one's folder
		code, out, stderr := kairos(t, "demo", "--memory", "--events", "600", "--dir", dir)
		if code != exitOK {
			t.Fatalf("run %d: demo = exit %d, stderr %q, output:\n%s", run, code, stderr, out)
		}
		if !strings.Contains(out, "running in memory (--memory)") {
			t.Fatalf("run %d did not run in memory:\n%s", run, out)
		}
		n := checkDemoOutput(t, out, dir)
		if docs := sinkDocs(t, dir); len(docs) != n {
			t.Fatalf("run %d: the sinks hold %d documents, the demo verified %d", run, len(docs), n)
		}
	}
}

// With no server at the address, the demo says so on one line and runs in
// memory, without repeating a password.
func TestDemoFallsBackToMemory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	code, out, stderr := kairos(t, "demo", "--database-url", "postgres://postgres:hunter2pw@"+pgtest.ClosedPort(t)+"/postgres", "--events", "100", "--dir", dir)
	if code != exitOK {
		t.Fatalf("demo = exit %d, stderr %q, output:\n%s", code, stderr, out)
	}
	if !regexp.MustCompile(`(?m)^no PostgreSQL at postgres://postgres:xxxxx@127\.0\.0\.1:\d+/postgres \(connection refused\); running in memory instead$`).MatchString(out) {
		t.Errorf("the fallback is not said in one line:\n%s", out)
	}
	if strings.Contains(out+stderr, "hunter2pw") {
		t.Errorf("the password shows:\n%s%s", out, stderr)
	}
	checkDemoOutput(t, out, dir)
}

func TestDemoUsage(t *testing.T) {
	for _, args := range [][]string{{"--events", "0"}, {"--dir", ""}, {"extra"}} {
		if code, _, stderr := kairos(t, append([]string{"demo", "--memory"}, args...)...); code != exitUsage || stderr == "" {
			t.Errorf("demo %q = exit %d, %q", args, code, stderr)
		}
	}
}
