package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kairos-es/kairos/internal/pgtest"
)

// Every sink type a file may name has a probe.
func TestEverySinkTypeProbes(t *testing.T) {
	for name := range sinkTypes() {
		if probes[name] == nil {
			t.Errorf("sink type %q has no probe", name)
		}
	}
}

// config check reaches the database and one sink of every type, each a
// real server (Kafka: kfake), and says so per target; it creates nothing
// on the way. Then the same file with every target moved to a closed port
// or a missing directory: each is reported unreachable under its path,
// the exit code is 1, and the password planted in every URL appears
// nowhere in what it printed.
func TestConfigCheckProbes(t *testing.T) {
	srv := servers(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the probe sent the receiver a request: %s %s", r.Method, r.URL)
	}))
	defer hook.Close()
	dir := t.TempDir()
	table := "probe_" + strings.ReplaceAll(filepath.Base(dir), "-", "_")
	file := func(urls [7]string) string {
		return fmt.Sprintf(`database:
  url: %s
feeds:
  orders:
    sinks:
      table: {type: pgtable, url: %q, table: %s, create: true}
      maria: {type: mysql, dsn: %q, table: %s, create: true}
      cache: {type: redis, url: %q}
      kv: {type: nats, url: %q, bucket: %s}
      log: {type: kafka, brokers: [%q], topic: %s, create: true}
      hook: {type: webhook, url: %q, secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw], allow_loopback: true}
      export: {type: file, path: %q}
      search: {type: bleve, dir: %q}
`, urls[0], urls[0], table, urls[1], table, urls[2], urls[3], table, urls[4], table, urls[5], urls[6]+"/orders.jsonl", urls[6]+"/index")
	}
	good := writeConfig(t, file([7]string{srv.pg, srv.mysql, srv.redis, srv.nats, srv.kafka, hook.URL + "/hook", dir}))
	code, out, stderr := kairos(t, "config", "check", "-c", good)
	if code != exitOK {
		t.Fatalf("check against reachable targets = exit %d\n%s%s", code, out, stderr)
	}
	for _, path := range []string{"database.url", "feeds.orders.sinks.table", "feeds.orders.sinks.maria", "feeds.orders.sinks.cache", "feeds.orders.sinks.kv",
		"feeds.orders.sinks.log", "feeds.orders.sinks.hook", "feeds.orders.sinks.export", "feeds.orders.sinks.search"} {
		if !strings.Contains(out, path+": reached: ") {
			t.Errorf("the check says nothing of %s reached:\n%s", path, out)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the probes created %d entries in the sinks' directory, the first %s", len(left), left[0].Name())
	}

	const secret = "pr0be-s3cret-planted"
	closed := pgtest.ClosedPort(t)
	bad := writeConfig(t, file([7]string{
		"postgres://app:" + secret + "@" + closed + "/app?connect_timeout=2",
		"app:" + secret + "@tcp(" + closed + ")/test?timeout=2s",
		"redis://app:" + secret + "@" + closed + "/0",
		"nats://app:" + secret + "@" + closed,
		closed,
		"http://" + closed + "/hook?token=" + secret,
		filepath.Join(dir, "missing"),
	}))
	code, out, stderr = kairos(t, "config", "check", "-c", bad, "--timeout", "3s")
	if code != exitFailure || !strings.Contains(stderr, "9 of 9 targets could not be reached") {
		t.Fatalf("check against unreachable targets = exit %d; want %d and all 9 named\n%s%s", code, exitFailure, out, stderr)
	}
	for _, path := range []string{"database.url", "feeds.orders.sinks.table", "feeds.orders.sinks.maria", "feeds.orders.sinks.cache", "feeds.orders.sinks.kv",
		"feeds.orders.sinks.log", "feeds.orders.sinks.hook", "feeds.orders.sinks.export", "feeds.orders.sinks.search"} {
		if !strings.Contains(out, path+": unreachable: ") {
			t.Errorf("the check does not call %s unreachable:\n%s", path, out)
		}
	}
	if strings.Contains(out+stderr, secret) {
		t.Errorf("the check printed the planted password:\n%s%s", out, stderr)
	}
	if code, out, _ := kairos(t, "config", "check", "--offline", "-c", bad); code != exitOK || strings.Contains(out, "unreachable") {
		t.Errorf("check --offline = exit %d, %q; want 0 and no probe", code, out)
	}
	t.Logf("%s", out)
}
