package feed

import (
	"encoding/binary"
	"encoding/json"
	"unicode/utf8"

	"github.com/kairos-es/kairos/internal/jsonb"
)

// The document rule, checked by ValidateDocument, which is its one home. The
// limits below are PostgreSQL's, whose jsonb is the strictest store a document
// goes through: a document it would refuse is refused here first, while the
// writer's transaction can still go on.
const (
	// MaxDocumentDepth is how deeply arrays and objects may nest in a
	// document: encoding/json's own limit, which PostgreSQL's default stack
	// (max_stack_depth 2MB) parses with room to spare.
	MaxDocumentDepth = 10_000
	// A number must fit PostgreSQL's numeric once its exponent is applied:
	// its leading digit at most maxNumberPower places before the decimal
	// point, at most maxNumberScale digits after it, and an exponent under
	// maxNumberExponent either way.
	maxNumberPower    = 4*32768 - 1 // a weight of 32767 base-10000 digits
	maxNumberScale    = 16383
	maxNumberExponent = 1<<30 - 1 // INT_MAX/2, where numeric stops reading one

	// MaxDocumentJSONBSize is the most bytes a document may take once
	// PostgreSQL lays it out as jsonb (2^28 − 1: a length in jsonb's binary
	// form has 28 bits). It bounds the whole document, and so each string in
	// it, escapes decoded.
	MaxDocumentJSONBSize = jsonb.MaxSize
	// MaxDocumentArrayLen is the most elements one array may hold, and
	// MaxDocumentObjectLen the most members one object may hold, repeated
	// keys counted: past them PostgreSQL's jsonb parser needs an allocation
	// over its 1 GiB limit.
	MaxDocumentArrayLen  = jsonb.MaxElems
	MaxDocumentObjectLen = jsonb.MaxPairs
	// sizeCheckFrom is the length from which a document could reach a
	// jsonb size limit: jsonb takes at most 16 bytes per byte of text plus 4
	// (a one-digit number, the worst, takes 15 with its entry and padding;
	// an array or object at most 11 for its two brackets), and an array
	// needs 2 bytes of text per element, an object 5 per member. A shorter
	// document is never laid out, so the limits cost the write path nothing.
	sizeCheckFrom = 1 << 24
)

// ValidateDocument checks the document rule: a document is one JSON value
// (RFC 8259) in valid UTF-8, other than null (a deletion is made by Delete,
// never by JSON null, so the two cannot be confused), that PostgreSQL's jsonb
// can store:
//
//   - no \u0000 escape in any string, and a \u escape of a UTF-16
//     surrogate only as half of a pair;
//   - every number within numeric's range (at most 131072 digits before the
//     decimal point and 16383 after it, with the exponent applied);
//   - at most MaxDocumentDepth levels of nesting;
//   - at most MaxDocumentJSONBSize bytes as jsonb lays it out, so no string
//     longer than that either (a top-level string of up to 2^28 − 9 bytes
//     fits, jsonb storing it in an array of one), at most
//     MaxDocumentArrayLen elements in an array and MaxDocumentObjectLen
//     members in an object. The layout is jsonb's own (internal/jsonb has
//     it), so these limits hold to the byte.
//
// A document that breaks it would otherwise fail the writer's statement and
// abort the caller's transaction, or read back differently from one store to
// another. field names the input in the error, which gives the first fault
// and its byte offset.
//
// It reads the document once, byte by byte, with no allocation for any
// document up to 32 levels deep: a writer checks every document it writes,
// so this check is on the write path's clock. Only a document of 16 MiB or
// more, the least that could reach a jsonb size limit, is read a second time
// to lay it out.
func ValidateDocument(field string, doc json.RawMessage) error {
	if doc == nil {
		return Invalid(field, "is nil; use feed.Delete to delete a key")
	}
	if reason, at := checkDocument(doc); reason != "" {
		return documentInvalid(field, reason, at)
	}
	return nil
}

// documentInvalid is the error of a document that breaks the rule.
func documentInvalid(field, reason string, at int) error {
	return Invalid(field, "%s at offset %d", reason, at)
}

// plain marks the bytes a string may hold as they are: printable ASCII other
// than the quote and the backslash. Every other byte in a string is an end,
// an escape, a control character (refused) or the start of a multi-byte
// UTF-8 sequence (decoded).
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// checkDocument returns why doc breaks the document rule and where, or ""
// and -1. It parses without recursion: open arrays and objects are a stack
// of their opening bytes.
func checkDocument(b []byte) (reason string, at int) {
	var small [32]byte
	open := small[:0]
	i := skipSpace(b, 0)
	topNull := false
	for {
		// A value starts at i.
		if i >= len(b) {
			if len(open) == 0 {
				return "is empty: a document is one JSON value", i
			}
			return "is not valid JSON: it ends where a value should start", i
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(open) == MaxDocumentDepth {
				return "nests arrays and objects more than 10000 levels deep", i
			}
			open = append(open, c)
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '{'+2 is '}', '['+2 is ']'
				open = open[:len(open)-1]
				i++
				break
			}
			if c == '{' {
				if i, reason = member(b, i); reason != "" {
					return reason, i
				}
			}
			continue
		case c == '"':
			if i, reason = str(b, i); reason != "" {
				return reason, i
			}
		case c == '-' || c >= '0' && c <= '9':
			if i, reason = number(b, i); reason != "" {
				return reason, i
			}
		case c == 't' || c == 'f' || c == 'n':
			lit := "true"
			switch c {
			case 'f':
				lit = "false"
			case 'n':
				lit = "null"
			}
			if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
				return "is not valid JSON: an unknown word", i
			}
			topNull = len(open) == 0 && c == 'n'
			i += len(lit)
		default:
			return unexpected(b, i, "where a value should start")
		}
		// A value ended at i: what follows closes containers, or separates
		// the next member or element.
		for {
			i = skipSpace(b, i)
			if len(open) == 0 {
				if i != len(b) {
					return "is not valid JSON: more follows the document's value", i
				}
				if topNull {
					return "is JSON null; delete the key instead", skipSpace(b, 0)
				}
				if len(b) >= sizeCheckFrom {
					return jsonb.Check(b, jsonb.Postgres)
				}
				return "", -1
			}
			if i >= len(b) {
				return "is not valid JSON: it ends inside an array or object", i
			}
			top := open[len(open)-1]
			if b[i] == top+2 {
				open = open[:len(open)-1]
				i++
				continue
			}
			if b[i] != ',' {
				if top == '{' {
					return unexpected(b, i, "where ',' or '}' should follow a member")
				}
				return unexpected(b, i, "where ',' or ']' should follow an element")
			}
			i = skipSpace(b, i+1)
			if top == '{' {
				if i, reason = member(b, i); reason != "" {
					return reason, i
				}
			}
			break
		}
	}
}

// member reads an object member's key and colon at i, returning where its
// value starts.
func member(b []byte, i int) (int, string) {
	if i >= len(b) {
		return i, "is not valid JSON: it ends where an object key should be"
	}
	if b[i] != '"' {
		r, _ := unexpected(b, i, "where an object key (a string) should be")
		return i, r
	}
	i, reason := str(b, i)
	if reason != "" {
		return i, reason
	}
	i = skipSpace(b, i)
	if i >= len(b) {
		return i, "is not valid JSON: it ends where ':' should follow an object key"
	}
	if b[i] != ':' {
		r, _ := unexpected(b, i, "where ':' should follow an object key")
		return i, r
	}
	return skipSpace(b, i+1), ""
}

// unexpected says what is wrong with the byte at i, which the grammar does
// not allow there.
func unexpected(b []byte, i int, where string) (string, int) {
	c := b[i]
	switch {
	case c >= 0x20 && c < 0x7f:
		return "is not valid JSON: '" + string(rune(c)) + "' " + where, i
	case c >= 0x80:
		if r, size := utf8.DecodeRune(b[i:]); r == utf8.RuneError && size <= 1 {
			return "is not valid UTF-8", i
		}
	}
	return "is not valid JSON: an unexpected character " + where, i
}

// skipSpace returns the offset of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// str reads the string that starts with the quote at i, returning the offset
// after its closing quote, or where and why it breaks the rule.
func str(b []byte, i int) (int, string) {
	i++
	for {
		i = skipPlain(b, i)
		if i >= len(b) {
			return i, "is not valid JSON: it ends inside a string"
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, ""
		case c == '\\':
			if i+1 >= len(b) {
				return i, "is not valid JSON: it ends inside an escape"
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				r, ok := hex4(b, i+2)
				switch {
				case !ok:
					return i, "is not valid JSON: a \\u escape needs four hex digits"
				case r == 0:
					return i, "has a \\u0000 escape, which PostgreSQL's jsonb cannot store,"
				case r >= 0xdc00 && r < 0xe000:
					return i, "has a \\u escape of a low surrogate with no high one before it, which PostgreSQL's jsonb refuses,"
				case r >= 0xd800 && r < 0xdc00:
					low, ok := rune(0), i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u'
					if ok {
						low, ok = hex4(b, i+8)
					}
					if !ok || low < 0xdc00 || low >= 0xe000 {
						return i, "has a \\u escape of a high surrogate with no low one after it, which PostgreSQL's jsonb refuses,"
					}
					i += 12
				default:
					i += 6
				}
			default:
				return i, "is not valid JSON: an unknown escape in a string"
			}
		case c < 0x20:
			return i, "is not valid JSON: a control character in a string must be escaped"
		default: // the start of a multi-byte UTF-8 sequence
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size <= 1 {
				return i, "is not valid UTF-8"
			}
			i += size
		}
	}
}

// skipPlain returns the offset of the first byte at or after i that a
// string may not hold as it is (see plain). Documents are mostly string
// bytes, so it tests eight at a time: a word of them is all plain when no
// byte has its high bit set, none is below 0x20, and none equals '"' or '\'
// (the usual tests for a byte below n, and for a zero byte after an XOR).
func skipPlain(b []byte, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for ; i+8 <= len(b); i += 8 {
		v := binary.LittleEndian.Uint64(b[i:])
		q, bs := v^(ones*'"'), v^(ones*'\\')
		if (v|(v-ones*0x20)|((q-ones)&^q)|((bs-ones)&^bs))&highs != 0 {
			break
		}
	}
	for i < len(b) && plain[b[i]] {
		i++
	}
	return i
}

// hex4 reads the four hex digits at i.
func hex4(b []byte, i int) (rune, bool) {
	if len(b)-i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number reads the number that starts at i, returning the offset after it,
// or where and why it breaks the rule. Besides the grammar it works out where
// the number's leading significant digit lies and how many digits it has
// after the decimal point once the exponent is applied, which is what
// PostgreSQL's numeric limits.
func number(b []byte, start int) (int, string) {
	i := start
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	const malformed = "is not valid JSON: a malformed number"
	if i >= len(b) || b[i] < '0' || b[i] > '9' {
		return i, malformed
	}
	// lead is the power of ten of the leading significant digit, before the
	// exponent; zero says the number has none (it is a zero).
	var lead int64
	zero := b[i] == '0'
	intDigits := 1
	if zero {
		i++
	} else {
		intDigits = digits()
		lead = int64(intDigits - 1)
	}
	fracDigits := 0
	if i < len(b) && b[i] == '.' {
		i++
		fracStart := i
		if fracDigits = digits(); fracDigits == 0 {
			return i, malformed
		}
		if zero {
			for j := fracStart; j < i; j++ {
				if b[j] != '0' {
					zero, lead = false, -int64(j-fracStart+1)
					break
				}
			}
		}
	}
	var exp int64
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		neg := false
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			neg = b[i] == '-'
			i++
		}
		expStart := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			if exp <= maxNumberExponent {
				exp = exp*10 + int64(b[i]-'0')
			}
			i++
		}
		if i == expStart {
			return i, malformed
		}
		if neg {
			exp = -exp
		}
	}
	const outOfRange = "has a number outside PostgreSQL's numeric range (at most 131072 digits before the decimal point and 16383 after it)"
	switch {
	case exp >= maxNumberExponent || exp <= -maxNumberExponent:
		return start, outOfRange
	case int64(fracDigits)-exp > maxNumberScale:
		return start, outOfRange
	case !zero && lead+exp > maxNumberPower:
		return start, outOfRange
	}
	return i, ""
}
