package feed_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kairos-es/kairos/feed"
)

func TestDocumentsRefused(t *testing.T) {
	t.Parallel()
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		name, doc string
		// why is part of the error's text, found at offset at.
		why string
		at  int
	}{
		{"empty", ``, "is empty", 0},
		{"only whitespace", " \n\t", "is empty", 3},
		{"unfinished object", `{"a":`, "ends where a value should start", 5},
		{"two values", `{} {}`, "more follows", 3},
		{"JSON null", ` null `, "JSON null", 1},
		{"bare word", `nul`, "unknown word", 0},
		{"single quotes", `{'a':1}`, `''' where an object key`, 1},
		{"trailing comma in an array", `[1,]`, `']' where a value should start`, 3},
		{"trailing comma in an object", `{"a":1,}`, `'}' where an object key`, 7},
		{"missing colon", `{"a" 1}`, `'1' where ':' should follow`, 5},
		{"missing comma", `[1 2]`, `'2' where ',' or ']'`, 3},
		{"mismatched close", `[1}`, `'}' where ',' or ']'`, 2},
		{"unclosed string", `"abc`, "ends inside a string", 4},
		{"raw newline in a string", "\"a\nb\"", "control character", 2},
		{"raw NUL byte", "\"a\x00b\"", "control character", 2},
		{"raw NUL byte after eight plain ones", "\"abcdefgh\x00\"", "control character", 9},
		{"unknown escape", `"\x41"`, "unknown escape", 1},
		{"short \\u escape", `"\u12"`, "four hex digits", 1},
		{"NUL escape", `{"a":"x\u0000y"}`, `\u0000`, 7},
		{"NUL escape in a key", `{"\u0000":1}`, `\u0000`, 2},
		{"lone high surrogate", `"\ud800"`, "high surrogate", 1},
		{"high surrogate then a letter", `"\ud800\u0041"`, "high surrogate", 1},
		{"lone low surrogate", `"\udc00"`, "low surrogate", 1},
		{"invalid UTF-8 in a string", "\"a\xffb\"", "not valid UTF-8", 2},
		{"invalid UTF-8 after eight plain bytes", "\"abcdefgh\xff\"", "not valid UTF-8", 9},
		{"truncated UTF-8 in a string", "\"\xe2\x82\"", "not valid UTF-8", 1},
		{"UTF-8 of a surrogate", "\"\xed\xa0\x80\"", "not valid UTF-8", 1},
		{"invalid UTF-8 outside strings", "[\xff]", "not valid UTF-8", 1},
		{"leading zero", `01`, "more follows", 1},
		{"bare minus", `-`, "malformed number", 1},
		{"fraction without digits", `1.`, "malformed number", 2},
		{"exponent without digits", `1e+`, "malformed number", 3},
		{"plus sign", `+1`, `'+' where a value`, 0},
		{"exponent too large for numeric", `[1e1073741823]`, "numeric range", 1},
		{"exponent far too large", `1e99999999999999999999`, "numeric range", 0},
		{"too many digits before the point", `1e131072`, "numeric range", 0},
		{"too many digits before the point, counting the integer part", `10e131071`, "numeric range", 0},
		{"too many digits after the point", `1e-16384`, "numeric range", 0},
		{"too many digits after the point, of a zero", `0.0e-16383`, "numeric range", 0},
		{"too deep", deep(feed.MaxDocumentDepth + 1), "levels deep", feed.MaxDocumentDepth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := feed.ValidateDocument("doc", json.RawMessage(tc.doc))
			wantInvalid(t, err, "doc")
			if want := fmt.Sprintf("at offset %d", tc.at); !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %v, want %q %s", err, tc.why, want)
			}
		})
	}
	wantInvalid(t, feed.ValidateDocument("doc", nil), "doc")
}

func TestDocumentsAccepted(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{
		`{}`, `[]`, `1`, `-0`, `0.5`, `"s"`, `true`, `false`, `[null]`, `{"a":null}`, ` {"a" : [ 1 , 2 ] } `,
		`{"a":"\\u0000"}`, `{"a":"\u0001"}`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`, `"😀 ключ ✓"`, `"\"\\\/\b\f\n\r\t"`,
		`1e131071`, `0.5e131072`, `0.00005e131076`, `1e-16383`, `1.0e-16382`, `0e1073741822`, `-1.5E+3`, `[1e0000000000000000000005]`,
		strings.Repeat("[", feed.MaxDocumentDepth) + strings.Repeat("]", feed.MaxDocumentDepth),
		`{"pad":"` + strings.Repeat("0123456789abcdef", 100) + `"}`,
	} {
		if err := feed.ValidateDocument("doc", json.RawMessage(ok)); err != nil {
			t.Errorf("ValidateDocument(%.60s) = %v, want nil", ok, err)
		}
	}
}

// FuzzValidateDocument holds the document rule to encoding/json's grammar:
// whatever it accepts is JSON in valid UTF-8, and never JSON null; and JSON
// that none of the rule's PostgreSQL limits can touch (no \u escape, no
// exponent, too short for a number to leave numeric's range or to nest too
// deep) is accepted. pgfeed's tests hold the rest of the rule to PostgreSQL
// itself. The seeds run with every go test; go test -fuzz explores further.
func FuzzValidateDocument(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"a":[1,2,{"b":"c"}]}`, `"\ud83d\ude00"`, `"\ud800"`, `1e131072`, `[1,]`, ` null `, "\"\xff\"",
		`{"a":"x\u0000y"}`, `-0.0e-0`, `[[[[]]]]`, `{"k":"` + strings.Repeat("é", 40) + `"}`, `"abcdefgh\"ijklmnop"`,
		"\"abcdefg\x7fhijklmno\"", `{"a" : true , "b":false}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		err := feed.ValidateDocument("doc", doc)
		isJSON := json.Valid(doc) && utf8.Valid(doc)
		isNull := strings.TrimSpace(string(doc)) == "null"
		if err == nil && (!isJSON || isNull) {
			t.Fatalf("accepted %q, which is not JSON in UTF-8, or is null", doc)
		}
		if err != nil && !errors.Is(err, feed.ErrInvalid) {
			t.Fatalf("refused %q with %v, not an *InvalidError", doc, err)
		}
		untouched := !bytes.Contains(doc, []byte(`\u`)) && !bytes.ContainsAny(doc, "eE") && len(doc) < 16_000
		if err != nil && isJSON && !isNull && untouched {
			t.Fatalf("refused %q, which is JSON that no limit of the rule applies to: %v", doc, err)
		}
	})
}

// BenchmarkPrepareChanges checks and compacts the 1000 changes of about 300
// bytes that a write of the P1 benchmark carries: the writer's share of a
// feed write before anything reaches the database.
func BenchmarkPrepareChanges(b *testing.B) {
	changes := make([]feed.Change, 1000)
	size := 0
	for i := range changes {
		pad := strings.Repeat(fmt.Sprintf("%08x", i*2654435761), 32)[:256]
		doc := json.RawMessage(fmt.Sprintf(`{"id": %d, "name": "item-%d", "pad": "%s"}`, i, i, pad))
		size += len(doc)
		changes[i] = feed.Put(feed.Key(fmt.Sprintf("t00001-%05d", i)), doc)
	}
	b.SetBytes(int64(size))
	for b.Loop() {
		if _, err := feed.PrepareChanges(changes); err != nil {
			b.Fatal(err)
		}
	}
}
