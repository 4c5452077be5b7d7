package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/sinks/file"
)

// reloadURL is the test database's URL with a password planted in it: the
// server trusts the test user and ignores it, so it can only show up in
// output if the daemon leaks it.
func reloadURL(t *testing.T, secret string) string {
	t.Helper()
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), secret)
	return u.String()
}

// holders is each sink's lease holder as the cursor rows record it.
func holders(t *testing.T, st *pgfeed.Store, f feed.FeedName) map[string]feed.LeaseHolder {
	t.Helper()
	d, err := st.Describe(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]feed.LeaseHolder{}
	for _, s := range d.Sinks {
		if s.Lease != nil {
			out[string(s.Sink)] = s.Lease.Holder
		} else {
			out[string(s.Sink)] = ""
		}
	}
	return out
}

func docsIn(path string) int {
	docs, err := file.Read(path)
	if err != nil {
		return -1
	}
	return len(docs)
}

// SIGHUP reloads the sink set: a sink removed from the file stops and
// releases its lease, a new one starts, a changed one restarts under a new
// lease, and an unchanged one keeps running under the lease it held. A file
// with a mistake, and a change only a restart applies, are refused with a
// log line and leave every sink as it was; nothing in the log repeats the
// database password.
func TestReloadOnSIGHUP(t *testing.T) {
	const secret = "Rel0ad-pw-9f3c"
	schema := pgtest.Schema(t)
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name+".jsonl") }
	t.Setenv("KAIROS_TEST_RELOAD_URL", reloadURL(t, secret))
	t.Setenv("KAIROS_TEST_HTTP_LISTEN", "127.0.0.1:1") // migrate only; the daemon gets its own
	head := fmt.Sprintf(`database:
  url: ${KAIROS_TEST_RELOAD_URL}
  schema: %s
http:
  listen: ${KAIROS_TEST_HTTP_LISTEN}
feeds:
  orders:
    poll_interval: 200ms
    sinks:
`, schema)
	sink := func(name, extra string) string {
		return fmt.Sprintf("      %s:\n        type: file\n        path: %s\n%s", name, path(name), extra)
	}
	v1 := head + sink("keep", "") + sink("gone", "") + sink("change", "")
	v2 := head + sink("keep", "") + sink("change", "        compact_min_lines: 7\n") + sink("new", "")
	cfg := writeConfig(t, v1)
	rewrite := func(text string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, stderr := kairos(t, "migrate", "-c", cfg); code != exitOK {
		t.Fatalf("migrate: %s", stderr)
	}
	_, st := migratedOn(t, schema)
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	write := func(from, to int) {
		t.Helper()
		var changes []feed.Change
		for i := from; i < to; i++ {
			changes = append(changes, feed.Put(feed.Key(fmt.Sprintf("k%04d", i)), []byte(fmt.Sprintf(`{"i":%d}`, i))))
		}
		if _, err := st.WriteCommitted(ctx, "orders", changes); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 100)

	d := startDaemon(t, cfg, pgtest.ClosedPort(t), "--config-poll", "0")
	hup := func() {
		t.Helper()
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	held := func(sinks ...string) func() bool {
		return func() bool {
			fams := d.metrics()
			for _, s := range sinks {
				if v, ok := value(fams, "kairos_sink_lease_held", "orders", s); !ok || v != 1 {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, "every sink of the first file holds its lease", 30*time.Second, held("keep", "gone", "change"), d.logs)
	for _, s := range []string{"keep", "gone", "change"} {
		waitFor(t, s+" has the first 100 documents", 30*time.Second, func() bool { return docsIn(path(s)) == 100 }, d.logs)
	}
	before := holders(t, st, "orders")

	rewrite(v2)
	hup()
	waitFor(t, "the reload starts the new sink", 30*time.Second, func() bool {
		fams := d.metrics()
		_, gone := value(fams, "kairos_sink_lease_held", "orders", "gone")
		return held("keep", "change", "new")() && !gone && strings.Contains(d.logs.String(), "msg=reloaded")
	}, d.logs)
	after := holders(t, st, "orders")
	switch {
	case before["keep"] == "" || after["keep"] != before["keep"]:
		t.Errorf("the unchanged sink's lease holder went from %q to %q; want it kept", before["keep"], after["keep"])
	case after["change"] == "" || after["change"] == before["change"]:
		t.Errorf("the changed sink's lease holder went from %q to %q; want a new one", before["change"], after["change"])
	case after["gone"] != "":
		t.Errorf("the removed sink's lease is still recorded, by %q", after["gone"])
	case after["new"] == "":
		t.Errorf("the new sink holds no lease: %v", after)
	}
	write(100, 200)
	for _, s := range []string{"keep", "change", "new"} {
		waitFor(t, s+" has all 200 documents", 30*time.Second, func() bool { return docsIn(path(s)) == 200 }, d.logs)
	}
	if n := docsIn(path("gone")); n != 100 {
		t.Errorf("the removed sink's file has %d documents; want the 100 it had when it stopped", n)
	}
	for _, m := range d.metrics()["kairos_sink_call_duration_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "sink" && l.GetValue() == "gone" {
				t.Errorf("the removed sink's call durations are still exported")
			}
		}
	}
	logs := d.logs.String()
	for _, want := range []string{"sink removed from the file", "sink restarted on its new section", "reload: sink added", "kept=1 added=1 removed=1 restarted=1 failed=0"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the reload's log lacks %q:\n%s", want, logs)
		}
	}

	// A file with a mistake: refused with its place, every sink as it was.
	reloadOK := func(want float64) func() bool {
		return func() bool {
			fams := d.metrics()
			v, ok := fams["kairos_config_last_reload_successful"]
			return ok && len(v.GetMetric()) == 1 && v.GetMetric()[0].GetGauge().GetValue() == want
		}
	}
	broken := strings.Replace(v2, "compact_min_lines: 7", "compact_min_line: 7", 1)
	line := strings.Count(broken[:strings.Index(broken, "compact_min_line:")], "\n") + 1
	rewrite(broken)
	hup()
	waitFor(t, "the broken file is refused", 30*time.Second, reloadOK(0), d.logs)
	wantMistake := fmt.Sprintf("%s:%d:9: feeds.orders.sinks.change.compact_min_line: is not a known key", cfg, line)
	if logs := d.logs.String(); !strings.Contains(logs, wantMistake) || !strings.Contains(logs, "reload refused") {
		t.Errorf("the log does not name the mistake %q:\n%s", wantMistake, logs)
	}
	var ready struct {
		Ready  bool
		Config struct {
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		} `json:"config"`
	}
	if code, body := get(t, "http://"+d.addr+"/readyz"); code != 200 || json.Unmarshal([]byte(body), &ready) != nil || !ready.Ready || ready.Config.OK || !strings.Contains(ready.Config.Error, "compact_min_line") {
		t.Errorf("/readyz after a refused reload = %d %s; want ready, with the reload's failure", code, body)
	}
	if got := holders(t, st, "orders"); fmt.Sprint(got) != fmt.Sprint(after) {
		t.Errorf("a refused reload moved the leases: %v, then %v", after, got)
	}

	// A change only a restart applies: refused, saying so.
	rewrite(strings.Replace(v2, "schema: "+schema, "schema: "+schema+"_other", 1))
	hup()
	waitFor(t, "the schema change is refused", 30*time.Second, func() bool {
		return strings.Contains(d.logs.String(), "database.schema changed, which a running daemon cannot apply; restart kairos run")
	}, d.logs)
	if got := holders(t, st, "orders"); fmt.Sprint(got) != fmt.Sprint(after) {
		t.Errorf("a refused reload moved the leases: %v, then %v", after, got)
	}

	// The good file again: the reload succeeds, nothing restarts.
	rewrite(v2)
	hup()
	waitFor(t, "the good file reloads", 30*time.Second, reloadOK(1), d.logs)
	if got := holders(t, st, "orders"); fmt.Sprint(got) != fmt.Sprint(after) {
		t.Errorf("a reload of the same sinks moved the leases: %v, then %v", after, got)
	}
	fams := d.metrics()
	for result, want := range map[string]float64{"success": 2, "failure": 2} {
		var got float64
		for _, m := range fams["kairos_config_reloads_total"].GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				got = m.GetCounter().GetValue()
			}
		}
		if got != want {
			t.Errorf("kairos_config_reloads_total{result=%q} = %v; want %v", result, got, want)
		}
	}

	// A changed sink whose new section cannot be built runs again on its
	// old one, and the reload is reported failed.
	rewrite(strings.Replace(v2, path("change"), filepath.Join(dir, "missing", "change.jsonl"), 1))
	hup()
	waitFor(t, "the unbuildable section is reported", 30*time.Second, reloadOK(0), d.logs)
	if logs := d.logs.String(); !strings.Contains(logs, "changed sink cannot be built; it runs again on its old section") || !strings.Contains(logs, "feeds.orders.sinks.change") {
		t.Errorf("the log does not say the changed sink runs on its old section:\n%s", logs)
	}
	write(200, 250)
	waitFor(t, "the sink on its old section still syncs", 30*time.Second, func() bool { return held("change")() && docsIn(path("change")) == 250 }, d.logs)

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("the daemon after SIGTERM: %v\n%s", err, d.logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the daemon still runs 20s after SIGTERM:\n%s", d.logs.String())
	}
	if strings.Contains(d.logs.String(), secret) {
		t.Errorf("the daemon's log repeats the database password:\n%s", d.logs.String())
	}
}

// A change of the file's content reloads it without a signal.
func TestReloadOnFileChange(t *testing.T) {
	schema := pgtest.Schema(t)
	dir := t.TempDir()
	addr := pgtest.ClosedPort(t)
	base := fmt.Sprintf(`database:
  url: %s
  schema: %s
http:
  listen: %s
feeds:
  orders:
    sinks:
      a:
        type: file
        path: %s
`, pgtest.URL(), schema, addr, filepath.Join(dir, "a.jsonl"))
	cfg := writeConfig(t, base)
	migratedOn(t, schema)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &syncWriter{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"run", "-c", cfg, "--config-poll", "100ms"}, io.Discard, logs) }()
	d := &daemonProc{addr: addr, logs: logs}
	has := func(sink string) func() bool {
		return func() bool {
			v, ok := value(d.metrics(), "kairos_sink_lease_held", "orders", sink)
			return ok && v == 1
		}
	}
	waitFor(t, "sink a holds its lease", 30*time.Second, has("a"), logs)
	if err := os.WriteFile(cfg, []byte(base+fmt.Sprintf("      b:\n        type: file\n        path: %s\n", filepath.Join(dir, "b.jsonl"))), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the file's change starts sink b", 30*time.Second, has("b"), logs)
	if !strings.Contains(logs.String(), `trigger="file changed"`) {
		t.Errorf("the log does not say the file's change triggered the reload:\n%s", logs.String())
	}
	// log.level applies at once: at warn, the stop's info lines are gone.
	withB := base + fmt.Sprintf("      b:\n        type: file\n        path: %s\n", filepath.Join(dir, "b.jsonl"))
	if err := os.WriteFile(cfg, []byte("log:\n  level: warn\n"+withB), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the level's change reloads", 30*time.Second, func() bool {
		for _, m := range d.metrics()["kairos_config_reloads_total"].GetMetric() {
			if m.GetLabel()[0].GetValue() == "success" && m.GetCounter().GetValue() == 2 {
				return true
			}
		}
		return false
	}, logs)
	stopInProcess(t, cancel, done, logs)
	if strings.Contains(logs.String(), "kairos stopped") {
		t.Errorf("the daemon logged at info after a reload set log.level to warn:\n%s", logs.String())
	}
}

// Each setting a running daemon cannot apply is named when a reload changes
// it, and none is when only the feeds change; a sink restarts when its
// section or its feed's worker settings change, not for a comment.
func TestReloadClassifiesChanges(t *testing.T) {
	parse := func(text string) *config.Config {
		t.Helper()
		cfg, err := config.Parse([]byte(text), config.ParseOptions{SinkTypes: sinkTypes()})
		if err != nil {
			t.Fatalf("%v\n%s", err, text)
		}
		return cfg
	}
	const base = `database:
  url: postgres://a@db/app
  schema: s
  table_prefix: p_
lease:
  kind: row
  ttl: 30s
  heartbeat: 10s
  margin: 10s
http:
  listen: 127.0.0.1:9187
log:
  format: text
  level: info
collect:
  interval: 1m
feeds:
  orders:
    batch: 100
    sinks:
      f:
        type: file
        path: a.jsonl
`
	cur := parse(base)
	for old, want := range map[string]string{
		"url: postgres://a@db/app": "database.url",
		"schema: s":                "database.schema",
		"table_prefix: p_":         "database.table_prefix",
		"kind: row":                "lease.kind",
		"ttl: 30s":                 "lease.ttl",
		"heartbeat: 10s":           "lease.heartbeat",
		"margin: 10s":              "lease.margin",
		"listen: 127.0.0.1:9187":   "http.listen",
		"format: text":             "log.format",
		"level: info":              "",
		"interval: 1m":             "",
		"batch: 100":               "",
		"path: a.jsonl":            "",
	} {
		changed := map[string]string{
			"url: postgres://a@db/app": "url: postgres://b@db/app", "schema: s": "schema: t", "table_prefix: p_": "table_prefix: q_",
			"kind: row": "kind: advisory", "ttl: 30s": "ttl: 40s", "heartbeat: 10s": "heartbeat: 5s", "margin: 10s": "margin: 5s",
			"listen: 127.0.0.1:9187": "listen: 127.0.0.1:9188", "format: text": "format: json", "level: info": "level: debug", "interval: 1m": "interval: 0",
			"batch: 100": "batch: 200", "path: a.jsonl": "path: b.jsonl",
		}[old]
		got := strings.Join(fixed(cur, parse(strings.Replace(base, old, changed, 1))), ",")
		if got != want {
			t.Errorf("%s → %s: fixed names %q, want %q", old, changed, got, want)
		}
	}
	spec := func(text string) sinkSpec { return specs(parse(text))[0] }
	for _, c := range []struct {
		from, to string
		same     bool
	}{
		{"path: a.jsonl", "path: a.jsonl # the same file", true},
		{"level: info", "level: debug", true},
		{"path: a.jsonl", "path: b.jsonl", false},
		{"path: a.jsonl", "path: a.jsonl\n        compact_min_lines: 7", false},
		{"batch: 100", "batch: 200", false},
		{"batch: 100", "batch: 100\n    poll_interval: 2s", false},
	} {
		if got := spec(base).same(spec(strings.Replace(base, c.from, c.to, 1))); got != c.same {
			t.Errorf("%q → %q: same = %v, want %v", c.from, c.to, got, c.same)
		}
	}
}
