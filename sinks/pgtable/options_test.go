package pgtable_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kairos-es/kairos/sinks/pgtable"
)

// TestBadOptions: every option a caller can get wrong is refused by New with
// the field named, before anything is created.
func TestBadOptions(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	col := func(c pgtable.Column) pgtable.Options {
		return pgtable.Options{Table: "t", Create: true, Columns: []pgtable.Column{c}}
	}
	for _, tc := range []struct {
		what  string
		opts  pgtable.Options
		field string
	}{
		{"no table", pgtable.Options{Create: true}, "pgtable.table"},
		{"a table with a quote", pgtable.Options{Table: `t"; DROP TABLE x; --`, Create: true}, "pgtable.table"},
		{"an upper-case table", pgtable.Options{Table: "Orders", Create: true}, "pgtable.table"},
		{"a table starting with a digit", pgtable.Options{Table: "1t", Create: true}, "pgtable.table"},
		{"a table too long for its shadow's name", pgtable.Options{Table: strings.Repeat("t", pgtable.MaxTableLen+1), Create: true}, "pgtable.table"},
		{"a schema with a dot", pgtable.Options{Schema: "a.b", Table: "t", Create: true}, "pgtable.schema"},
		{"a key column with a space", pgtable.Options{Table: "t", KeyColumn: "the key", Create: true}, "pgtable.key_column"},
		{"a seq column named as the key's", pgtable.Options{Table: "t", SeqColumn: "key", Create: true}, "pgtable.seq_column"},
		{"a doc column too long", pgtable.Options{Table: "t", DocColumn: strings.Repeat("d", 64), Create: true}, "pgtable.doc_column"},
		{"a column without a name", col(pgtable.Column{Type: "text"}), "pgtable.columns[0].name"},
		{"a column with an invalid name", col(pgtable.Column{Name: "a-b", Type: "text"}), "pgtable.columns[0].name"},
		{"a column named as the doc column", col(pgtable.Column{Name: "doc", Type: "text"}), "pgtable.columns[0].name"},
		{"a column without a type", col(pgtable.Column{Name: "a"}), "pgtable.columns[0].type"},
		{"an unknown column type", col(pgtable.Column{Name: "a", Type: "varchar(10)"}), "pgtable.columns[0].type"},
		{"an injected column type", col(pgtable.Column{Name: "a", Type: "text; DROP TABLE t"}), "pgtable.columns[0].type"},
		{"a path without $", col(pgtable.Column{Name: "a", Path: "a.b", Type: "text"}), "pgtable.columns[0].path"},
		{"a path with an empty step", col(pgtable.Column{Name: "a", Path: "$..b", Type: "text"}), "pgtable.columns[0].path"},
		{"a path with an unclosed bracket", col(pgtable.Column{Name: "a", Path: "$.a[0", Type: "text"}), "pgtable.columns[0].path"},
		{"a path with a negative index", col(pgtable.Column{Name: "a", Path: "$.a[-1]", Type: "text"}), "pgtable.columns[0].path"},
		{"a path with an unclosed quoted step", col(pgtable.Column{Name: "a", Path: `$["a]`, Type: "text"}), "pgtable.columns[0].path"},
		{"a path with a bad escape", col(pgtable.Column{Name: "a", Path: `$["\q"]`, Type: "text"}), "pgtable.columns[0].path"},
		{"a path with trailing junk", col(pgtable.Column{Name: "a", Path: "$.a b", Type: "text"}), "pgtable.columns[0].path"},
		{"too many columns", pgtable.Options{Table: "t", Columns: make([]pgtable.Column, pgtable.MaxColumns+1)}, "pgtable.columns"},
	} {
		tc.opts.Schema = map[bool]string{true: tc.opts.Schema, false: tg.schema}[tc.opts.Schema != ""]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := pgtable.New(ctx, tg.pool, tc.opts)
		cancel()
		wantInvalid(t, tc.what, err, tc.field)
	}
	var n int
	if err := tg.read.QueryRow(t.Context(), `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, tg.schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("refused options left %d relations behind", n)
	}
	if _, err := pgtable.New(t.Context(), nil, pgtable.Options{Table: "t"}); err == nil {
		t.Error("New(nil pool): no error")
	}
}

// TestPaths: the path forms Column.Path documents are accepted.
func TestPaths(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	s := tg.sink(t, pgtable.Options{Table: "p", Create: true, Columns: []pgtable.Column{
		{Name: "a", Path: `$.x["odd ] key \" here"][1].y_2`, Type: pgtable.TypeText},
		{Name: "b", Path: `$`, Type: pgtable.TypeJSONB},
		{Name: "c", Type: pgtable.TypeBoolean}, // $.c
	}})
	applyOK(t, s, rec("k", 1, `{"x":{"odd ] key \" here":[0,{"y_2":"found"}]},"c":true}`))
	var a, b string
	var c bool
	if err := tg.read.QueryRow(t.Context(), `SELECT a, b::text, c FROM `+s.Table()).Scan(&a, &b, &c); err != nil {
		t.Fatal(err)
	}
	if a != "found" || !c || !strings.HasPrefix(b, `{"c": true`) {
		t.Errorf("mapped columns = %q, %q, %v", a, b, c)
	}
}

// TestShape: without Create, New refuses a table that is missing or lacks a
// column, a type or the unique key the upsert needs, naming the option.
func TestShape(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	q := `"` + tg.schema + `".`
	tg.exec(t, `CREATE TABLE `+q+`good (key text PRIMARY KEY, seq bigint NOT NULL, doc jsonb, n numeric(10,2), ts timestamptz)`)
	tg.exec(t, `CREATE TABLE `+q+`nokey (key text, seq bigint, doc jsonb)`)
	tg.exec(t, `CREATE TABLE `+q+`wrongseq (key text PRIMARY KEY, seq integer, doc jsonb)`)
	tg.exec(t, `CREATE TABLE `+q+`jsondoc (key text PRIMARY KEY, seq bigint, doc json)`)
	mapped := []pgtable.Column{{Name: "n", Type: "numeric"}, {Name: "ts", Type: "timestamptz"}}
	for _, tc := range []struct {
		what  string
		opts  pgtable.Options
		field string
	}{
		{"a missing table", pgtable.Options{Table: "absent"}, "pgtable.table"},
		{"no unique key", pgtable.Options{Table: "nokey"}, "pgtable.key_column"},
		{"an integer seq", pgtable.Options{Table: "wrongseq"}, "pgtable.seq_column"},
		{"a json doc", pgtable.Options{Table: "jsondoc"}, "pgtable.doc_column"},
		{"a missing mapped column", pgtable.Options{Table: "good", Columns: []pgtable.Column{{Name: "x", Type: "text"}}}, "pgtable.columns[0].type"},
		{"a mapped column of another type", pgtable.Options{Table: "good", Columns: []pgtable.Column{{Name: "ts", Type: "bigint"}}}, "pgtable.columns[0].type"},
		{"other column names", pgtable.Options{Table: "good", KeyColumn: "id"}, "pgtable.key_column"},
	} {
		tc.opts.Schema = tg.schema
		_, err := pgtable.New(t.Context(), tg.pool, tc.opts)
		wantInvalid(t, tc.what, err, tc.field)
	}
	tg.sink(t, pgtable.Options{Table: "good", Columns: mapped})
}

// TestUnreachable: New against a database that does not answer is an error,
// not an invalid input.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	tg.fault(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pgtable.New(ctx, tg.pool, pgtable.Options{Schema: tg.schema, Table: "t", Create: true})
	if err == nil || strings.Contains(err.Error(), "invalid input") {
		t.Errorf("New on an unreachable database = %v, want a connection error", err)
	}
}
