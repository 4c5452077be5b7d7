package config

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse: whatever the bytes, Parse returns a config or Errors (never
// panics, never another error type), every Error has a message, and a
// secret set in the environment never appears in what it reports.
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("database:\n  url: ${PW}\n  shema: x\nfeeds:\n  f:\n    sinks:\n      s: {type: redis}\n"))
	f.Add([]byte("a: [1, {b: *c}]\n"))
	f.Add([]byte("database: &x\n  url: u\nlease: *x\n"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("database:\n  url: \"\\xff\"\n  <<: {schema: s}\n"))
	const secret = "fuzz-s3cret-value"
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := Parse(data, ParseOptions{File: "f.yaml", Env: env(map[string]string{"PW": secret, "PGPASS": secret}), SinkTypes: types})
		if err == nil {
			return
		}
		var es Errors
		if !errors.As(err, &es) || len(es) == 0 {
			t.Fatalf("Parse = %T %v; want Errors", err, err)
		}
		for _, e := range es {
			if e.Msg == "" {
				t.Fatalf("an error without a message: %+v", e)
			}
		}
		if strings.Contains(err.Error(), secret) && !strings.Contains(string(data), secret) {
			t.Fatalf("an expanded secret appears in the errors:\n%v", err)
		}
	})
}
