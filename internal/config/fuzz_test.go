package config

import (
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/kairos-es/kairos/feed"
)

// fuzzSeeds are FuzzParse's seeds: the good file, one of each mistake
// TestParseMistakes names, and the YAML features a hand-written file may
// use by accident (anchors, merge keys, tags, flow style, documents,
// comments, odd scalars) or on purpose (${VAR}, $$).
var fuzzSeeds = []string{
	good,
	"database:\n  url: ${PW}\n  shema: x\nfeeds:\n  f:\n    sinks:\n      s: {type: redis}\n",
	"a: [1, {b: *c}]\n",
	"database: &x\n  url: u\nlease: *x\n",
	"---\n---\n",
	"database:\n  url: \"\\xff\"\n  <<: {schema: s}\n",
	"database:\n  url: postgres://u:${PW}@h/d?x=$$1&y=$\n",
	"database:\n  url: ${PW}${PGPASS}\nfeeds:\n  f:\n    sinks:\n      s: {type: webhook, url: \"https://u:${PW}@h/\", secrets: [\"${PW}\"]}\n",
	"database:\n  url: ${PW\n",
	"database:\n  url: ${1PW}\n",
	"database:\n  url: ${NOPE}\n",
	"database:\n  url: x\nlease:\n  kind: advisory\n  ttl: 10s\n  heartbeat: 2s\n  margin: 3s\n",
	"database:\n  url: x\nlease:\n  ttl: 10s\n  heartbeat: 10s\n",
	"database:\n  url: x\nlease:\n  ttl: -1s\n",
	"database:\n  url: x\nlease:\n  ttl: 30\n",
	"database:\n  url: x\nhttp:\n  listen: \"[::1]:0\"\nlog: {format: json, level: debug}\n",
	"database:\n  url: x\nhttp:\n  listen: 9187\n",
	"database:\n  url: x\nhttp:\n  listen: ${PW}\nlog:\n  format: ${PW}\n  level: ${PW}\nlease:\n  kind: ${PW}\n  ttl: ${PW}\n",
	"database:\n  url: x\nfeeds:\n  f:\n    batch: ${PW}\n    sinks:\n      ${PW}:\n        type: ${PW}\n        url: u\n      s:\n        type: redis\n        url: u\n        ttl: ${PW}\n        tuning:\n          window: ${PW}\n",
	"database:\n  url: \"\"\n",
	"database:\n  url: x\nfeeds:\n  \"a b\":\n    sinks:\n      \"-s\": {type: redis, url: u}\n",
	"database:\n  url: x\nfeeds:\n  f:\n    batch: 100001\n    batch_bytes: -1\n    poll_interval: 1ms\n    sinks:\n      s: {type: redis, url: u, ttl: 1h, tuning: {window: 3}}\n",
	"database:\n  url: x\nfeeds:\n  f:\n    sinks: {}\n",
	"database:\n  url: x\nfeeds:\n  f:\n    sinks:\n      s: {type: rediss}\n      t: {type: redis, url: u, prefx: p}\n",
	"database:\n  url: x\nfeeds:\n  f:\n    sinks:\n      s: {type: redis, url: u}\n  f:\n    sinks:\n      s: {type: redis, url: u}\n",
	"database:\n  url: x\nfeeds:\n  - f\n",
	"database:\n  url: !!binary aGVsbG8=\n",
	"database:\n  url: x # a comment\n  schema: 'k''s'\nfeeds: ~\n",
	"database:\n  url: |\n    multi\n    line\n",
	"database:\n  url: x\nfeeds:\n  f:\n    batch: 0x10\n    sinks:\n      s: {type: redis, url: u, ttl: 1e3}\n",
	"\xef\xbb\xbfdatabase:\n  url: x\n",
	"database:\n\turl: x\n",
	"{database: {url: x}, feeds: {f: {sinks: {s: {type: webhook, url: u, secrets: whsec_x}}}}}\n",
}

// FuzzParse: whatever the bytes, Parse returns a config or Errors, never
// panics, never another error type, and answers the same twice. Errors each
// name the file and have a message, come in the order of the file, and
// never hold a secret that came from the environment. A config it returns
// keeps every rule check applies: a database URL, a known lease kind whose
// timings resolve, a listener address, a log format and level, valid and
// distinct feed and sink names, each feed with a sink, each sink of a known
// type with its options decoded and its place in the file recorded.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	const secret = "fuzz-s3cret-value"
	opts := ParseOptions{File: "f.yaml", Env: env(map[string]string{"PW": secret, "PGPASS": secret}), SinkTypes: types}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, opts)
		c2, err2 := Parse(data, opts)
		if (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() || err == nil && !reflect.DeepEqual(stripNodes(c), stripNodes(c2)) {
			t.Fatalf("Parse answers differently twice: %v / %v", err, err2)
		}
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("Parse = %T %v; want Errors", err, err)
			}
			for i, e := range es {
				if e.Msg == "" || e.File != "f.yaml" || !strings.HasPrefix(e.Error(), "f.yaml:") {
					t.Fatalf("an error without a message or its file: %+v", e)
				}
				if i > 0 && (e.Line < es[i-1].Line || e.Line == es[i-1].Line && e.Column < es[i-1].Column) {
					t.Fatalf("errors out of the file's order:\n%v", err)
				}
			}
			if strings.Contains(err.Error(), secret) && !strings.Contains(string(data), secret) {
				t.Fatalf("an expanded secret appears in the errors:\n%v", err)
			}
			return
		}
		checkParsed(t, c)
	})
}

// checkParsed fails t unless c keeps the rules Parse promises of a config it
// returns.
func checkParsed(t *testing.T, c *Config) {
	t.Helper()
	if c.Database.URL == "" {
		t.Fatalf("a config without a database URL: %+v", c.Database)
	}
	if k := c.Lease.Kind; k != "" && k != "row" && k != "advisory" {
		t.Fatalf("lease kind %q", k)
	}
	if _, err := (feed.LeaseOptions{TTL: c.Lease.TTL, Heartbeat: c.Lease.Heartbeat, Margin: c.Lease.Margin}).Resolve("lease"); err != nil {
		t.Fatalf("lease timings that do not resolve: %v", err)
	}
	if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
		t.Fatalf("http.listen %q: %v", c.HTTP.Listen, err)
	}
	if (c.Log.Format != "text" && c.Log.Format != "json") || !strings.Contains(" debug info warn error ", " "+c.Log.Level+" ") || c.Log.Level == "" {
		t.Fatalf("log %+v", c.Log)
	}
	feeds := map[string]bool{}
	for _, fd := range c.Feeds {
		if err := feed.FeedName(fd.Name).Validate(); err != nil || feeds[fd.Name] {
			t.Fatalf("feed %q: %v (or twice)", fd.Name, err)
		}
		feeds[fd.Name] = true
		if len(fd.Sinks) == 0 || fd.Batch < 0 || fd.Batch > feed.MaxBatchLimit || fd.BatchBytes < 0 {
			t.Fatalf("feed %q: %+v", fd.Name, fd)
		}
		sinks := map[string]bool{}
		for _, s := range fd.Sinks {
			if err := feed.SinkName(s.Name).Validate(); err != nil || sinks[s.Name] {
				t.Fatalf("sink %q of %q: %v (or twice)", s.Name, fd.Name, err)
			}
			sinks[s.Name] = true
			st, ok := types[s.Type]
			if !ok || s.Options == nil || reflect.TypeOf(s.Options) != reflect.TypeOf(st.Options()) || s.Path != "feeds."+fd.Name+".sinks."+s.Name {
				t.Fatalf("sink %+v", s)
			}
		}
	}
}

// stripNodes copies c without the syntax trees its sinks keep, which hold
// pointers that differ from one parse to the next.
func stripNodes(c *Config) Config {
	out := *c
	out.Feeds = append([]Feed(nil), c.Feeds...)
	for i := range out.Feeds {
		out.Feeds[i].Sinks = append([]Sink(nil), c.Feeds[i].Sinks...)
		for j := range out.Feeds[i].Sinks {
			out.Feeds[i].Sinks[j].Rest = Raw{}
		}
	}
	return out
}
