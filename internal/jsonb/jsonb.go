// Package jsonb lays a JSON document out as PostgreSQL's jsonb would, to find
// what jsonb's size limits make of it. It is the second half of package
// feed's document rule (feed.ValidateDocument states the rule, once): the
// first half has already checked the document's grammar and escapes, so this
// one reads a document it may take to be valid JSON.
//
// The layout and the limits are PostgreSQL's own (src/include/utils/jsonb.h
// and src/backend/utils/adt/jsonb_util.c):
//
//   - An array is a 4-byte header, a 4-byte entry per element, then the
//     elements' data in order; an object is a header, an entry per key and
//     per value, the keys' data, then the values' data, with repeated keys
//     dropped (the last one given stays) and keys sorted by length, then
//     bytes. A top-level scalar is stored as an array of one element.
//   - A string's data is its bytes, escapes decoded; true, false and null
//     have none; a number's is its numeric value, 6 or 8 bytes of header
//     and 2 per base-10000 digit; numbers, arrays and objects start at a
//     multiple of 4 bytes, padded.
//   - An entry keeps a length in 28 bits, so a string, and every array or
//     object with its padding, header and entries, must fit in MaxSize
//     bytes; the document's outermost container is the largest of them.
//   - While it parses, PostgreSQL grows an array's elements (32 bytes each)
//     and an object's pairs (72 bytes) by doubling, and an allocation may not
//     reach 1 GiB: so at most MaxElems elements in an array and MaxPairs
//     members in an object, repeated keys counted.
package jsonb

import (
	"bytes"
	"fmt"
	"slices"
	"unicode/utf8"
)

// PostgreSQL's limits; see the package doc.
const (
	MaxSize  = 1<<28 - 1 // JENTRY_OFFLENMASK
	MaxElems = 1 << 24
	MaxPairs = 1 << 23
)

// Limits are the limits Check applies: PostgreSQL's (Postgres), or smaller
// ones in tests.
type Limits struct {
	Size, Elems, Pairs int
}

// Postgres are PostgreSQL's limits.
var Postgres = Limits{Size: MaxSize, Elems: MaxElems, Pairs: MaxPairs}

// Check returns why doc, valid JSON, breaks one of lim, and where, or "" and
// -1.
func Check(doc []byte, lim Limits) (reason string, at int) {
	size, reason, at := measure(doc, lim)
	if reason != "" {
		return reason, at
	}
	if size > lim.Size {
		return fmt.Sprintf("takes %d bytes as PostgreSQL's jsonb, more than the %d it can store", size, lim.Size), 0
	}
	return "", -1
}

// Size returns the bytes doc, valid JSON, takes as jsonb (what
// pg_column_size reports, less the 4-byte varlena header), whatever its size.
func Size(doc []byte) int {
	size, _, _ := measure(doc, Limits{Size: -1, Elems: -1, Pairs: -1})
	return size
}

// measure lays doc out. A negative limit is not checked.
func measure(doc []byte, lim Limits) (size int, reason string, at int) {
	m := measurer{b: doc, lim: lim, at: -1}
	i := skipSpace(doc, 0)
	_, size, _ = m.value(i)
	if m.reason != "" {
		return 0, m.reason, m.at
	}
	if doc[i] != '[' && doc[i] != '{' {
		// A scalar is an array of one: header, entry, then the value,
		// which starts aligned there.
		size += 8
	}
	return size, "", -1
}

type measurer struct {
	b      []byte
	lim    Limits
	reason string
	at     int
	key    []byte // scratch for keys with escapes
}

func (m *measurer) fail(at int, format string, args ...any) {
	if m.reason == "" {
		m.reason, m.at = fmt.Sprintf(format, args...), at
	}
}

// value measures the value at i (no leading space), returning the offset
// after it, the bytes of its data and whether that data starts padded to 4.
func (m *measurer) value(i int) (next, size int, aligned bool) {
	switch c := m.b[i]; {
	case c == '[':
		next, size = m.array(i)
		return next, size, true
	case c == '{':
		next, size = m.object(i)
		return next, size, true
	case c == '"':
		next, size, _ = m.str(i, false)
		return next, size, false
	case c == 't' || c == 'n':
		return i + 4, 0, false
	case c == 'f':
		return i + 5, 0, false
	default:
		next, size = number(m.b, i)
		return next, size, true
	}
}

func align(n int) int { return (n + 3) &^ 3 }

func (m *measurer) array(start int) (next, size int) {
	i := skipSpace(m.b, start+1)
	n, data := 0, 0
	if m.b[i] == ']' {
		return i + 1, 4
	}
	for {
		if n++; n > m.lim.Elems && m.lim.Elems >= 0 {
			m.fail(start, "has an array of more than %d elements, more than PostgreSQL's jsonb can parse", m.lim.Elems)
			return len(m.b), 0
		}
		var sz int
		var al bool
		i, sz, al = m.value(i)
		if m.reason != "" {
			return len(m.b), 0
		}
		if al {
			data = align(data)
		}
		data += sz
		i = skipSpace(m.b, i)
		if m.b[i] == ']' {
			return i + 1, 4 + 4*n + data
		}
		i = skipSpace(m.b, i+1) // past ','
	}
}

// member is an object member as the layout needs it: its key's bytes
// (escapes decoded) and its value's size and alignment.
type member struct {
	key     []byte
	size    int
	aligned bool
}

func (m *measurer) object(start int) (next, size int) {
	i := skipSpace(m.b, start+1)
	if m.b[i] == '}' {
		return i + 1, 4
	}
	var members []member
	for {
		if len(members) == m.lim.Pairs && m.lim.Pairs >= 0 {
			m.fail(start, "has an object of more than %d members (repeated keys counted), more than PostgreSQL's jsonb can parse", m.lim.Pairs)
			return len(m.b), 0
		}
		var key []byte
		i, _, key = m.str(i, true)
		i = skipSpace(m.b, i)
		i = skipSpace(m.b, i+1) // past ':'
		var sz int
		var al bool
		i, sz, al = m.value(i)
		if m.reason != "" {
			return len(m.b), 0
		}
		members = append(members, member{key: key, size: sz, aligned: al})
		i = skipSpace(m.b, i)
		if m.b[i] == '}' {
			next = i + 1
			break
		}
		i = skipSpace(m.b, i+1) // past ','
	}
	// Sorted by length, then bytes; of equal keys the last given stays,
	// which a stable sort leaves last in its run.
	slices.SortStableFunc(members, func(a, b member) int {
		if len(a.key) != len(b.key) {
			return len(a.key) - len(b.key)
		}
		return bytes.Compare(a.key, b.key)
	})
	n, data := 0, 0
	for j, mb := range members {
		if j+1 < len(members) && bytes.Equal(mb.key, members[j+1].key) {
			members[j].size = -1 // dropped: a later one of this key stays
			continue
		}
		n++
		data += len(mb.key)
	}
	for _, mb := range members {
		if mb.size < 0 {
			continue
		}
		if mb.aligned {
			data = align(data)
		}
		data += mb.size
	}
	return next, 4 + 8*n + data
}

// str measures the string whose quote is at i: the offset after it and its
// decoded length; with wantKey, also its decoded bytes (cut out of the
// document when it has no escape).
func (m *measurer) str(i int, wantKey bool) (next, size int, key []byte) {
	start := i
	i++
	escaped := false
	q := -1 // the next quote at or after i, escaped or not
	for {
		// Plain bytes up to the next quote or backslash, found by the
		// library's fast scans (a document this pass reads is large), each
		// byte scanned once: q is kept until an escape takes i past it.
		if q < i {
			q = i + bytes.IndexByte(m.b[i:], '"')
		}
		end := q
		if bs := bytes.IndexByte(m.b[i:q], '\\'); bs >= 0 {
			end = i + bs
		}
		size += end - i
		i = end
		if i == q {
			break
		}
		escaped = true
		if m.b[i+1] != 'u' {
			i += 2
			size++
			continue
		}
		r := hex4(m.b[i+2:])
		if r >= 0xd800 && r < 0xdc00 { // a pair, as the first half checked
			i += 12
			size += 4
			continue
		}
		i += 6
		size += utf8.RuneLen(r)
	}
	next = i + 1
	if size > m.lim.Size && m.lim.Size >= 0 {
		m.fail(start, "has a string of %d bytes, more than the %d PostgreSQL's jsonb can store", size, m.lim.Size)
	}
	if !wantKey {
		return next, size, nil
	}
	if !escaped {
		return next, size, m.b[start+1 : i]
	}
	return next, size, decode(m.b[start+1 : i])
}

// decode decodes the escapes of a string's inside.
func decode(s []byte) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			out = append(out, s[i])
			i++
			continue
		}
		switch s[i+1] {
		case 'u':
			r := hex4(s[i+2:])
			i += 6
			if r >= 0xd800 && r < 0xdc00 {
				r = 0x10000 + (r-0xd800)<<10 + (hex4(s[i+2:]) - 0xdc00)
				i += 6
			}
			out = utf8.AppendRune(out, r)
			continue
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default: // '"', '\\', '/'
			out = append(out, s[i+1])
		}
		i += 2
	}
	return out
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// number measures the number at i: the offset after it and the size of
// PostgreSQL's numeric for it. numeric keeps base-10000 digits from the
// group of the leading significant decimal digit to that of the last one,
// the groups aligned on the decimal point, with a 2-byte header when its
// display scale (digits after the point, exponent applied) is at most 63 and
// its weight (the leading group's power of 10000) is within -64..63, and a
// 4-byte one otherwise, after the 4-byte varlena header.
func number(b []byte, i int) (next, size int) {
	if b[i] == '-' {
		i++
	}
	intStart := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(b) && b[i] == '.' {
		i++
		fracStart = i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		fracEnd = i
	}
	exp := 0
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		neg := false
		if b[i] == '+' || b[i] == '-' {
			neg = b[i] == '-'
			i++
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			if exp < 1<<30 { // the first half keeps exponents far below this
				exp = exp*10 + int(b[i]-'0')
			}
			i++
		}
		if neg {
			exp = -exp
		}
	}
	next = i
	// The powers of ten of the first and last significant digits.
	hi, lo, zero := 0, 0, true
	power := func(j int) int { // of the digit at offset j
		if j < intEnd {
			return intEnd - 1 - j
		}
		return -(j - fracStart + 1)
	}
	for _, r := range [][2]int{{intStart, intEnd}, {fracStart, fracEnd}} {
		for j := r[0]; j < r[1]; j++ {
			if b[j] != '0' {
				if zero {
					hi, zero = power(j), false
				}
				lo = power(j)
			}
		}
	}
	dscale := max(0, fracEnd-fracStart-exp)
	ndigits, weight := 0, 0
	if !zero {
		weight = (hi + exp) >> 2 // floor division by 4
		ndigits = weight - (lo+exp)>>2 + 1
	}
	header := 8
	if dscale <= 63 && weight >= -64 && weight <= 63 {
		header = 6
	}
	return next, header + 2*ndigits
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
