package pgfeed_test

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// TestDocumentRuleIsPostgres holds feed.ValidateDocument to the server it
// protects: for documents drawn near every edge of the rule (escapes,
// surrogates, UTF-8, control bytes, numbers at numeric's limits, broken
// syntax), the rule accepts exactly what PostgreSQL's jsonb accepts, so a
// write it lets through never fails in the caller's transaction and one it
// refuses would have. JSON null is the one exception, on purpose: jsonb
// stores it, the rule keeps it apart from a deletion.
func TestDocumentRuleIsPostgres(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	var accepted, refused atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		for range 40 {
			doc := jsonDoc().Draw(rt, "doc")
			if rapid.IntRange(0, 3).Draw(rt, "mutate") == 0 {
				doc = mutate(rt, doc)
			}
			ours := feed.ValidateDocument("doc", []byte(doc))
			var ok bool
			err := pool.QueryRow(ctx, `SELECT $1::text::jsonb IS NOT NULL`, doc).Scan(&ok)
			if ctx.Err() != nil {
				rt.Fatal(ctx.Err())
			}
			theirs := err == nil && ok
			if strings.TrimSpace(doc) == "null" {
				if ours == nil {
					rt.Fatalf("accepted JSON null")
				}
				continue
			}
			switch {
			case ours == nil && !theirs:
				rt.Fatalf("the rule accepts %q, PostgreSQL refuses it: %v", doc, err)
			case ours != nil && theirs:
				rt.Fatalf("the rule refuses %q (%v), PostgreSQL stores it", doc, ours)
			case ours == nil:
				accepted.Add(1)
			default:
				refused.Add(1)
			}
		}
	})
	// The draws must reach both sides of the rule often, or the agreement
	// above says little.
	if a, r := accepted.Load(), refused.Load(); a < 200 || r < 200 {
		t.Fatalf("only %d accepted and %d refused documents were compared; the generator misses a side", a, r)
	}
}

// jsonDoc draws a document, valid or nearly so, at most four levels deep.
func jsonDoc() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		var b strings.Builder
		value(t, &b, 0)
		if rapid.IntRange(0, 9).Draw(t, "trailing") == 0 {
			b.WriteString(rapid.SampledFrom([]string{" ", "\n", "\t\r", "\f", ",", " 1"}).Draw(t, "tail"))
		}
		return b.String()
	})
}

func space(t *rapid.T, b *strings.Builder) {
	b.WriteString(rapid.SampledFrom([]string{"", "", "", " ", "\n", "\t", "\r\n ", "\v"}).Draw(t, "ws"))
}

func value(t *rapid.T, b *strings.Builder, depth int) {
	space(t, b)
	kinds := 6
	if depth >= 4 {
		kinds = 4
	}
	switch rapid.IntRange(0, kinds-1).Draw(t, "kind") {
	case 0:
		str(t, b)
	case 1:
		num(t, b)
	case 2:
		b.WriteString(rapid.SampledFrom([]string{"true", "false", "null", "nul", "True"}).Draw(t, "literal"))
	case 3:
		num(t, b)
	case 4:
		b.WriteByte('[')
		for i := range rapid.IntRange(0, 3).Draw(t, "elements") {
			if i > 0 {
				b.WriteByte(',')
			}
			value(t, b, depth+1)
		}
		space(t, b)
		b.WriteByte(']')
	case 5:
		b.WriteByte('{')
		for i := range rapid.IntRange(0, 3).Draw(t, "members") {
			if i > 0 {
				b.WriteByte(',')
			}
			space(t, b)
			str(t, b)
			space(t, b)
			b.WriteByte(':')
			value(t, b, depth+1)
		}
		space(t, b)
		b.WriteByte('}')
	}
	space(t, b)
}

func str(t *rapid.T, b *strings.Builder) {
	b.WriteByte('"')
	for range rapid.IntRange(0, 6).Draw(t, "pieces") {
		b.WriteString(rapid.SampledFrom([]string{
			"abc", "plain text of some length", "é", "ключ", "😀", "\u007f", `\n`, `\"`, `\\`, `\/`, `\t`,
			`\u0041`, `\u00e9`, `\u0000`, `\u0001`, `\ud83d\ude00`, `\ud800`, `\udc00`, `\ud800\u0041`, `\uD83D\uDE00`,
			`\x41`, `\u12`, "\x01", "\n", "\xff", "\xe2\x82", "\xed\xa0\x80", "\x00",
		}).Draw(t, "piece"))
	}
	b.WriteByte('"')
}

func num(t *rapid.T, b *strings.Builder) {
	if rapid.Bool().Draw(t, "negative") {
		b.WriteByte('-')
	}
	b.WriteString(rapid.SampledFrom([]string{"0", "1", "10", "123", "0001", "9"}).Draw(t, "int"))
	if rapid.Bool().Draw(t, "has fraction") {
		b.WriteString(rapid.SampledFrom([]string{".", ".0", ".5", ".00005", ".10", ".000"}).Draw(t, "fraction"))
	}
	if rapid.Bool().Draw(t, "has exponent") {
		b.WriteString(rapid.SampledFrom([]string{"e", "E", "e+", "e-", "E-"}).Draw(t, "e"))
		edge := rapid.SampledFrom([]int64{0, 1, 5, 16381, 16382, 16383, 16384, 131068, 131070, 131071, 131072, 131073, 131075, 131076, 1073741822, 1073741823, 99999999999}).Draw(t, "edge")
		if rapid.IntRange(0, 5).Draw(t, "empty exponent") > 0 {
			b.WriteString(strconv.FormatInt(edge, 10))
		}
	}
}

// mutate breaks doc a little: a byte dropped, doubled or replaced, or the end
// cut off.
func mutate(t *rapid.T, doc string) string {
	if doc == "" {
		return doc
	}
	i := rapid.IntRange(0, len(doc)-1).Draw(t, "at")
	switch rapid.IntRange(0, 3).Draw(t, "how") {
	case 0:
		return doc[:i] + doc[i+1:]
	case 1:
		return doc[:i] + doc[i:i+1] + doc[i:]
	case 2:
		return doc[:i] + rapid.SampledFrom([]string{"{", "}", "]", ",", ":", "\"", "\\", "e", "-", "\x00"}).Draw(t, "byte") + doc[i+1:]
	default:
		return doc[:i]
	}
}
