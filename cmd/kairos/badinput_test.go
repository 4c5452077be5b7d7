package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/config"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// testServers are the addresses of the servers the sinks' sections name.
type testServers struct{ pg, mysql, redis, nats, kafka string }

func servers(t *testing.T) testServers {
	t.Helper()
	get := func(env, def string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		return def
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return testServers{
		pg:    pgtest.URL(),
		mysql: get("KAIROS_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"),
		redis: "redis://" + get("KAIROS_TEST_REDIS_ADDR", "127.0.0.1:6379") + "/0",
		nats:  get("KAIROS_TEST_NATS_URL", "nats://127.0.0.1:4222"),
		kafka: c.ListenAddrs()[0],
	}
}

// section is a sink's section: its keys in order, as YAML flow values.
type section [][2]string

// with returns s with key set to value (appended when absent), or removed
// when value is "-".
func (s section) with(key, value string) section {
	out := section{}
	found := false
	for _, kv := range s {
		if kv[0] == key {
			found = true
			if value == "-" {
				continue
			}
			kv[1] = value
		}
		out = append(out, kv)
	}
	if !found && value != "-" {
		out = append(out, [2]string{key, value})
	}
	return out
}

func (s section) yaml() string {
	var b strings.Builder
	for _, kv := range s {
		b.WriteString("        " + kv[0] + ": " + kv[1] + "\n")
	}
	return b.String()
}

// parseSection parses a file with one sink, s, of feed orders.
func parseSection(s section) (*config.Config, error) {
	return config.Parse([]byte("database:\n  url: x\nfeeds:\n  orders:\n    sinks:\n      s:\n"+s.yaml()), config.ParseOptions{File: "kairos.yaml", SinkTypes: sinkTypes()})
}

// buildSection parses a file with one sink of the section and builds it,
// returning the first error of either step.
func buildSection(t *testing.T, s section) (builtSink, error) {
	t.Helper()
	cfg, err := parseSection(s)
	if err != nil {
		return builtSink{}, err
	}
	sk := cfg.Feeds[0].Sinks[0]
	return builders[sk.Type](t.Context(), sk, feed.SinkID{Feed: "orders", Sink: "s"}, nil)
}

// TestEveryBadSinkValue builds each sink type from a config section with one
// bad value at a time, each of the constraints its options document, and
// requires a refusal that names the key under the sink's section
// (feeds.orders.sinks.s.<key>), before anything is created: the table,
// index directory or file a good section of the same sink would make is
// not there. The sink packages test their Options the same way; this test
// holds the command's mapping of each key to its option, and the
// placement of each error in the file, to what they say.
func TestEveryBadSinkValue(t *testing.T) {
	srv := servers(t)
	dir := t.TempDir()
	schema := pgtest.Schema(t)
	notDir := filepath.Join(dir, "a-file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	hook := httptest.NewServer(http.NotFoundHandler())
	defer hook.Close()
	good := map[string]section{
		"pgtable": {{"type", "pgtable"}, {"url", srv.pg}, {"schema", schema}, {"table", "t"}, {"create", "true"}},
		"mysql":   {{"type", "mysql"}, {"dsn", `"` + srv.mysql + `"`}, {"table", "kairos_badinput"}, {"create", "true"}},
		"webhook": {{"type", "webhook"}, {"url", hook.URL}, {"secrets", "[whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw]"}, {"allow_loopback", "true"}},
		"kafka":   {{"type", "kafka"}, {"brokers", "[" + srv.kafka + "]"}, {"create", "true"}},
		"bleve":   {{"type", "bleve"}, {"dir", filepath.Join(dir, "index")}},
		"nats":    {{"type", "nats"}, {"url", srv.nats}, {"bucket", "kairos_badinput"}, {"memory_storage", "true"}},
		"file":    {{"type", "file"}, {"path", filepath.Join(dir, "f.jsonl")}},
		"redis":   {{"type", "redis"}, {"url", srv.redis}, {"prefix", `"kbadinput:"`}},
	}
	for _, tc := range []struct {
		typ, key, value string
		field           string // the key the error names, under feeds.orders.sinks.s
	}{
		{"pgtable", "url", "-", "url"},
		{"pgtable", "url", `"postgres://h:notaport/db"`, "url"},
		{"pgtable", "table", "-", "table"},
		{"pgtable", "table", "Orders", "table"},
		{"pgtable", "table", `"t;drop"`, "table"},
		{"pgtable", "table", strings.Repeat("t", 64), "table"},
		{"pgtable", "schema", "a.b", "schema"},
		{"pgtable", "key_column", `"the key"`, "key_column"},
		{"pgtable", "seq_column", "key", "seq_column"},
		{"pgtable", "doc_column", strings.Repeat("d", 64), "doc_column"},
		{"pgtable", "columns", "[{name: a-b, type: text}]", "columns[0].name"},
		{"pgtable", "columns", "[{name: doc, type: text}]", "columns[0].name"},
		{"pgtable", "columns", "[{name: a}]", "columns[0].type"},
		{"pgtable", "columns", "[{name: a, type: varchar}]", "columns[0].type"},
		{"pgtable", "columns", "[{name: a, type: text, path: a.b}]", "columns[0].path"},
		{"pgtable", "create", "maybe", "create"},

		{"mysql", "dsn", "-", "dsn"},
		{"mysql", "dsn", `"root@tcp(127.0.0.1:3306)/"`, "dsn"},
		{"mysql", "dsn", `"not a dsn"`, "dsn"},
		{"mysql", "table", "-", "table"},
		{"mysql", "table", "a-b", "table"},
		{"mysql", "table", `"123"`, "table"},
		{"mysql", "table", strings.Repeat("t", 64), "table"},

		{"webhook", "url", "-", "url"},
		{"webhook", "url", "ftp://example.com/in", "url"},
		{"webhook", "url", "https:///in", "url"},
		{"webhook", "url", `"https://example.com/in#frag"`, "url"},
		{"webhook", "url", `"http://[::1"`, "url"},
		{"webhook", "secrets", "-", "secrets"},
		{"webhook", "secrets", "[]", "secrets"},
		{"webhook", "secrets", `[""]`, "secrets[0]"},
		{"webhook", "secrets", "[nope]", "secrets[0]"},
		{"webhook", "secrets", "[whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_!!]", "secrets[1]"},
		{"webhook", "secrets", "[whsec_c2hvcnQ=]", "secrets[0]"},
		{"webhook", "timeout", "-1s", "timeout"},
		{"webhook", "timeout", "10", "timeout"},
		{"webhook", "max_body_bytes", "100", "max_body_bytes"},
		{"webhook", "allow_loopback", "yes please", "allow_loopback"},

		{"kafka", "brokers", "-", "brokers"},
		{"kafka", "brokers", "[]", "brokers"},
		{"kafka", "brokers", `[""]`, "brokers[0]"},
		{"kafka", "topic", `"no such/topic"`, "topic"},
		{"kafka", "topic", "..", "topic"},
		{"kafka", "topic", strings.Repeat("t", 250), "topic"},
		{"kafka", "partitions", "-1", "partitions"},
		{"kafka", "partitions", "4294967296", "partitions"},
		{"kafka", "replication_factor", "-1", "replication_factor"},
		{"kafka", "replication_factor", "70000", "replication_factor"},
		{"kafka", "max_message_bytes", "10", "max_message_bytes"},
		{"kafka", "sasl", "{mechanism: kerberos}", "sasl.mechanism"},

		{"bleve", "dir", "-", "dir"},
		{"bleve", "dir", notDir, "dir"},
		{"bleve", "max_document_bytes", "10", "max_document_bytes"},
		{"bleve", "lock_timeout", "-1s", "lock_timeout"},
		{"bleve", "mapping_file", filepath.Join(dir, "absent.json"), "mapping_file"},
		{"bleve", "mapping_file", notDir, "mapping_file"},

		{"nats", "url", "-", "url"},
		{"nats", "url", `""`, "url"},
		{"nats", "bucket", "a-b", "bucket"},
		{"nats", "bucket", strings.Repeat("b", 65), "bucket"},
		{"nats", "window", "-1", "window"},
		{"nats", "window", "65537", "window"},
		{"nats", "ack_timeout", "-1s", "ack_timeout"},
		{"nats", "replicas", "6", "replicas"},
		{"nats", "replicas", "-1", "replicas"},
		{"nats", "creds_file", filepath.Join(dir, "absent.creds"), "creds_file"},

		{"file", "path", "-", "path"},
		{"file", "path", `""`, "path"},
		{"file", "path", filepath.Join(dir, "no-such-dir", "f.jsonl"), "path"},
		{"file", "max_document_bytes", "-1", "max_document_bytes"},
		{"file", "compact_ratio", "1", "compact_ratio"},
		{"file", "compact_min_lines", "-1", "compact_min_lines"},

		{"redis", "url", "-", "url"},
		{"redis", "url", "http://127.0.0.1:6379", "url"},
		{"redis", "prefix", "nocolon", "prefix"},
		{"redis", "prefix", `"a{b}:"`, "prefix"},
		{"redis", "prefix", `"a b:"`, "prefix"},
		{"redis", "encoding", "xml", "encoding"},
		{"redis", "ttl", "10ms", "ttl"},
		{"redis", "ttl", "1500us", "ttl"},
		{"redis", "tombstone_ttl", "10ms", "tombstone_ttl"},
		{"redis", "max_document_bytes", "1", "max_document_bytes"},
		{"redis", "client_name", `"a b"`, "client_name"},
	} {
		t.Run(tc.typ+"/"+tc.key+"="+tc.value, func(t *testing.T) {
			b, err := buildSection(t, good[tc.typ].with(tc.key, tc.value))
			if err == nil {
				b.close()
				t.Fatalf("built; want an error naming %s", tc.field)
			}
			want := "feeds.orders.sinks.s." + tc.field + ": "
			var es config.Errors
			if errors.As(err, &es) {
				if len(es) != 1 || !strings.Contains(es[0].Error(), want) {
					t.Fatalf("config errors %q; want one naming %s", err, want)
				}
			} else if !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("err = %q; want it to start with %s", err, want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("err = %q spans lines", err)
			}
		})
	}

	// Nothing was created by a refused section: no table in the schema or
	// the MySQL database, no index directory, no file.
	pool := pgtest.Pool(t, srv.pg, pgx.QueryExecModeCacheStatement)
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = $1`, schema).Scan(&n); err != nil || n != 0 {
		t.Errorf("refused pgtable sections left %d relations (%v)", n, err)
	}
	for _, p := range []string{filepath.Join(dir, "index"), filepath.Join(dir, "f.jsonl")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused section left %s behind (%v)", p, err)
		}
	}
	// And each good section builds, so that every refusal above is the bad
	// value's.
	for typ, s := range good {
		if typ == "mysql" || typ == "nats" || typ == "redis" || typ == "pgtable" {
			continue // built by the tests of build.go and run.go against their servers
		}
		b, err := buildSection(t, s)
		if err != nil {
			t.Errorf("the good %s section: %v", typ, err)
			continue
		}
		b.close()
	}
}
