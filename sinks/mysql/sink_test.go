package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// rejectKey is a key the test tables refuse with a CHECK constraint of
// their own, as a user's table might: a real refusal by the server.
const rejectKey feed.Key = "rejected/by a CHECK"

// newHarness builds a sink over a fresh table that refuses rejectKey:
// RENAME TABLE swaps both names at once (AtomicPublish), the largest
// document is what max_allowed_packet leaves room for, a fault closes the
// sink's connections and sends new ones to a closed port, and a reopened
// sink is a second one over the same table.
func newHarness(t *testing.T) feedtest.SinkHarness {
	s, link, admin, table := newTestSink(t)
	return feedtest.SinkHarness{
		Sink:             s,
		Contents:         func(ctx context.Context) (map[feed.Key]json.RawMessage, error) { return contents(ctx, admin, table) },
		ConditionalOnSeq: true,
		RejectKey:        rejectKey,
		AtomicPublish:    true,
		MaxDocumentBytes: s.MaxDocumentBytes(),
		Fault:            func(*testing.T) func() { return link.Down() },
		Reopen:           func(t *testing.T) feed.Sink { return reopen(t, table) },
	}
}

func newTestSink(t *testing.T) (*Sink, *faultLink, *sql.DB, string) {
	t.Helper()
	admin := adminDB(t)
	table := tableName(t, admin)
	s, link := openSink(t, table, true)
	if _, err := admin.Exec("ALTER TABLE `" + table + "` ADD CHECK (`key` <> '" + string(rejectKey) + "')"); err != nil {
		t.Fatal(err)
	}
	return s, link, admin, table
}

// reopen is a new sink over the same table, as after a restart.
func reopen(t *testing.T, table string) *Sink {
	s, _ := openSink(t, table, false)
	return s
}

func TestSinkSuite(t *testing.T) { feedtest.RunSink(t, newHarness) }

func rec(key string, seq feed.Seq, doc string) feed.Record {
	r := feed.Record{Key: feed.Key(key), Seq: seq}
	if doc != "" {
		r.Doc = json.RawMessage(doc)
	}
	return r
}

func wantDocs(t *testing.T, what string, admin *sql.DB, table string, want map[string]string) {
	t.Helper()
	got, err := contents(t.Context(), admin, table)
	if err != nil {
		t.Fatalf("%s: reading %s: %v", what, table, err)
	}
	ok := len(got) == len(want)
	for k, d := range want {
		if g, in := got[feed.Key(k)]; !in || !feedtest.JSONEqual(g, json.RawMessage(d)) {
			ok = false
		}
	}
	if !ok {
		var b strings.Builder
		for k, d := range got {
			fmt.Fprintf(&b, " %q=%.60s", k, d)
		}
		t.Fatalf("%s: the table serves {%s }, want %d documents %v", what, b.String(), len(want), keysOf(want))
	}
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, fmt.Sprintf("%.40q", k))
	}
	return out
}

// TestAwkwardKeysAndDocuments stores the keys and documents the extended
// suite sends: characters targets treat specially, a 512-byte key, keys that
// a utf8mb4 collation would fold together, and numbers beyond a double.
func TestAwkwardKeysAndDocuments(t *testing.T) {
	t.Parallel()
	s, _, admin, table := newTestSink(t)
	long := strings.Repeat("é", feed.MaxKeyLen/2)
	keys := []string{"a.b", "a/b", "a:b", "a*b", "a>b", "100%", "a b", "a ", "A", "a", `q"'\`, "😀", "Straße", "strasse", "\u00e9", "e\u0301", long}
	want := map[string]string{}
	var batch []feed.Record
	for i, k := range keys {
		d := fmt.Sprintf(`{"i":%d,"k":%q,"n":{"deep":[1,[2,[3]]]},"u":"ünï😀"}`, i, k)
		batch = append(batch, rec(k, feed.Seq(i+1), d))
		want[k] = d
	}
	batch = append(batch, rec("big", 100, "1e131071"), rec("tiny", 101, "0."+strings.Repeat("0", 16382)+"1"))
	want["big"], want["tiny"] = "1e131071", "0."+strings.Repeat("0", 16382)+"1"
	if rej, err := s.Apply(t.Context(), batch); err != nil || len(rej) != 0 {
		t.Fatalf("Apply = %v, %v", rej, err)
	}
	wantDocs(t, "after awkward keys", admin, table, want)
	// Exact text round trip: the column stores what was sent.
	got, _ := contents(t.Context(), admin, table)
	if string(got["tiny"]) != want["tiny"] || string(got["big"]) != "1e131071" {
		t.Errorf("numbers did not round-trip as text: %.30s…, %s", got["tiny"], got["big"])
	}
}

// TestMaxDocument: 1 MiB documents are stored; one over MaxDocumentBytes is
// a rejection of that record alone, whatever its place in the batch, and a
// batch of many large documents is split under max_allowed_packet.
func TestMaxDocument(t *testing.T) {
	t.Parallel()
	s, _, admin, table := newTestSink(t)
	big := func(n int) string { return `"` + strings.Repeat("x", n-2) + `"` }
	max := s.MaxDocumentBytes()
	if max < 1<<20 || max > s.packet {
		t.Fatalf("MaxDocumentBytes = %d, packet %d", max, s.packet)
	}
	var batch []feed.Record
	want := map[string]string{}
	// More than one packet's worth of 1 MiB documents.
	n := s.packet/(1<<20) + 3
	for i := range n {
		k := fmt.Sprintf("mib-%d", i)
		batch = append(batch, rec(k, feed.Seq(i+1), big(1<<20)))
		want[k] = big(1 << 20)
	}
	batch = append(batch[:2], append([]feed.Record{rec("over", 50, big(max+1))}, batch[2:]...)...)
	batch = append(batch, rec("at-limit", 60, big(max)))
	want["at-limit"] = big(max)
	rej, err := s.Apply(t.Context(), batch)
	if err != nil {
		t.Fatalf("Apply: %v; an oversized document is a rejection, not an error", err)
	}
	if len(rej) != 1 || rej[0].Key != "over" || rej[0].Seq != 50 || !strings.Contains(rej[0].Reason, "max_allowed_packet") {
		t.Fatalf("rejections = %.200v; want one for over@50 naming max_allowed_packet", rej)
	}
	wantDocs(t, "after large documents", admin, table, want)
}

// TestDeepDocumentRejected: a document nested deeper than the server's JSON
// parser allows fails the table's JSON_VALID check, which is a rejection of
// that record, the rest of the batch applied; so is a key the table's own
// constraint refuses, however many of them a batch holds.
func TestDeepDocumentRejected(t *testing.T) {
	t.Parallel()
	s, _, admin, table := newTestSink(t)
	deep := strings.Repeat("[", 120) + strings.Repeat("]", 120)
	var batch []feed.Record
	want := map[string]string{}
	bad := map[int]bool{0: true, 3: true, 41: true, 42: true, 99: true}
	for i := range 100 {
		k, d := fmt.Sprintf("k%d", i), fmt.Sprint(i)
		switch {
		case i == 42:
			k = string(rejectKey)
		case bad[i]:
			d = deep
		default:
			want[k] = d
		}
		batch = append(batch, rec(k, feed.Seq(i+1), d))
	}
	rej, err := s.Apply(t.Context(), batch)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	got := map[feed.Seq]bool{}
	for _, r := range rej {
		got[r.Seq] = true
		if !bad[int(r.Seq)-1] || r.Reason == "" {
			t.Errorf("rejection %+v is not of a bad record", r)
		}
	}
	if len(rej) != len(bad) || len(got) != len(bad) {
		t.Errorf("%d rejections, want %d: %+v", len(rej), len(bad), rej)
	}
	wantDocs(t, "after a batch with bad records", admin, table, want)
}

// TestTombstoneGuard: a delete remembers its seq, so an older upsert that
// arrives after it (a stale call) does not bring the key back, and a newer
// one does.
func TestTombstoneGuard(t *testing.T) {
	t.Parallel()
	s, _, admin, table := newTestSink(t)
	apply := func(rs ...feed.Record) {
		t.Helper()
		if rej, err := s.Apply(t.Context(), rs); err != nil || len(rej) != 0 {
			t.Fatalf("Apply = %v, %v", rej, err)
		}
	}
	apply(rec("a", 1, `1`))
	apply(rec("a", 5, ""), rec("never", 6, ""))
	apply(rec("a", 3, `"stale"`), rec("never", 4, `"stale"`))
	wantDocs(t, "after stale upserts behind tombstones", admin, table, map[string]string{})
	apply(rec("a", 7, `"new"`))
	wantDocs(t, "after a newer upsert", admin, table, map[string]string{"a": `"new"`})
}

// TestConcurrentApply: calls racing on the same keys with different seqs
// end with the highest seq's version of each key.
func TestConcurrentApply(t *testing.T) {
	t.Parallel()
	s, _, admin, table := newTestSink(t)
	const calls, keys = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for c := range calls {
		wg.Go(func() {
			var batch []feed.Record
			for k := range keys {
				seq := feed.Seq(c*keys + k + 1)
				d := fmt.Sprintf(`{"c":%d}`, c)
				if (c+k)%3 == 0 {
					d = ""
				}
				batch = append(batch, rec(fmt.Sprintf("k%d", k), seq, d))
			}
			_, err := s.Apply(t.Context(), batch)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{}
	for k := range keys {
		c := calls - 1
		if (c+k)%3 != 0 {
			want[fmt.Sprintf("k%d", k)] = fmt.Sprintf(`{"c":%d}`, c)
		}
	}
	wantDocs(t, "after racing calls", admin, table, want)
}

// TestAtomicPublish reads the live table in a loop while Publish runs: every
// read sees the old copy or the new one, whole.
func TestAtomicPublish(t *testing.T) {
	t.Parallel()
	s, _, admin, table := newTestSink(t)
	ctx := t.Context()
	old, fresh := map[string]string{}, map[string]string{}
	var live, copy []feed.Record
	for i := range 200 {
		live = append(live, rec(fmt.Sprintf("k%d", i), feed.Seq(i+1), `"old"`))
		copy = append(copy, rec(fmt.Sprintf("k%d", i+100), feed.Seq(i+1000), `"new"`))
		old[fmt.Sprintf("k%d", i)] = `"old"`
		fresh[fmt.Sprintf("k%d", i+100)] = `"new"`
	}
	if _, err := s.Apply(ctx, live); err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Apply(ctx, copy); err != nil {
		t.Fatal(err)
	}
	same := func(got map[feed.Key]json.RawMessage, want map[string]string) bool {
		if len(got) != len(want) {
			return false
		}
		for k, d := range want {
			if string(got[feed.Key(k)]) != d {
				return false
			}
		}
		return true
	}
	var stop atomic.Bool
	var reads, newReads int
	done := make(chan error, 1)
	go func() {
		defer close(done)
		for !stop.Load() {
			got, err := contents(ctx, admin, table)
			if err != nil {
				done <- fmt.Errorf("a read during Publish: %v", err)
				return
			}
			reads++
			switch {
			case same(got, old):
			case same(got, fresh):
				newReads++
			default:
				done <- fmt.Errorf("a read during Publish saw %d documents, neither copy", len(got))
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	if err := r.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	stop.Store(true)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d reads during publish, %d of the new copy", reads, newReads)
	wantDocs(t, "after Publish", admin, table, fresh)
	if n := tablesOf(t, admin, table); len(n) != 1 {
		t.Errorf("tables left after Publish: %v, want only %s", n, table)
	}
}

// TestFault: with the server unreachable (connections closed, new ones sent
// to a closed port) Apply, a resync's Apply and Publish return errors, never
// rejections; once it is back, the same batch applied again leaves
// everything.
func TestFault(t *testing.T) {
	t.Parallel()
	s, link, admin, table := newTestSink(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	batch := []feed.Record{rec("a", 1, `1`), rec("b", 2, `2`), rec("c", 3, "")}
	r, err := s.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	restore := link.Down()
	if rej, err := s.Apply(ctx, batch); err == nil || len(rej) != 0 {
		t.Fatalf("Apply with the server down = %v, %v; want an error and no rejection", rej, err)
	}
	if rej, err := r.Apply(ctx, batch); err == nil || len(rej) != 0 {
		t.Fatalf("resync Apply with the server down = %v, %v; want an error and no rejection", rej, err)
	}
	if err := r.Publish(ctx); err == nil {
		t.Fatal("Publish with the server down: nil error")
	}
	if _, err := s.OpenResync(ctx, 3); err == nil {
		t.Fatal("OpenResync with the server down: nil error")
	}
	restore()
	if rej, err := s.Apply(ctx, batch); err != nil || len(rej) != 0 {
		t.Fatalf("Apply after restore = %v, %v", rej, err)
	}
	wantDocs(t, "after the fault", admin, table, map[string]string{"a": `1`, "b": `2`})
	if rej, err := r.Apply(ctx, batch[:1]); err != nil || len(rej) != 0 {
		t.Fatalf("resync Apply after restore = %v, %v", rej, err)
	}
	if err := r.Publish(ctx); err != nil {
		t.Fatalf("Publish after restore: %v", err)
	}
	wantDocs(t, "after publishing", admin, table, map[string]string{"a": `1`})
}

// TestReopenAfterCrash: a process that crashed mid-resync leaves a
// half-filled shadow (and a crash between the rename and the drop, a
// retired copy); a new sink's OpenResync drops both and starts empty.
func TestReopenAfterCrash(t *testing.T) {
	t.Parallel()
	s, _, admin, table := newTestSink(t)
	ctx := t.Context()
	if _, err := s.Apply(ctx, []feed.Record{rec("live", 1, `1`)}); err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Apply(ctx, []feed.Record{rec("half", 2, `2`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec("CREATE TABLE `" + table + suffixRetired + "0123abcd` LIKE `" + table + "`"); err != nil {
		t.Fatal(err)
	}
	s2 := reopen(t, table)
	r2, err := s2.OpenResync(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := tablesOf(t, admin, table); len(got) != 2 {
		t.Errorf("tables after the second OpenResync: %v; want the live one and one shadow", got)
	}
	if _, err := r2.Apply(ctx, []feed.Record{rec("fresh", 3, `3`)}); err != nil {
		t.Fatal(err)
	}
	if err := r2.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	wantDocs(t, "after the resync that followed a crash", admin, table, map[string]string{"fresh": `3`})
	// The crashed process's shadow is gone: its late writes fail, and
	// reach nothing served.
	if _, err := r.Apply(ctx, []feed.Record{rec("late", 4, `4`)}); err == nil {
		t.Error("Apply to a shadow a later OpenResync dropped: nil error")
	}
}

// TestAbortDropsShadow: Abort leaves the database as it found it, the live
// table alone.
func TestAbortDropsShadow(t *testing.T) {
	t.Parallel()
	s, _, admin, table := newTestSink(t)
	r, err := s.OpenResync(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Apply(t.Context(), []feed.Record{rec("a", 1, `1`)}); err != nil {
		t.Fatal(err)
	}
	if err := r.Abort(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := tablesOf(t, admin, table); len(got) != 1 || got[0] != table {
		t.Errorf("tables after Abort: %v, want only %s", got, table)
	}
}

// TestNotStrict: a session whose sql_mode would cut long values is refused.
func TestNotStrict(t *testing.T) {
	t.Parallel()
	admin := adminDB(t)
	table := tableName(t, admin)
	dsn := testDSN() + "?sql_mode=%27NO_ENGINE_SUBSTITUTION%27"
	if strings.Contains(testDSN(), "?") {
		dsn = testDSN() + "&sql_mode=%27NO_ENGINE_SUBSTITUTION%27"
	}
	s, err := Open(t.Context(), dsn, Options{Table: table, Create: true})
	if err == nil {
		s.Close()
		t.Fatal("a session without a strict sql_mode was accepted")
	}
	if !strings.Contains(err.Error(), "sql_mode") {
		t.Errorf("the refusal does not name sql_mode: %v", err)
	}
	if got := tablesOf(t, admin, table); len(got) != 0 {
		t.Errorf("tables created by a refused Open: %v", got)
	}
}

// TestBadInput: every input a caller can get wrong is refused naming it,
// before anything is written; a DSN's password is never repeated.
func TestBadInput(t *testing.T) {
	t.Parallel()
	admin := adminDB(t)
	ctx := t.Context()
	for _, c := range []struct {
		name, table, field string
	}{
		{"backtick", "a`b", "mysql.table"},
		{"dot", "db.t", "mysql.table"},
		{"space", "a b", "mysql.table"},
		{"digits", "123", "mysql.table"},
		{"too long", strings.Repeat("t", MaxTableLen+1), "mysql.table"},
		{"unicode", "tablé", "mysql.table"},
	} {
		_, err := New(ctx, admin, Options{Table: c.table, Create: true})
		wantInvalid(t, c.name, err, c.field)
	}
	_, err := New(ctx, nil, Options{})
	wantInvalid(t, "a nil db", err, "mysql.db")
	_, err = Open(ctx, "", Options{})
	wantInvalid(t, "an empty DSN", err, "mysql.dsn")
	_, err = Open(ctx, "root:s3cr3t-canary@tcp(127.0.0.1:3306)test", Options{})
	wantInvalid(t, "a DSN without a slash", err, "mysql.dsn")
	if err != nil && strings.Contains(err.Error(), "s3cr3t-canary") {
		t.Errorf("the error repeats the password: %v", err)
	}
	_, err = Open(ctx, "root:s3cr3t-canary@tcp(127.0.0.1:3306)/", Options{})
	wantInvalid(t, "a DSN without a database", err, "mysql.dsn")
	_, err = Open(ctx, "root:s3cr3t-canary@tcp(127.0.0.1:3306)/test?timeout=banana", Options{})
	wantInvalid(t, "a DSN with a bad parameter", err, "mysql.dsn")
	if err != nil && strings.Contains(err.Error(), "s3cr3t-canary") {
		t.Errorf("the error repeats the password: %v", err)
	}

	// Nothing was created by the refusals above.
	if got := tablesOf(t, admin, "tablé"); len(got) != 0 {
		t.Errorf("tables created by refused calls: %v", got)
	}

	// A missing table without Create, and tables of the wrong shape.
	missing := tableName(t, admin)
	if _, err := New(ctx, admin, Options{Table: missing}); !errors.Is(err, ErrNoTable) {
		t.Errorf("a missing table: %v, want ErrNoTable", err)
	}
	for _, c := range []struct{ name, ddl string }{
		{"varchar key", "(`key` VARCHAR(512) PRIMARY KEY, `seq` BIGINT NOT NULL, `doc` LONGTEXT)"},
		{"int seq", "(`key` VARBINARY(512) PRIMARY KEY, `seq` INT NOT NULL, `doc` LONGTEXT)"},
		{"doc not null", "(`key` VARBINARY(512) PRIMARY KEY, `seq` BIGINT NOT NULL, `doc` LONGTEXT NOT NULL)"},
		{"no doc", "(`key` VARBINARY(512) PRIMARY KEY, `seq` BIGINT NOT NULL)"},
		{"pk on seq", "(`key` VARBINARY(512) NOT NULL, `seq` BIGINT NOT NULL PRIMARY KEY, `doc` LONGTEXT)"},
		{"no pk", "(`key` VARBINARY(512) NOT NULL, `seq` BIGINT NOT NULL, `doc` LONGTEXT)"},
	} {
		name := tableName(t, admin)
		if _, err := admin.Exec("CREATE TABLE `" + name + "` " + c.ddl); err != nil {
			t.Fatal(err)
		}
		if _, err := New(ctx, admin, Options{Table: name, Create: true}); !errors.Is(err, ErrTableShape) {
			t.Errorf("%s: %v, want ErrTableShape", c.name, err)
		}
	}
	// A JSON column (MariaDB's alias of LONGTEXT with a check) is the shape.
	ok := tableName(t, admin)
	if _, err := admin.Exec("CREATE TABLE `" + ok + "` (`key` VARBINARY(512) PRIMARY KEY, `seq` BIGINT NOT NULL, `doc` JSON, `extra` INT NULL)"); err != nil {
		t.Fatal(err)
	}
	if s, err := New(ctx, admin, Options{Table: ok}); err != nil {
		t.Errorf("a table with a JSON doc and an extra column: %v", err)
	} else if rej, err := s.Apply(ctx, []feed.Record{rec("a", 1, `{"v":1}`)}); err != nil || len(rej) != 0 {
		t.Errorf("Apply to a table made by hand: %v, %v", rej, err)
	} else {
		wantDocs(t, "a table made by hand", admin, ok, map[string]string{"a": `{"v":1}`})
	}
	// A server that does not answer is an error of New, not a hang.
	closed := "root@tcp(" + pgtest.ClosedPort(t) + ")/test?timeout=2s"
	if _, err := Open(ctx, closed, Options{}); err == nil || errors.Is(err, feed.ErrInvalid) {
		t.Errorf("a closed port: %v, want a connection error", err)
	}
}

func wantInvalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	var inv *feed.InvalidError
	if !errors.Is(err, feed.ErrInvalid) || !errors.As(err, &inv) || inv.Field != field {
		t.Errorf("%s: %v, want an *feed.InvalidError naming %s", what, err, field)
	}
}

// TestNoJSONCheck: a table made without the JSON check stores a document
// nested deeper than the server's JSON parser allows.
func TestNoJSONCheck(t *testing.T) {
	t.Parallel()
	admin := adminDB(t)
	table := tableName(t, admin)
	dsn, _ := faultDSN(t)
	s, err := Open(t.Context(), dsn, Options{Table: table, Create: true, NoJSONCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deep := strings.Repeat("[", 120) + strings.Repeat("]", 120)
	if rej, err := s.Apply(t.Context(), []feed.Record{rec("deep", 1, deep)}); err != nil || len(rej) != 0 {
		t.Fatalf("Apply = %v, %v", rej, err)
	}
	wantDocs(t, "after a deep document", admin, table, map[string]string{"deep": deep})
}
