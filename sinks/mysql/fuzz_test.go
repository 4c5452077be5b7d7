package mysql

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/kairos-es/kairos/feed"
)

// tableRule is Options.Table's rule as its doc states it.
var tableRule = regexp.MustCompile(`^[A-Za-z0-9_$]+$`)

// tableSeeds are FuzzTable's seeds, which TestQuotedTablesOnTheServer sends to
// the server.
var tableSeeds = []string{
	"kairos_docs", "t", "T", "$", "_", "1a", "a1", "select", "order", "key", strings.Repeat("t", MaxTableLen),
	"", "123", "a-b", "a b", "a`b", "a.b", "a;b", `a"b`, "a'b", "ä", "a\x00", strings.Repeat("t", MaxTableLen+1),
}

// unquoteMySQL reads q as MySQL's lexer reads a quoted identifier: a
// backtick, then any characters but NUL with each backtick inside doubled,
// then a backtick; ok only when q is exactly one such identifier.
func unquoteMySQL(q string) (string, bool) {
	if len(q) < 2 || q[0] != '`' || q[len(q)-1] != '`' {
		return "", false
	}
	var b strings.Builder
	in := q[1 : len(q)-1]
	for i := 0; i < len(in); i++ {
		switch {
		case in[i] == 0:
			return "", false
		case in[i] == '`':
			if i+1 >= len(in) || in[i+1] != '`' {
				return "", false
			}
			b.WriteByte('`')
			i++
		default:
			b.WriteByte(in[i])
		}
	}
	return b.String(), b.Len() > 0
}

// FuzzTable holds Options.Table's check to its documented rule (empty means
// the default), its refusals to an *InvalidError naming mysql.table, and the
// quoting of an accepted name, and of the shadow and retired copies a resync
// names after it, to MySQL's quoted-identifier syntax within its 64-byte
// limit.
func FuzzTable(f *testing.F) {
	for _, s := range tableSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := Options{Table: s}.resolve()
		want := s == "" || tableRule.MatchString(s) && len(s) <= MaxTableLen && strings.Trim(s, "0123456789") != ""
		if (err == nil) != want {
			t.Fatalf("resolve(%q) = %v; the rule says valid = %v", s, err, want)
		}
		if err != nil {
			var inv *feed.InvalidError
			if !errors.As(err, &inv) || inv.Field != "mysql.table" {
				t.Fatalf("resolve(%q) = %v; want an *InvalidError naming mysql.table", s, err)
			}
			return
		}
		for _, name := range []string{o.Table, o.Table + suffixShadow + strings.Repeat("f", suffixRandLen)} {
			if back, ok := unquoteMySQL(quote(name)); !ok || back != name || len(name) > 64 {
				t.Fatalf("quote(%q) = %s, which MySQL reads as %q (ok %v)", name, quote(name), back, ok)
			}
		}
	})
}

// TestQuotedTablesOnTheServer asks the server: every seed the rule accepts,
// quoted, names a column exactly so.
func TestQuotedTablesOnTheServer(t *testing.T) {
	t.Parallel()
	db := adminDB(t)
	n := 0
	for _, s := range tableSeeds {
		if _, err := (Options{Table: s}).resolve(); err != nil || s == "" {
			continue
		}
		n++
		rows, err := db.QueryContext(t.Context(), "SELECT 1 AS "+quote(s))
		if err != nil {
			t.Fatalf("SELECT 1 AS %s: %v", quote(s), err)
		}
		cols, err := rows.Columns()
		rows.Close()
		if err != nil || len(cols) != 1 || cols[0] != s {
			t.Errorf("the server reads %s as %q (%v)", quote(s), cols, err)
		}
	}
	if n < 5 {
		t.Fatalf("only %d names reached the server", n)
	}
}
