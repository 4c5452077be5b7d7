package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// update rewrites the golden files with what the tests get:
//
//	go test ./cmd/kairos -run TestX -update
//
// then read the diff before committing it.
var update = flag.Bool("update", false, "rewrite testdata/*.golden with the output the tests get")

// transcript records command lines, their exit codes and their whole output,
// for comparison with a golden file (testdata/NAME.golden). Its assertions
// are the golden file's: every line of every output, and every exit code.
type transcript struct {
	t     *testing.T
	name  string
	subst []string // pairs: a text the test chose at random, and its mask
	b     strings.Builder
}

// golden starts a transcript checked against testdata/name.golden when the
// test ends. subst pairs texts the test made (a config file's path, a
// schema) with what to show instead.
func golden(t *testing.T, name string, subst ...string) *transcript {
	t.Helper()
	g := &transcript{t: t, name: name, subst: subst}
	t.Cleanup(g.check)
	return g
}

// run runs one command line, as kairos does, and records it.
func (g *transcript) run(args ...string) (code int, stdout, stderr string) {
	g.t.Helper()
	code, stdout, stderr = kairos(g.t, args...)
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = a
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			shown[i] = strconv.Quote(a)
		}
	}
	fmt.Fprintf(&g.b, "$ kairos %s\nexit %d\n", strings.Join(shown, " "), code)
	for _, o := range []struct{ name, text string }{{"stdout", stdout}, {"stderr", stderr}} {
		if o.text == "" {
			continue
		}
		fmt.Fprintf(&g.b, "--- %s\n%s", o.name, o.text)
		if !strings.HasSuffix(o.text, "\n") {
			g.b.WriteString("⏎ (no final newline)\n")
		}
	}
	g.b.WriteString("\n")
	return code, stdout, stderr
}

func (g *transcript) check() {
	t := g.t
	if t.Failed() {
		return // the test's own message says more than a diff would
	}
	got := normalise(g.b.String(), g.subst...)
	path := filepath.Join("testdata", g.name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("the output differs from %s (-update rewrites it):\n%s", path, lineDiff(string(want), got))
	}
}

// masks are what normalise hides, in order. Each is something that changes
// from run to run while the output around it does not:
//   - lease holders, random per lease taken;
//   - timestamps (RFC 3339, as JSON and YAML show them) and the seconds
//     figures measured against the database's clock (ages, time left);
//   - ages and times left as the tables show them (12s ago, 3m04s left);
//   - the test schemas' random names, and the migration lock's key, which
//     migrate --print derives from the schema's name;
//   - the Go version and the build's revision, in kairos version.
//
// Then, in tables only, runs of two or more spaces become two: a masked
// cell's width moves the columns after it, so the alignment itself is left to
// the table writer, and the golden file checks the cells, their order and
// the headers.
var masks = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`pg-(row|advisory):[0-9a-f]{16}`), "pg-$1:<holder>"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`), "<time>"},
	{regexp.MustCompile(`("?(?:last_advance_age_seconds|lease_expires_in_seconds|oldest_tombstone_age_seconds)"?: )-?[0-9.e+-]+`), "$1<seconds>"},
	{regexp.MustCompile(`\b(\d+d)?(\d+h)?(\d+m)?\d+s (ago|left)`), "<age> $4"},
	{regexp.MustCompile(`\b(\d+d\d+h|\d+h\d+m|\d+m\d+s) (ago|left)`), "<age> $2"},
	{regexp.MustCompile(`\bt_[0-9a-f]{12}\b`), "<schema>"},
	{regexp.MustCompile(`pg_advisory_xact_lock\(-?\d+\)`), "pg_advisory_xact_lock(<key>)"},
	{regexp.MustCompile(`\bgo1\.\d+(\.\d+)?\S*`), "<go>"},
	{regexp.MustCompile(`\(([0-9a-f]{12})(\+dirty)?\)`), "(<revision>)"},
}

var spaces = regexp.MustCompile(`  +`)

// normalise applies subst (pairs of text and mask), then masks; see masks.
func normalise(s string, subst ...string) string {
	for i := 0; i+1 < len(subst); i += 2 {
		if subst[i] != "" {
			s = strings.ReplaceAll(s, subst[i], subst[i+1])
		}
	}
	for _, m := range masks {
		s = m.re.ReplaceAllString(s, m.with)
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.Contains(strings.TrimLeft(l, " "), "  ") && !strings.HasPrefix(strings.TrimSpace(l), "{") && !strings.HasPrefix(strings.TrimSpace(l), "\"") && !strings.HasPrefix(strings.TrimSpace(l), "--") {
			indent := len(l) - len(strings.TrimLeft(l, " "))
			lines[i] = l[:indent] + spaces.ReplaceAllString(l[indent:], "  ")
		}
	}
	return strings.Join(lines, "\n")
}

// lineDiff shows the lines that differ, each with its number.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 20; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %q\n  got  %q\n", i+1, wl, gl)
			shown++
		}
	}
	return b.String()
}

// TestNormalise holds the masks to what they claim: each varying part
// masked, the rest kept.
func TestNormalise(t *testing.T) {
	in := "  cache  1/2     1        12s ago       pg-row:a180a77e29511e13 (29s left)  1\n" +
		`  "last_advance_at": "2026-12-02T01:05:03.123456Z",` + "\n" +
		`  "lease_expires_in_seconds": 29.5,` + "\n" +
		"  last_advance_age_seconds: 0.012\n" +
		"schema t_0123456789ab and 3m04s ago, 2h05m left\n" +
		"kairos devel (0123456789ab+dirty) go1.26.8\n"
	want := "  cache  1/2  1  <age> ago  pg-row:<holder> (<age> left)  1\n" +
		`  "last_advance_at": "<time>",` + "\n" +
		`  "lease_expires_in_seconds": <seconds>,` + "\n" +
		"  last_advance_age_seconds: <seconds>\n" +
		"schema <schema> and <age> ago, <age> left\n" +
		"kairos devel (<revision>) <go>\n"
	if got := normalise(in); got != want {
		t.Errorf("normalise:\n%s", lineDiff(want, got))
	}
}
