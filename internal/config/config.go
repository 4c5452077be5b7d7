// Package config reads the kairos command's configuration file: one YAML
// document with the database, the lease, the HTTP listener, logging,
// tombstone collection, and the feeds with their sinks. Every mistake is reported before anything
// connects, each as an *Error naming the key's dotted path
// (feeds.orders.sinks.cache.url), its line and column, and what was wanted;
// one run reports them all. A string may take values from the environment
// (${NAME}; $$ is a dollar sign), which is how secrets stay out of the file;
// no message ever repeats a string's value, expanded or not.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
)

// Config is the whole file, decoded and checked.
type Config struct {
	Database Database `yaml:"database,required"`
	Lease    Lease    `yaml:"lease"`
	HTTP     HTTP     `yaml:"http"`
	Log      Log      `yaml:"log"`
	Collect  Collect  `yaml:"collect"`
	Feeds    []Feed   `yaml:"feeds"`
}

// Collect is how kairos run collects the feeds' tombstones.
type Collect struct {
	// Interval is how often each feed's tombstones that every registered
	// sink has passed are deleted; 0 turns collection off, and left out it
	// is DefaultCollectInterval.
	Interval time.Duration `yaml:"interval"`
}

// DefaultCollectInterval is collect.interval when the file names none: a
// tombstone outlives its last sink's pass by about this long, and each
// collection of a feed with nothing to collect costs one statement.
const DefaultCollectInterval = time.Minute

// Database is where the feeds live.
type Database struct {
	// URL is a PostgreSQL connection string; usually ${KAIROS_DATABASE_URL}
	// or with its password from the environment.
	URL string `yaml:"url,required"`
	// ListenURL, when set, is a direct PostgreSQL connection string for the
	// one session that LISTENs for commits, mode switches and cursor moves:
	// a transaction pooler in URL's path (PgBouncer) delivers no
	// notifications, so without it the workers poll and sealers see a mode
	// switch late. Expanded and kept secret like URL.
	ListenURL string `yaml:"listen_url"`
	// Schema and TablePrefix place the feed's tables (pgfeed.Options).
	Schema      string `yaml:"schema"`
	TablePrefix string `yaml:"table_prefix"`
}

// Lease chooses the lease kind and its timings.
type Lease struct {
	// Kind is "row" (the default: lease rows, which work through a
	// transaction pooler) or "advisory" (session advisory locks, which
	// need a direct connection).
	Kind      string        `yaml:"kind"`
	TTL       time.Duration `yaml:"ttl"`
	Heartbeat time.Duration `yaml:"heartbeat"`
	Margin    time.Duration `yaml:"margin"`
}

// HTTP is the daemon's listener for health and metrics.
type HTTP struct {
	// Listen is host:port; empty means DefaultListen.
	Listen string `yaml:"listen"`
}

// Log chooses the log's format and level.
type Log struct {
	Format string `yaml:"format"` // text (default) or json
	Level  string `yaml:"level"`  // debug, info (default), warn, error
}

// Feed is one feed and the sinks it syncs to.
type Feed struct {
	Name  string `yaml:",key"`
	Sinks []Sink `yaml:"sinks,required"`
	// Batch and BatchBytes bound each read (syncer.Options); 0 means the
	// driver's defaults.
	Batch      int `yaml:"batch"`
	BatchBytes int `yaml:"batch_bytes"`
	// PollInterval is how often a worker looks for work when no wake-up
	// comes; 0 means the driver's default.
	PollInterval time.Duration `yaml:"poll_interval"`
}

// Sink is one sink of a feed: its type, and that type's options, decoded
// into the value the type's SinkType.Options returned.
type Sink struct {
	Name    string `yaml:",key"`
	Type    string `yaml:"type,required"`
	Options any
	// Path is the sink's place in the file (feeds.orders.sinks.cache), for
	// errors found later, when the sink is built.
	Path string
	// Rest is the sink's mapping as written, decoded into Options once the
	// type is known.
	Rest Raw `yaml:",rest"`
}

// DefaultListen is the HTTP listener's address when the file names none.
const DefaultListen = "127.0.0.1:9187"

// SinkType is what the file needs to know of a sink type: the options it
// takes, as a struct whose fields carry yaml tags (the decoder knows
// strings, booleans, whole numbers, durations, lists and nested structs;
// ",required" marks a key that must be set). Options returns a pointer to a
// fresh one with the type's defaults.
type SinkType struct {
	Options func() any
}

// ParseOptions say what Parse may consult.
type ParseOptions struct {
	// File names the file in errors.
	File string
	// Env looks up ${NAME}; defaults to os.LookupEnv.
	Env func(string) (string, bool)
	// SinkTypes are the sink types a sink may name, by type name.
	SinkTypes map[string]SinkType
}

// Load reads and parses the file at path; see Parse.
func Load(path string, opts ParseOptions) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if opts.File == "" {
		opts.File = path
	}
	return Parse(data, opts)
}

// Parse decodes and checks a configuration. Its error, when there is one,
// is Errors: every mistake found, in the order of the file.
func Parse(data []byte, opts ParseOptions) (*Config, error) {
	if opts.Env == nil {
		opts.Env = os.LookupEnv
	}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, syntaxError(opts.File, err)
	}
	if len(f.Docs) != 1 || f.Docs[0].Body == nil {
		if len(f.Docs) > 1 {
			return nil, Errors{{File: opts.File, Msg: "holds more than one YAML document; want one"}}
		}
		return nil, Errors{{File: opts.File, Msg: "is empty; want at least database.url"}}
	}
	d := &decoder{file: opts.File, nodes: map[string]ast.Node{}}
	d.expand = func(path string, n ast.Node, s string) (string, bool) {
		out, missing, bad := expandEnv(s, opts.Env)
		if bad != "" {
			d.fail(path, n, "%s", bad)
			return "", false
		}
		if len(missing) > 0 {
			d.fail(path, n, "names %s, which %s not set in the environment", strings.Join(missing, ", "), plural(len(missing), "is", "are"))
			return "", false
		}
		return out, true
	}
	var c Config
	d.decode("", f.Docs[0].Body, reflect.ValueOf(&c).Elem())
	d.check(&c, opts.SinkTypes)
	if len(d.errs) > 0 {
		sort.SliceStable(d.errs, func(i, j int) bool {
			a, b := d.errs[i], d.errs[j]
			return a.Line < b.Line || a.Line == b.Line && a.Column < b.Column
		})
		return nil, d.errs
	}
	return &c, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// syntaxError turns the parser's error into one Error with its position.
func syntaxError(file string, err error) error {
	e := &Error{File: file, Msg: "is not valid YAML"}
	var se *yaml.SyntaxError
	if errors.As(err, &se) {
		if t := se.GetToken(); t != nil && t.Position != nil {
			e.Line, e.Column = t.Position.Line, t.Position.Column
		}
		e.Msg += ": " + se.GetMessage()
	}
	return Errors{e}
}

// expandEnv replaces ${NAME} with NAME's value; $$ is one dollar sign. It
// returns the names that are not set, or why the text is malformed.
func expandEnv(s string, env func(string) (string, bool)) (out string, missing []string, bad string) {
	if !strings.Contains(s, "$") {
		return s, nil, ""
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '$' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if i+1 >= len(s) || s[i+1] != '{' {
			b.WriteByte('$') // a lone dollar is itself, as in a password
			continue
		}
		end := strings.IndexByte(s[i+2:], '}')
		if end < 0 {
			return "", nil, "has a ${ without its closing }; write $$ for a dollar sign"
		}
		name := s[i+2 : i+2+end]
		if !validEnvName(name) {
			return "", nil, fmt.Sprintf("has ${%s}, which is not an environment variable's name (letters, digits and _, not starting with a digit)", name)
		}
		v, ok := env(name)
		if !ok {
			missing = append(missing, name)
		}
		b.WriteString(v)
		i += 2 + end
	}
	return b.String(), missing, ""
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// check applies the rules the decoder's types cannot say.
func (d *decoder) check(c *Config, types map[string]SinkType) {
	at := func(path string) ast.Node { return d.nodes[path] }
	switch c.Lease.Kind {
	case "", "row", "advisory":
	default:
		d.fail("lease.kind", at("lease.kind"), "%s", oneOf(c.Lease.Kind, "row", "advisory"))
	}
	lo := feed.LeaseOptions{TTL: c.Lease.TTL, Heartbeat: c.Lease.Heartbeat, Margin: c.Lease.Margin}
	if _, err := lo.Resolve("lease"); err != nil {
		var inv *feed.InvalidError
		if errors.As(err, &inv) {
			d.fail(inv.Field, at(inv.Field), "%s", inv.Reason)
		} else {
			d.fail("lease", at("lease"), "%v", err)
		}
	}
	if c.HTTP.Listen == "" {
		c.HTTP.Listen = DefaultListen
	} else if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
		d.fail("http.listen", at("http.listen"), "is not host:port (like 127.0.0.1:9187 or :9187)")
	}
	if at("collect.interval") == nil {
		c.Collect.Interval = DefaultCollectInterval
	}
	switch c.Log.Format {
	case "":
		c.Log.Format = "text"
	case "text", "json":
	default:
		d.fail("log.format", at("log.format"), "%s", oneOf(c.Log.Format, "text", "json"))
	}
	switch c.Log.Level {
	case "":
		c.Log.Level = "info"
	case "debug", "info", "warn", "error":
	default:
		d.fail("log.level", at("log.level"), "%s", oneOf(c.Log.Level, "debug", "info", "warn", "error"))
	}
	// The store checks its names again when it opens; checking them here
	// too places a mistake in the file, and lets config check find it.
	// "generations" is the longest table name pgfeed puts after the prefix
	// (pgread's, under its own prefix, are no longer).
	if _, err := pgschema.ResolveNames(c.Database.Schema, c.Database.TablePrefix, "kairos", "feed_", "generations"); err != nil {
		var inv *feed.InvalidError
		if errors.As(err, &inv) {
			d.fail("database."+inv.Field, at("database."+inv.Field), "%s", inv.Reason)
		}
	}
	for i := range c.Feeds {
		fd := &c.Feeds[i]
		fp := "feeds." + fd.Name
		if err := feed.FeedName(fd.Name).Validate(); err != nil {
			d.fail(fp, at(fp), "is not a feed name: %s", reason(err))
		}
		if fd.Batch < 0 || fd.Batch > feed.MaxBatchLimit {
			d.fail(fp+".batch", at(fp+".batch"), "is %d; want 1 to %d, or leave it out for the default", fd.Batch, feed.MaxBatchLimit)
		}
		if fd.BatchBytes < 0 {
			d.fail(fp+".batch_bytes", at(fp+".batch_bytes"), "is %d; want a positive size in bytes", fd.BatchBytes)
		}
		if len(fd.Sinks) == 0 && at(fp+".sinks") != nil {
			d.fail(fp+".sinks", at(fp+".sinks"), "is empty; a feed needs at least one sink")
		}
		for j := range fd.Sinks {
			s := &fd.Sinks[j]
			sp := fp + ".sinks." + s.Name
			s.Path = sp
			if err := feed.SinkName(s.Name).Validate(); err != nil {
				d.fail(sp, at(sp), "is not a sink name: %s", reason(err))
			}
			if s.Type == "" {
				continue // reported as required, as empty, or as the wrong kind
			}
			st, ok := types[s.Type]
			if !ok {
				known := make([]string, 0, len(types))
				for k := range types {
					known = append(known, k)
				}
				sort.Strings(known)
				d.fail(sp+".type", at(sp+".type"), "is not a sink type; %s", strings.TrimPrefix(oneOf(s.Type, known...), "is not one of the choices; "))
				continue
			}
			opts := st.Options()
			d.decodeRest(sp, s.Rest.Node, reflect.ValueOf(opts).Elem(), "type")
			s.Options = opts
		}
	}
}

// decodeRest decodes a mapping into v as decodeStruct does, except for the
// keys skip names, which an outer struct has taken.
func (d *decoder) decodeRest(path string, n ast.Node, v reflect.Value, skip ...string) {
	pairs, ok := d.mapping(path, n)
	if !ok {
		return
	}
	var kept []*ast.MappingValueNode
	for _, p := range pairs {
		if k, ok := unwrap(p.Key).(*ast.StringNode); ok && slices.Contains(skip, k.Value) {
			continue
		}
		kept = append(kept, p)
	}
	m := &ast.MappingNode{BaseNode: &ast.BaseNode{}, Values: kept}
	if mn, ok := unwrap(n).(*ast.MappingNode); ok {
		m.Start = mn.Start
	} else if len(pairs) > 0 {
		m.Start = pairs[0].GetToken()
	}
	d.decodeStruct(path, m, v)
}

// oneOf says a value is not among the choices, suggesting the nearest one
// when it looks like a typo; it never repeats the value itself, which could
// be a secret put in the wrong place.
func oneOf(v string, choices ...string) string {
	msg := "is not one of the choices; "
	if g := suggest(v, choices); g != "" {
		msg += fmt.Sprintf("did you mean %q? ", g)
	}
	if len(choices) == 2 {
		return msg + "want " + choices[0] + " or " + choices[1]
	}
	return msg + "want one of " + strings.Join(choices, ", ")
}

// reason is an InvalidError's reason alone, or err's text.
func reason(err error) string {
	var inv *feed.InvalidError
	if errors.As(err, &inv) {
		return inv.Reason
	}
	return err.Error()
}
