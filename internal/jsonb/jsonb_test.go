package jsonb

import (
	"strings"
	"testing"
)

// TestSize holds the layout to sizes PostgreSQL 15 reports (pg_column_size
// less its 4-byte header) for documents that each show one rule of it: pgfeed's property
// test compares many more with the server itself.
func TestSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		doc  string
		size int
	}{
		{`"ab"`, 10},                 // an array of one: header, entry, 2 bytes
		{`1`, 16},                    // numeric 1: 4 + 2 + one digit
		{`[1]`, 16},                  //
		{`{"a":1,"a":"x"}`, 14},      // the last of a repeated key stays
		{`{"a":"x","a":1}`, 24},      // ... padded after the keys and "x"
		{`"\u00e9\ud83d\ude00"`, 14}, // escapes decoded: 2 + 4 bytes
		{`[]`, 4},
		{`{}`, 4},
		{`[true,null,false]`, 16}, // entries only
		{`0`, 14},                 // a zero has no digits
		{`1e256`, 18},             // weight 64: the long header
		{`1e252`, 16},             // weight 63: still short
		{`0.` + strings.Repeat("0", 62) + `1`, 16},     // scale 63: short
		{`0.` + strings.Repeat("0", 63) + `1`, 18},     // scale 64: long
		{`12345.6789`, 20},                             // groups 1|2345|6789: 6 + 3·2 bytes
		{`100000000`, 16},                              // trailing zero groups dropped
		{`{"b":"x","a":0}`, 4 + 16 + 2 + 2 + 6 + 1},    // "a" first: 0 after the keys, padded
		{`{"bb":0,"a":"xyz"}`, 4 + 16 + 3 + 3 + 2 + 6}, // shorter key first
	} {
		if got := Size([]byte(tc.doc)); got != tc.size {
			t.Errorf("Size(%.40s) = %d, want %d", tc.doc, got, tc.size)
		}
	}
}

// TestCheck applies small limits, so that each one's edge is cheap to reach.
func TestCheck(t *testing.T) {
	t.Parallel()
	lim := Limits{Size: 40, Elems: 3, Pairs: 2}
	for _, tc := range []struct {
		doc, why string
		at       int
	}{
		{`"` + strings.Repeat("x", 32) + `"`, "", -1},                      // 8 + 32 = 40
		{`"` + strings.Repeat("x", 33) + `"`, "takes 41 bytes", 0},         //
		{`["` + strings.Repeat("x", 41) + `"]`, "a string of 41 bytes", 1}, // the string, first
		{`[1,2,3]`, "", -1},
		{`[1,2,3,4]`, "more than 3 elements", 0},
		{`[[],[[1,2,3,4]]]`, "more than 3 elements", 5},
		{`{"a":1,"b":2}`, "", -1},
		{`{"a":1,"a":2,"a":3}`, "more than 2 members", 0}, // repeated keys count
		{`{"k":[{"a":1,"b":2,"c":3}]}`, "more than 2 members", 6},
	} {
		why, at := Check([]byte(tc.doc), lim)
		if !strings.Contains(why, tc.why) || at != tc.at || (tc.why == "") != (why == "") {
			t.Errorf("Check(%.40s) = %q at %d, want %q at %d", tc.doc, why, at, tc.why, tc.at)
		}
	}
}
