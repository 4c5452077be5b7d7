package pgschema_test

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgschema"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// identRule is ValidIdent's rule as its doc states it, as a regular
// expression.
var identRule = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// identSeeds are FuzzIdent's seeds; TestQuotedIdentifiersOnPostgreSQL sends
// them and the committed corpus to the server.
var identSeeds = []string{
	"kairos", "_", "feed_", "a1", "pg_catalog", "pg_", "select", "user", "order", "table", strings.Repeat("z", 63),
	"", "1a", "Kairos", "ka\"iros", "ka'iros", `ka\iros`, "ka iros", "kai.ros", "kai;ros", "kaïros", "k\x00", "k\n",
	strings.Repeat("z", 64), `"kairos"`, "k$",
}

// unquotePG reads q as PostgreSQL's lexer reads a quoted identifier: a
// double quote, then any characters but NUL with each double quote inside
// doubled, then a double quote; empty is an error ("zero-length delimited
// identifier"), and a name longer than 63 bytes is cut to 63, which would
// name another object than the one meant, so it is an error here.
func unquotePG(q string) (string, bool) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	in := q[1 : len(q)-1]
	for i := 0; i < len(in); i++ {
		switch c := in[i]; {
		case c == 0:
			return "", false
		case c == '"':
			if i+1 >= len(in) || in[i+1] != '"' {
				return "", false // the identifier would end here
			}
			b.WriteByte('"')
			i++
		default:
			b.WriteByte(c)
		}
	}
	s := b.String()
	return s, s != "" && len(s) <= pgschema.MaxIdentLen
}

// FuzzIdent holds ValidIdent to the identifier rule, its refusals to a clean
// error naming the field, Quote to PostgreSQL's quoted-identifier syntax (the
// quoted form of an accepted name reads back as that name, uncut, and reads
// the same unquoted, since PostgreSQL folds unquoted names to lower case),
// and ResolveNames to the rule plus its two extra conditions.
func FuzzIdent(f *testing.F) {
	for _, s := range identSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := identRule.MatchString(s) && len(s) <= pgschema.MaxIdentLen
		err := pgschema.ValidIdent("schema", s, pgschema.MaxIdentLen)
		if (err == nil) != want {
			t.Fatalf("ValidIdent(%q) = %v; the rule says valid = %v", s, err, want)
		}
		if err != nil {
			var inv *feed.InvalidError
			if !errors.As(err, &inv) || inv.Field != "schema" {
				t.Fatalf("ValidIdent(%q) = %v; want an *InvalidError naming schema", s, err)
			}
			if msg := err.Error(); !utf8.ValidString(msg) || strings.ContainsFunc(msg, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) {
				t.Fatalf("ValidIdent(%q) = %q, not one printable line", s, msg)
			}
		} else {
			q := pgschema.Quote(s)
			if back, ok := unquotePG(q); !ok || back != s || strings.ToLower(s) != s {
				t.Fatalf("Quote(%q) = %s, which PostgreSQL reads as %q (ok %v)", s, q, back, ok)
			}
		}

		const longest = "generations"
		n, err := pgschema.ResolveNames(s, s, "kairos", "feed_", longest)
		if s == "" { // empty means the defaults
			if err != nil || n != (pgschema.Names{Schema: "kairos", Prefix: "feed_"}) {
				t.Fatalf("ResolveNames(\"\", \"\") = %+v, %v; want the defaults", n, err)
			}
			return
		}
		wantNames := want && !strings.HasPrefix(s, "pg_") && len(s)+len(longest) <= pgschema.MaxIdentLen
		if (err == nil) != wantNames {
			t.Fatalf("ResolveNames(%q, %q) = %v; the rule says valid = %v", s, s, err, wantNames)
		}
		if err != nil {
			var inv *feed.InvalidError
			if !errors.As(err, &inv) || inv.Field != "schema" && inv.Field != "table_prefix" {
				t.Fatalf("ResolveNames(%q) = %v; want an *InvalidError naming schema or table_prefix", s, err)
			}
			return
		}
		schema, table, ok := strings.Cut(n.Table(longest), ".")
		if ok {
			schema, ok = unquotePG(schema)
		}
		if ok {
			table, ok = unquotePG(table)
		}
		if !ok || schema != s || table != s+longest {
			t.Fatalf("Table(%q) = %s; PostgreSQL reads %q.%q (ok %v)", longest, n.Table(longest), schema, table, ok)
		}
	})
}

// TestQuotedIdentifiersOnPostgreSQL asks the server itself: every seed and
// corpus entry ValidIdent accepts, quoted, names a column exactly so, and so
// does its schema-qualified table name as ResolveNames builds it.
func TestQuotedIdentifiersOnPostgreSQL(t *testing.T) {
	t.Parallel()
	idents := append([]string(nil), identSeeds...)
	files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzIdent", "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		v := lines[len(lines)-1]
		s, err := strconv.Unquote(v[strings.IndexByte(v, '(')+1 : strings.LastIndexByte(v, ')')])
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		idents = append(idents, s)
	}
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	accepted := 0
	for _, s := range idents {
		if pgschema.ValidIdent("schema", s, pgschema.MaxIdentLen) != nil {
			continue
		}
		accepted++
		rows, err := pool.Query(t.Context(), `SELECT 1 AS `+pgschema.Quote(s))
		if err != nil {
			t.Fatalf("SELECT 1 AS %s: %v", pgschema.Quote(s), err)
		}
		name := rows.FieldDescriptions()[0].Name
		rows.Close()
		if name != s {
			t.Errorf("PostgreSQL reads %s as %q", pgschema.Quote(s), name)
		}
		if n, err := pgschema.ResolveNames(s, s, "kairos", "feed_", "x"); err == nil {
			var reg *string
			if err := pool.QueryRow(t.Context(), `SELECT to_regclass($1)::text`, n.Table("x")).Scan(&reg); err != nil {
				t.Errorf("to_regclass(%s): %v", n.Table("x"), err)
			}
		}
	}
	if accepted < 5 {
		t.Fatalf("only %d identifiers reached the server", accepted)
	}
}
