package feedtest_test

import (
	"encoding/json"
	"testing"

	"github.com/kairos-es/kairos/feed/feedtest"
)

func TestJSONEqual(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		nilA bool
		nilB bool
		want bool
	}{
		{a: `{"a":1,"b":[1,2]}`, b: ` { "b" : [1, 2], "a" : 1 } `, want: true},
		{a: `100`, b: `1e2`, want: true},
		{a: `1.0`, b: `1`, want: true},
		{a: `12345678901234567890`, b: `12345678901234567891`, want: false},
		{a: `"é"`, b: `"\u00e9"`, want: true},
		{a: `[1,2]`, b: `[2,1]`, want: false},
		{a: `{"a":1}`, b: `{"a":1,"b":null}`, want: false},
		{a: `{"a":null}`, b: `{"a":false}`, want: false},
		{a: `"1"`, b: `1`, want: false},
		{a: `{"a":`, b: `{"a":`, want: false},
		{a: `1 2`, b: `1 2`, want: false},
		{nilA: true, nilB: true, want: true},
		{nilA: true, b: `1`, want: false},
		{a: `1`, nilB: true, want: false},
	} {
		var a, b json.RawMessage
		if !c.nilA {
			a = json.RawMessage(c.a)
		}
		if !c.nilB {
			b = json.RawMessage(c.b)
		}
		if got := feedtest.JSONEqual(a, b); got != c.want {
			t.Errorf("JSONEqual(%q, %q) = %v, want %v", a, b, got, c.want)
		}
		if got := feedtest.JSONEqual(b, a); got != c.want {
			t.Errorf("JSONEqual(%q, %q) = %v, want %v (swapped)", b, a, got, c.want)
		}
	}
}
