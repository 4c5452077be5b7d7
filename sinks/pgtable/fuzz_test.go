package pgtable_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/pgtable"
)

// identRule is Options.Table's identifier rule as its doc states it.
var identRule = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// FuzzIdentifier holds the identifier check of the table, schema and column
// names to its documented rule, its refusals to an *InvalidError naming the
// field, and the quoting of an accepted name to PostgreSQL's quoted-identifier
// syntax: a double quote at each end and none inside, so the server reads the
// name back as written, and no longer than its 63-byte limit.
// internal/pgschema's tests send such names to the server.
func FuzzIdentifier(f *testing.F) {
	for _, s := range []string{"orders", "_", "t1", "select", "", "1t", "Orders", `t"`, "t;drop", "t.x", "é", "t\x00", strings.Repeat("t", pgtable.MaxTableLen), strings.Repeat("t", pgtable.MaxIdentifierLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, max := range []int{pgtable.MaxTableLen, pgtable.MaxIdentifierLen} {
			err := pgtable.Identifier("pgtable.table", s, max)
			want := identRule.MatchString(s) && len(s) <= max
			if (err == nil) != want {
				t.Fatalf("identifier(%q, %d) = %v; the rule says valid = %v", s, max, err, want)
			}
			if err != nil {
				var inv *feed.InvalidError
				if !errors.As(err, &inv) || inv.Field != "pgtable.table" {
					t.Fatalf("identifier(%q) = %v; want an *InvalidError naming pgtable.table", s, err)
				}
				continue
			}
			q := pgtable.Quote(s)
			if len(q) != len(s)+2 || q[0] != '"' || q[len(q)-1] != '"' || strings.ContainsAny(q[1:len(q)-1], "\"\x00") || q[1:len(q)-1] != s || len(s) > pgtable.MaxIdentifierLen {
				t.Fatalf("quote(%q) = %s is not a quoted identifier PostgreSQL reads as %q", s, q, s)
			}
		}
	})
}
