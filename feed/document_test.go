package feed_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/jsonb"
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

// FuzzValidateDocument holds the document rule to an independent reading of
// it: encoding/json's grammar, UTF-8, not null, and pgRefuses for the limits
// PostgreSQL's jsonb adds (none of the size limits can apply at the sizes a
// fuzzer reaches); ValidateDocument accepts exactly what that allows, and
// refuses the rest with an *InvalidError naming the field. An accepted
// document also survives a round trip through encoding/json (decoded, with
// numbers kept as written, and encoded again): the result is accepted, decodes
// to the same value and takes the same bytes as jsonb, since jsonb keeps
// neither whitespace, escapes nor key order. pgfeed's tests hold the rule to
// PostgreSQL itself. The seeds run with every go test; go test -fuzz explores
// further.
func FuzzValidateDocument(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"a":[1,2,{"b":"c"}]}`, `"\ud83d\ude00"`, `"\ud800"`, `1e131072`, `[1,]`, ` null `, "\"\xff\"",
		`{"a":"x\u0000y"}`, `-0.0e-0`, `[[[[]]]]`, `{"k":"` + strings.Repeat("é", 40) + `"}`, `"abcdefgh\"ijklmnop"`,
		"\"abcdefg\x7fhijklmno\"", `{"a" : true , "b":false}`,
		`"\udc00"`, `"\ud800\ud800\udc00"`, `"\ud800x"`, `"\\u0000"`, `{"a":1,"a":"x"}`, `{"b":"x","a":0}`,
		`0.0e-16383`, `1e-16384`, `0e1073741822`, `0e1073741823`, `[1e131071, 10e131071]`, `"\u2028<&>"`, `null`, `[null]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		err := feed.ValidateDocument("doc", doc)
		isJSON := json.Valid(doc) && utf8.Valid(doc)
		isNull := strings.TrimSpace(string(doc)) == "null"
		if want := isJSON && !isNull && !pgRefuses(doc); (err == nil) != want {
			t.Fatalf("ValidateDocument(%q) = %v; the rule says valid = %v", doc, err, want)
		}
		if err != nil {
			wantInvalid(t, err, "doc")
			return
		}
		v, err := decodeNumbers(doc)
		if err != nil {
			t.Fatalf("accepted %q, which encoding/json cannot decode: %v", doc, err)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("accepted %q, which encoding/json cannot encode again: %v", doc, err)
		}
		if err := feed.ValidateDocument("doc", again); err != nil {
			t.Fatalf("accepted %q but not its re-encoding %q: %v", doc, again, err)
		}
		if w, err := decodeNumbers(again); err != nil || !reflect.DeepEqual(v, w) {
			t.Fatalf("%q re-encodes to %q, which decodes differently", doc, again)
		}
		if a, b := jsonb.Size(doc), jsonb.Size(again); a != b {
			t.Fatalf("%q takes %d bytes as jsonb, its re-encoding %q %d", doc, a, again, b)
		}
	})
}

// decodeNumbers decodes doc with every number kept as written.
func decodeNumbers(doc []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// pgRefuses reports whether doc, valid JSON, breaks one of the limits the
// document rule takes from PostgreSQL (see ValidateDocument): a \u0000
// escape, a \u escape of a surrogate that is not half of a pair, or a number
// outside numeric's range. It is written apart from the rule's checker, as
// slowly and plainly as it can be, so that the fuzzer can hold one to the
// other.
func pgRefuses(doc []byte) bool {
	inString, high := false, false // high: the last escape was a high surrogate
	for i := 0; i < len(doc); i++ {
		c := doc[i]
		switch {
		case !inString:
			inString = c == '"'
			continue
		case c == '"':
			inString = false
		case c == '\\' && doc[i+1] == 'u':
			u, _ := strconv.ParseUint(string(doc[i+2:i+6]), 16, 16)
			i += 5
			switch {
			case u == 0:
				return true
			case u >= 0xd800 && u < 0xdc00:
				if high {
					return true
				}
				high = true
				continue
			case u >= 0xdc00 && u < 0xe000:
				if !high {
					return true
				}
				high = false
				continue
			}
		case c == '\\':
			i++
		}
		if high {
			return true
		}
	}
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		if n, ok := tok.(json.Number); ok && !inNumericRange(string(n)) {
			return true
		}
	}
}

// inNumericRange: with its exponent applied, n's leading significant digit
// is at most 131071 places before the decimal point and n has at most 16383
// digits after it, and its exponent is under 2^30 - 1 either way (where
// PostgreSQL stops reading one).
func inNumericRange(n string) bool {
	n = strings.TrimPrefix(n, "-")
	mant, expText, _ := strings.Cut(strings.ToLower(n), "e")
	exp := new(big.Int)
	if expText != "" {
		exp.SetString(strings.TrimPrefix(expText, "+"), 10)
	}
	if limit := big.NewInt(1<<30 - 1); new(big.Int).Abs(exp).Cmp(limit) >= 0 {
		return false
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	scale := new(big.Int).Sub(big.NewInt(int64(len(frac))), exp)
	if scale.Cmp(big.NewInt(16383)) > 0 {
		return false
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return true // a zero: no leading digit
	}
	lead := big.NewInt(int64(len(intPart) - 1 - (len(intPart+frac) - len(digits))))
	return lead.Add(lead, exp).Cmp(big.NewInt(131071)) <= 0
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
