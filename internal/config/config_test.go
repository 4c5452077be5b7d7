package config

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

type cacheOptions struct {
	URL     string        `yaml:"url,required"`
	TTL     time.Duration `yaml:"ttl"`
	Prefix  string        `yaml:"prefix"`
	Secrets []string      `yaml:"secrets"`
	Tuning  struct {
		Window int `yaml:"window"`
	} `yaml:"tuning"`
}

var types = map[string]SinkType{
	"redis":   {Options: func() any { return &cacheOptions{Prefix: "kairos:"} }},
	"webhook": {Options: func() any { return &cacheOptions{} }},
}

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

const good = `database:
  url: postgres://app:${PGPASS}@db/app
  schema: kairos
lease:
  kind: advisory
  ttl: 30s
http:
  listen: :9187
log:
  format: json
feeds:
  orders:
    batch: 200
    sinks:
      cache:
        type: redis
        url: redis://cache:6379
        ttl: 1h
        tuning:
          window: 64
      hook:
        type: webhook
        url: https://example.com/in
        secrets: [whsec_a, whsec_b]
  users:
    sinks:
      cache:
        type: redis
        url: redis://cache:6379
`

func TestParseGood(t *testing.T) {
	c, err := Parse([]byte(good), ParseOptions{File: "k.yaml", Env: env(map[string]string{"PGPASS": "s3cret"}), SinkTypes: types})
	if err != nil {
		t.Fatal(err)
	}
	if c.Database.URL != "postgres://app:s3cret@db/app" || c.Database.Schema != "kairos" {
		t.Errorf("database = %+v", c.Database)
	}
	if c.Lease.Kind != "advisory" || c.Lease.TTL != 30*time.Second || c.HTTP.Listen != ":9187" || c.Log.Format != "json" || c.Log.Level != "info" {
		t.Errorf("lease %+v http %+v log %+v", c.Lease, c.HTTP, c.Log)
	}
	if len(c.Feeds) != 2 || c.Feeds[0].Name != "orders" || c.Feeds[1].Name != "users" || c.Feeds[0].Batch != 200 {
		t.Fatalf("feeds = %+v", c.Feeds)
	}
	s := c.Feeds[0].Sinks
	if len(s) != 2 || s[0].Name != "cache" || s[0].Type != "redis" || s[1].Name != "hook" || s[0].Path != "feeds.orders.sinks.cache" {
		t.Fatalf("sinks = %+v", s)
	}
	o := s[0].Options.(*cacheOptions)
	if o.URL != "redis://cache:6379" || o.TTL != time.Hour || o.Prefix != "kairos:" || o.Tuning.Window != 64 {
		t.Errorf("cache options = %+v (the type's default prefix must survive)", o)
	}
	if h := s[1].Options.(*cacheOptions); len(h.Secrets) != 2 || h.Secrets[1] != "whsec_b" {
		t.Errorf("hook options = %+v", h)
	}
}

// collect.interval defaults to DefaultCollectInterval when left out (with
// or without its collect section), and 0, with or without a unit, turns
// collection off.
func TestCollectInterval(t *testing.T) {
	for _, c := range []struct {
		text string
		want time.Duration
	}{
		{"", DefaultCollectInterval},
		{"collect:\n", DefaultCollectInterval},
		{"collect: {}\n", DefaultCollectInterval},
		{"collect:\n  interval: 90s\n", 90 * time.Second},
		{"collect:\n  interval: 0\n", 0},
		{"collect:\n  interval: 0s\n", 0},
		{"collect:\n  interval: \"${EVERY}\"\n", 5 * time.Minute},
	} {
		cfg, err := Parse([]byte("database:\n  url: x\n"+c.text), ParseOptions{Env: env(map[string]string{"EVERY": "5m"}), SinkTypes: types})
		if err != nil {
			t.Errorf("%q: %v", c.text, err)
			continue
		}
		if cfg.Collect.Interval != c.want {
			t.Errorf("%q: collect.interval = %v, want %v", c.text, cfg.Collect.Interval, c.want)
		}
	}
}

// Each mistake is reported with its path and line, and one run reports all
// of them, in the order of the file.
func TestParseMistakes(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       []string // "line path: message fragment"
	}{
		{"unknown key with a suggestion", "database:\n  url: x\n  shema: k\n", []string{"3 database.shema: is not a known key; did you mean \"schema\"?"}},
		{"unknown key without one", "database:\n  url: x\nzebra: 1\n", []string{"3 zebra: is not a known key; known keys: collect, database, feeds, http, lease, log"}},
		{"wrong type", "database:\n  url: x\nfeeds:\n  f:\n    batch: many\n    sinks:\n      s: {type: redis, url: u}\n", []string{"5 feeds.f.batch: is not a whole number"}},
		{"bad duration", "database:\n  url: x\nlease:\n  ttl: 30\n", []string{"4 lease.ttl: is 30; want a duration with its unit"}},
		{"bad duration string", "database:\n  url: x\nlease:\n  ttl: 3 s\n", []string{"4 lease.ttl: is not a duration"}},
		{"lease rule", "database:\n  url: x\nlease:\n  ttl: 10s\n  heartbeat: 10s\n", []string{"5 lease.heartbeat:"}},
		{"unknown sink type", "database:\n  url: x\nfeeds:\n  f:\n    sinks:\n      s:\n        type: rediss\n", []string{"7 feeds.f.sinks.s.type: is not a sink type; did you mean \"redis\"? want redis or webhook"}},
		{"missing sink url", "database:\n  url: x\nfeeds:\n  f:\n    sinks:\n      cache:\n        type: redis\n        ttl: 1m\n", []string{"feeds.f.sinks.cache.url: is required"}},
		{"sink option typo", "database:\n  url: x\nfeeds:\n  f:\n    sinks:\n      cache:\n        type: redis\n        url: u\n        prefx: p\n", []string{"9 feeds.f.sinks.cache.prefx: is not a known key; did you mean \"prefix\"?"}},
		{"sink name twice", "database:\n  url: x\nfeeds:\n  f:\n    sinks:\n      s: {type: redis, url: u}\n      s: {type: redis, url: v}\n", []string{"7 mapping key \"s\" already defined"}},
		{"bad schema", "database:\n  url: x\n  schema: Kairos\n", []string{"3 database.schema: has 'K' at offset 0"}},
		{"reserved schema", "database:\n  url: x\n  schema: pg_kairos\n", []string{"3 database.schema: starts with \"pg_\""}},
		{"bad table prefix", "database:\n  url: x\n  table_prefix: \"f;\"\n", []string{"3 database.table_prefix: has ';' at offset 1"}},
		{"table prefix too long", "database:\n  url: x\n  table_prefix: " + strings.Repeat("p", 53) + "\n", []string{"3 database.table_prefix: is 53 bytes long"}},
		{"missing database url", "database:\n  schema: k\n", []string{"database.url: is required"}},
		{"empty database url", "database:\n  url: \"\"\n", []string{"database.url: is empty"}},
		{"empty sink type", "database:\n  url: x\nfeeds:\n  f:\n    sinks:\n      s: {type: \"\"}\n", []string{"feeds.f.sinks.s.type: is empty"}},
		{"empty sink url", "database:\n  url: x\nfeeds:\n  f:\n    sinks:\n      cache: {type: redis, url: ''}\n", []string{"feeds.f.sinks.cache.url: is empty"}},
		{"missing database", "lease:\n  kind: row\n", []string{"database: is required"}},
		{"bad lease kind", "database:\n  url: x\nlease:\n  kind: mutex\n", []string{"4 lease.kind: is not one of the choices; want row or advisory"}},
		{"bad feed name", "database:\n  url: x\nfeeds:\n  \"a b\":\n    sinks:\n      s: {type: redis, url: u}\n", []string{"4 feeds.a b: is not a feed name"}},
		{"no sinks", "database:\n  url: x\nfeeds:\n  f:\n    batch: 3\n", []string{"feeds.f.sinks: is required"}},
		{"a list where a mapping is wanted", "database:\n  url: x\nfeeds:\n  - f\n", []string{"4 feeds: is a list; want a mapping"}},
		{"unset variable", "database:\n  url: postgres://u:${NOPE}@h/d\n", []string{"2 database.url: names NOPE, which is not set"}},
		{"unclosed variable", "database:\n  url: postgres://u:${NOPE@h/d\n", []string{"2 database.url: has a ${ without its closing }"}},
		{"bad listen", "database:\n  url: x\nhttp:\n  listen: 9187\n", []string{"4 http.listen: is not host:port"}},
		{"bad log level", "database:\n  url: x\nlog:\n  level: loud\n", []string{"4 log.level: is not one of the choices; want one of debug, info, warn, error"}},
		{"negative collect interval", "database:\n  url: x\ncollect:\n  interval: -1m\n", []string{"4 collect.interval: is -1m0s; durations must not be negative"}},
		{"collect interval without its unit", "database:\n  url: x\ncollect:\n  interval: 60\n", []string{"4 collect.interval: is 60; want a duration with its unit"}},
		{"collect interval not a duration", "database:\n  url: x\ncollect:\n  interval: hourly\n", []string{"4 collect.interval: is not a duration"}},
		{"collect interval typo", "database:\n  url: x\ncollect:\n  intervl: 1m\n", []string{"4 collect.intervl: is not a known key; did you mean \"interval\"?"}},
		{"collect not a mapping", "database:\n  url: x\ncollect: 1m\n", []string{"3 collect: is a string; want a mapping"}},
		{"syntax", "database:\n  url: [x\n", []string{"is not valid YAML"}},
		{"all at once", "database:\n  url: x\n  shema: k\nlease:\n  ttl: forever\nlog:\n  format: xml\n", []string{"3 database.shema:", "5 lease.ttl:", "7 log.format:"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml), ParseOptions{File: "k.yaml", Env: env(nil), SinkTypes: types})
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("Parse = %v; want Errors", err)
			}
			if len(es) != len(c.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(es), len(c.want), err)
			}
			for i, w := range c.want {
				line, rest, hasLine := strings.Cut(w, " ")
				e := es[i]
				got := e.Path + ": " + e.Msg
				if !hasLine || !strings.ContainsAny(line[:1], "0123456789") {
					rest = w
				} else if want := line; want != strconv.Itoa(e.Line) {
					t.Errorf("error %d is on line %d, want %s: %v", i, e.Line, want, e)
				}
				if !strings.Contains(got, rest) && !strings.Contains(e.Error(), rest) {
					t.Errorf("error %d = %q; want it to contain %q", i, e.Error(), rest)
				}
				if !strings.HasPrefix(e.Error(), "k.yaml:") {
					t.Errorf("error %d does not name the file: %v", i, e)
				}
			}
		})
	}
}

// No message repeats a string's value, expanded from the environment or
// written in the file, whatever is wrong around it.
func TestParseNeverEchoesSecrets(t *testing.T) {
	const secret = "hunter2-s3cret"
	yaml := "database:\n  url: postgres://u:${PW}@h/d\n  shema: " + secret + "\nfeeds:\n  f:\n    sinks:\n      s:\n        type: redis\n        url: " + secret + "\n        ttl: " + secret + "\n        tuning: " + secret + "\nlease:\n  kind: " + secret + "\nlog:\n  level: ${PW}\n"
	_, err := Parse([]byte(yaml), ParseOptions{File: "k.yaml", Env: env(map[string]string{"PW": secret}), SinkTypes: types})
	if err == nil {
		t.Fatal("Parse accepted a file with mistakes")
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("an error repeats a value:\n%v", err)
	}
	if !strings.Contains(err.Error(), "feeds.f.sinks.s.ttl") || !strings.Contains(err.Error(), "feeds.f.sinks.s.tuning") || !strings.Contains(err.Error(), "lease.kind") || !strings.Contains(err.Error(), "log.level") {
		t.Fatalf("the mistakes are not all named:\n%v", err)
	}
}

func TestExpandEnv(t *testing.T) {
	e := env(map[string]string{"A": "1", "B_2": "two"})
	for in, want := range map[string]string{
		"plain": "plain", "${A}": "1", "x${A}y${B_2}": "x1ytwo", "$$": "$", "$${A}": "${A}", "pa$word": "pa$word", "end$": "end$",
	} {
		got, missing, bad := expandEnv(in, e)
		if got != want || len(missing) != 0 || bad != "" {
			t.Errorf("expandEnv(%q) = %q, %v, %q; want %q", in, got, missing, bad, want)
		}
	}
	if _, missing, _ := expandEnv("${A}${C}${D}", e); len(missing) != 2 {
		t.Errorf("missing = %v; want C and D", missing)
	}
	if _, _, bad := expandEnv("${1X}", e); bad == "" {
		t.Error("${1X} was accepted")
	}
}
