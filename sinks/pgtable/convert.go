package pgtable

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"
)

// lookup returns the value at path in v, nil for JSON null or nothing
// there (SQL NULL).
func lookup(v any, path []step) any {
	for _, s := range path {
		switch c := v.(type) {
		case map[string]any:
			if s.index >= 0 {
				return nil
			}
			v = c[s.key]
		case []any:
			if s.index < 0 || s.index >= len(c) {
				return nil
			}
			v = c[s.index]
		default:
			return nil
		}
	}
	return v
}

func decode(doc []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("the document is not JSON: %v", err)
	}
	return v, nil
}

// kind names a JSON value's kind for a rejection's reason.
func kind(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	default:
		return "an object"
	}
}

// convert turns v, not nil, into the text PostgreSQL casts to typ, or says
// why typ cannot hold it: the reason of the record's rejection.
func convert(v any, typ string) (string, bool, error) {
	wrong := func(want string) (string, bool, error) {
		return "", false, fmt.Errorf("%s where %s was expected", kind(v), want)
	}
	switch typ {
	case TypeText:
		switch x := v.(type) {
		case string:
			return x, true, nil
		case json.Number:
			return x.String(), true, nil
		case bool:
			return strconv.FormatBool(x), true, nil
		}
		return wrong("a string, a number or a boolean")
	case TypeBigint, TypeInteger:
		n, ok := v.(json.Number)
		if !ok {
			return wrong("an integer")
		}
		lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
		if typ == TypeInteger {
			lo, hi = math.MinInt32, math.MaxInt32
		}
		if i, err := strconv.ParseInt(n.String(), 10, 64); err == nil {
			if i < lo || i > hi {
				return "", false, fmt.Errorf("%s is out of the range of %s", n, typ)
			}
			return n.String(), true, nil
		}
		// 1e3, 10.0: integral in value if not in form. Exponents are bounded
		// so that a huge one cannot make big.Float spin.
		f, _, err := big.ParseFloat(n.String(), 10, 128, big.ToNearestEven)
		if err != nil || !f.IsInt() {
			return "", false, fmt.Errorf("%.40s is not an integer", n)
		}
		i, acc := f.Int64()
		if acc != big.Exact || i < lo || i > hi {
			return "", false, fmt.Errorf("%.40s is out of the range of %s", n, typ)
		}
		return strconv.FormatInt(i, 10), true, nil
	case TypeNumeric:
		if n, ok := v.(json.Number); ok {
			return n.String(), true, nil
		}
		return wrong("a number")
	case TypeBoolean:
		if b, ok := v.(bool); ok {
			return strconv.FormatBool(b), true, nil
		}
		return wrong("true or false")
	case TypeTimestamptz:
		s, ok := v.(string)
		if !ok {
			return wrong("an RFC 3339 timestamp string")
		}
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return "", false, fmt.Errorf("%.60q is not an RFC 3339 timestamp", s)
		}
		if y := ts.Year(); y < 1 || y > 294275 {
			return "", false, fmt.Errorf("%.60q is out of the range of timestamptz", s)
		}
		return s, true, nil
	case TypeJSONB:
		b, err := json.Marshal(v)
		if err != nil {
			return "", false, err
		}
		return string(b), true, nil
	}
	return "", false, fmt.Errorf("unknown type %q", typ)
}
