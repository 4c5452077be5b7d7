package pgfeed_test

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"pgregory.net/rapid"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/jsonb"
	"github.com/kairos-es/kairos/internal/pgtest"
)

// TestDocumentRuleIsPostgres holds feed.ValidateDocument to the server it
// protects: for documents drawn near every edge of the rule (escapes,
// surrogates, UTF-8, control bytes, numbers at numeric's limits, broken
// syntax), the rule accepts exactly what PostgreSQL's jsonb accepts, so a
// write it lets through never fails in the caller's transaction and one it
// refuses would have. JSON null is the one exception, on purpose: jsonb
// stores it, the rule keeps it apart from a deletion. On every document
// both accept, the rule's jsonb layout, which its size limits are measured
// on, must also come to the byte count PostgreSQL reports; the limits
// themselves are held to the server by TestDocumentSizeLimitsArePostgres.
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
			var size int
			err := pool.QueryRow(ctx, `SELECT pg_column_size($1::text::jsonb)`, doc).Scan(&size)
			if ctx.Err() != nil {
				rt.Fatal(ctx.Err())
			}
			theirs := err == nil
			// The rule's size limits see the document as jsonb lays it out
			// (keys sorted and deduplicated, numbers as numeric, padding):
			// on every document both accept, the layout must match
			// PostgreSQL's to the byte, or the limits would be off at
			// their edge. pg_column_size counts the 4-byte varlena header.
			if ours == nil && theirs {
				if got := jsonb.Size([]byte(doc)) + 4; got != size {
					rt.Fatalf("the rule lays %q out in %d bytes of jsonb, PostgreSQL in %d", doc, got, size)
				}
			}
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
			if rapid.Bool().Draw(t, "common key") {
				// Keys that repeat, compare by length before bytes, and
				// one spelled with an escape: jsonb's key order and
				// deduplication decide the layout.
				b.WriteString(rapid.SampledFrom([]string{`""`, `"a"`, `"b"`, `"\u0062"`, `"ab"`, `"ba"`}).Draw(t, "key"))
			} else {
				str(t, b)
			}
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
	b.WriteString(rapid.SampledFrom([]string{"0", "1", "10", "123", "0001", "9", "12345", "100000000", "123456789"}).Draw(t, "int"))
	if rapid.Bool().Draw(t, "has fraction") {
		// Up to 63 digits after the point numeric keeps a short header.
		b.WriteString(rapid.SampledFrom([]string{".", ".0", ".5", ".00005", ".10", ".000", ".12345",
			"." + strings.Repeat("0", 62) + "1", "." + strings.Repeat("0", 63) + "1", "." + strings.Repeat("0", 63)}).Draw(t, "fraction"))
	}
	if rapid.Bool().Draw(t, "has exponent") {
		b.WriteString(rapid.SampledFrom([]string{"e", "E", "e+", "e-", "E-"}).Draw(t, "e"))
		// Around 256 the leading base-10000 digit's weight leaves -64..63,
		// around 63 the scale leaves a short header's range.
		edge := rapid.SampledFrom([]int64{0, 1, 5, 62, 63, 64, 251, 252, 255, 256, 257, 260, 16381, 16382, 16383, 16384, 131068, 131070, 131071, 131072, 131073, 131075, 131076, 1073741822, 1073741823, 99999999999}).Draw(t, "edge")
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

// TestDocumentSizeLimitsArePostgres holds the rule's jsonb size limits to
// the server at their edges: the largest document of each shape the rule
// accepts PostgreSQL stores, and one byte or element more it refuses with
// 54000 (program_limit_exceeded), as the rule does. The server builds its
// documents itself (repeat, to_jsonb), which keeps the client's memory to
// one buffer of the largest document and the server's near three times it;
// to_jsonb and jsonb_build_object reach the very size checks that parsing
// text does. Members per object are left to internal/jsonb's tests: reaching
// PostgreSQL's limit there takes it over a gigabyte. Layout probes first:
// cheap documents whose size depends on jsonb's key order and padding.
func TestDocumentSizeLimitsArePostgres(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	for _, doc := range []string{
		`{"b":"x","a":0}`, `{"a":"x","b":0}`, `{"ba":1,"ab":"xyz"}`, `{"ab":1,"ba":"xyz"}`, `{"bb":0,"a":"xyz"}`,
		`{"\u0062":[1],"a":"xy","b":{"c":"z"}}`, `[1,"x",2.5,"yz",[3]]`, `{"a":1,"a":"x"}`,
	} {
		var size int
		if err := pool.QueryRow(ctx, `SELECT pg_column_size($1::text::jsonb)`, doc).Scan(&size); err != nil {
			t.Fatal(err)
		}
		if got := jsonb.Size([]byte(doc)) + 4; got != size {
			t.Errorf("the rule lays %s out in %d bytes of jsonb, PostgreSQL in %d", doc, got, size)
		}
	}
	if testing.Short() {
		t.Skip("the limits themselves take documents of up to 256 MiB")
	}
	const max = feed.MaxDocumentJSONBSize
	// Under the race detector the rule's side of the 256 MiB documents would
	// take half a minute and a gigabyte, so only the server's side runs
	// there (the rule's side runs without it): that the rule lays these
	// shapes out as the server does, and compares sizes with the limit as
	// it should, its layout probes and internal/jsonb's tests hold.
	var buf []byte
	if !raceEnabled {
		buf = bytes.Repeat([]byte("x"), max+2)
	}
	// doc frames n bytes of x in buf between head and tail, and returns a
	// function that puts the x back.
	doc := func(head string, n int, tail string) ([]byte, func()) {
		copy(buf, head)
		copy(buf[len(head)+n:], tail)
		d := buf[:len(head)+n+len(tail)]
		return d, func() {
			for i := range head {
				buf[i] = 'x'
			}
			for i := range tail {
				buf[len(head)+n+i] = 'x'
			}
		}
	}
	for _, c := range []struct {
		name       string
		head, tail string
		n          int    // the largest the rule and PostgreSQL accept
		sql        string // builds the document from $1 bytes of x
	}{
		// An array of one: header, entry and the string.
		{"top-level string", `"`, `"`, max - 8, `SELECT pg_column_size(to_jsonb(repeat('x', $1::int)))`},
		// A header, an entry each for the key and the value, the key.
		{"string member", `{"k":"`, `"}`, max - 13, `SELECT pg_column_size(jsonb_build_object('k', repeat('x', $1::int)))`},
	} {
		for _, n := range []int{c.n, c.n + 1} {
			var ours error
			if buf != nil {
				d, undo := doc(c.head, n, c.tail)
				ours = feed.ValidateDocument("doc", d)
				undo()
			} else if n > c.n {
				ours = errors.New("not checked under the race detector")
			}
			var size int
			err := pool.QueryRow(ctx, c.sql, n).Scan(&size)
			var pgErr *pgconn.PgError
			switch {
			case n == c.n && (ours != nil || err != nil):
				t.Errorf("%s of %d bytes: the rule says %v, PostgreSQL %v; both must store it", c.name, n, ours, err)
			case n == c.n && size != max+4:
				t.Errorf("%s of %d bytes: PostgreSQL stores %d bytes, want the limit, %d", c.name, n, size, max+4)
			case n > c.n && (ours == nil || !errors.As(err, &pgErr) || pgErr.Code != "54000"):
				t.Errorf("%s of %d bytes: the rule says %v, PostgreSQL %v; both must refuse it, PostgreSQL with 54000", c.name, n, ours, err)
			}
		}
	}
	// Elements: zeros here, the shortest text; nulls for the server, the
	// cheapest to hold while parsing.
	for _, n := range []int{feed.MaxDocumentArrayLen, feed.MaxDocumentArrayLen + 1} {
		var ours error
		if !raceEnabled || n > feed.MaxDocumentArrayLen {
			// Under the race detector, the refused one only: the pass
			// over 32 MiB takes it five seconds.
			ours = feed.ValidateDocument("doc", []byte("["+strings.Repeat("0,", n-1)+"0]"))
		}
		var size int
		err := pool.QueryRow(ctx, `SELECT pg_column_size(('[' || repeat('null,', $1::int - 1) || 'null]')::jsonb)`, n).Scan(&size)
		var pgErr *pgconn.PgError
		switch {
		case n == feed.MaxDocumentArrayLen && (ours != nil || err != nil):
			t.Errorf("an array of %d elements: the rule says %v, PostgreSQL %v; both must store it", n, ours, err)
		case n > feed.MaxDocumentArrayLen && (ours == nil || !errors.As(err, &pgErr)):
			t.Errorf("an array of %d elements: the rule says %v, PostgreSQL %v; both must refuse it", n, ours, err)
		}
	}
}
