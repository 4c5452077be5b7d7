package pgtable

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/kairos-es/kairos/feed"
)

// Defaults and limits of Options.
const (
	// DefaultSchema is the schema of the target table when Options.Schema is
	// empty.
	DefaultSchema = "public"
	// DefaultKeyColumn, DefaultSeqColumn and DefaultDocColumn name the three
	// columns every target table has.
	DefaultKeyColumn = "key"
	DefaultSeqColumn = "seq"
	DefaultDocColumn = "doc"
	// MaxIdentifierLen is the longest schema or column name: PostgreSQL's
	// NAMEDATALEN less one.
	MaxIdentifierLen = 63
	// MaxTableLen is the longest table name. The shadow table of a resync is
	// named after the live one plus shadowSuffixLen bytes, which must fit in
	// MaxIdentifierLen too.
	MaxTableLen = MaxIdentifierLen - shadowSuffixLen
	// MaxColumns is the most mapped columns.
	MaxColumns = 100
)

// The column types a mapping may name, and what each accepts of the JSON value
// at its path (null or a missing path always stores NULL):
//
//   - text: a string, stored decoded; a number or a boolean, stored as its JSON
//     text.
//   - bigint, integer: an integral number in the type's range ("1e3" is 1000;
//     "1.5" and strings are refused).
//   - numeric: any number.
//   - boolean: true or false.
//   - timestamptz: a string in RFC 3339 form ("2024-05-01T10:00:00Z").
//   - jsonb: any value, stored as jsonb.
const (
	TypeText        = "text"
	TypeBigint      = "bigint"
	TypeInteger     = "integer"
	TypeNumeric     = "numeric"
	TypeBoolean     = "boolean"
	TypeTimestamptz = "timestamptz"
	TypeJSONB       = "jsonb"
)

var columnTypes = []string{TypeText, TypeBigint, TypeInteger, TypeNumeric, TypeBoolean, TypeTimestamptz, TypeJSONB}

// Options configure a Sink. Only Table is required.
type Options struct {
	// Schema is the target table's schema, a plain identifier (see Table).
	// Defaults to DefaultSchema.
	Schema string
	// Table is the target table's name: 1 to MaxTableLen bytes of lower-case
	// ASCII letters, digits and '_', starting with a letter or '_', so that
	// people query it without quoting. The sink always quotes it, and never
	// relies on search_path. Required.
	Table string
	// KeyColumn, SeqColumn and DocColumn name the columns that hold each
	// record's key (text, the primary key or a unique index of its own), its
	// seq (bigint) and its document (jsonb; NULL on a tombstone row, see the
	// package doc). The same identifier rule as Table, up to
	// MaxIdentifierLen bytes. Default to DefaultKeyColumn, DefaultSeqColumn
	// and DefaultDocColumn.
	KeyColumn string
	SeqColumn string
	DocColumn string
	// Columns are typed columns filled from each document, so that the table
	// can be queried, indexed and joined like any other. At most MaxColumns.
	// Defaults to none.
	Columns []Column
	// Create makes New create the table (and its schema) when it does not
	// exist, with the three columns and Columns. Without it, New checks that
	// the table exists with those columns and types. Defaults to false.
	Create bool
}

// Column maps a value of each document to a typed column.
type Column struct {
	// Name is the column's name, under the rule of Options.Table, distinct
	// from the other columns. Required.
	Name string
	// Path is where the value is in the document: "$" then any number of
	// ".name" (ASCII letters, digits and '_'), `["any key"]` (a JSON string)
	// and "[index]" (a non-negative integer) steps, e.g.
	// `$.customer.address["zip code"]` or "$.lines[0].sku". Defaults to "$."
	// followed by Name.
	Path string
	// Type is the column's type, one of the Type constants. Required.
	Type string
}

// step is one step of a parsed path: an object member or an array index.
type step struct {
	key   string
	index int // -1 for a member
}

// resolved is Options after validate: defaults filled, paths parsed.
type resolved struct {
	Options
	paths [][]step
}

// validate fills the defaults and checks every field, naming the first that is
// wrong.
func (o Options) validate() (resolved, error) {
	const p = "pgtable."
	r := resolved{Options: o}
	if r.Schema == "" {
		r.Schema = DefaultSchema
	}
	if r.KeyColumn == "" {
		r.KeyColumn = DefaultKeyColumn
	}
	if r.SeqColumn == "" {
		r.SeqColumn = DefaultSeqColumn
	}
	if r.DocColumn == "" {
		r.DocColumn = DefaultDocColumn
	}
	if err := identifier(p+"schema", r.Schema, MaxIdentifierLen); err != nil {
		return r, err
	}
	if o.Table == "" {
		return r, feed.Invalid(p+"table", "must not be empty")
	}
	if err := identifier(p+"table", r.Table, MaxTableLen); err != nil {
		return r, err
	}
	seen := map[string]string{}
	for _, c := range []struct{ field, name string }{
		{p + "key_column", r.KeyColumn}, {p + "seq_column", r.SeqColumn}, {p + "doc_column", r.DocColumn},
	} {
		if err := identifier(c.field, c.name, MaxIdentifierLen); err != nil {
			return r, err
		}
		if f, ok := seen[c.name]; ok {
			return r, feed.Invalid(c.field, "%q is already %s", c.name, f)
		}
		seen[c.name] = c.field
	}
	if len(o.Columns) > MaxColumns {
		return r, feed.Invalid(p+"columns", "has %d columns, more than the %d allowed", len(o.Columns), MaxColumns)
	}
	r.Columns = make([]Column, len(o.Columns))
	r.paths = make([][]step, len(o.Columns))
	for i, c := range o.Columns {
		field := fmt.Sprintf("%scolumns[%d]", p, i)
		if c.Name == "" {
			return r, feed.Invalid(field+".name", "must not be empty")
		}
		if err := identifier(field+".name", c.Name, MaxIdentifierLen); err != nil {
			return r, err
		}
		if f, ok := seen[c.Name]; ok {
			return r, feed.Invalid(field+".name", "%q is already %s", c.Name, f)
		}
		seen[c.Name] = field + ".name"
		if c.Type == "" {
			return r, feed.Invalid(field+".type", "must not be empty; it is one of %s", strings.Join(columnTypes, ", "))
		}
		known := false
		for _, t := range columnTypes {
			known = known || c.Type == t
		}
		if !known {
			return r, feed.Invalid(field+".type", "%q is not one of %s", c.Type, strings.Join(columnTypes, ", "))
		}
		if c.Path == "" {
			c.Path = "$." + c.Name
		}
		steps, err := parsePath(c.Path)
		if err != nil {
			return r, feed.Invalid(field+".path", "%q: %v", c.Path, err)
		}
		r.Columns[i], r.paths[i] = c, steps
	}
	return r, nil
}

// identifier checks the identifier rule stated on Options.Table.
func identifier(field, s string, max int) error {
	switch {
	case s == "":
		return feed.Invalid(field, "must not be empty")
	case len(s) > max:
		return feed.Invalid(field, "is %d bytes long, more than the %d allowed", len(s), max)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9'
		if !ok {
			return feed.Invalid(field, "%q has %q at offset %d; a name is lower-case ASCII letters, digits and '_', starting with a letter or '_'", s, c, i)
		}
	}
	return nil
}

// parsePath parses the path syntax stated on Column.Path.
func parsePath(s string) ([]step, error) {
	if !strings.HasPrefix(s, "$") {
		return nil, fmt.Errorf("must start with $")
	}
	var steps []step
	for i := 1; i < len(s); {
		switch s[i] {
		case '.':
			j := i + 1
			for j < len(s) && (s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9' || s[j] == '_') {
				j++
			}
			if j == i+1 {
				return nil, fmt.Errorf("offset %d: a '.' must be followed by a member name of ASCII letters, digits and '_' (use [\"...\"] for any other)", i)
			}
			steps = append(steps, step{key: s[i+1 : j], index: -1})
			i = j
		case '[':
			end := strings.IndexByte(s[i:], ']')
			if i+1 < len(s) && s[i+1] == '"' {
				// A JSON string, which may hold ']': find its closing quote.
				j := i + 2
				for j < len(s) && s[j] != '"' {
					if s[j] == '\\' {
						j++
					}
					j++
				}
				if j >= len(s) || j+1 >= len(s) || s[j+1] != ']' {
					return nil, fmt.Errorf("offset %d: a [\"...\"] step is not closed", i)
				}
				var key string
				if err := json.Unmarshal([]byte(s[i+1:j+1]), &key); err != nil {
					return nil, fmt.Errorf("offset %d: %s is not a JSON string", i, s[i+1:j+1])
				}
				steps = append(steps, step{key: key, index: -1})
				i = j + 2
				continue
			}
			if end < 0 {
				return nil, fmt.Errorf("offset %d: a '[' is not closed", i)
			}
			digits := s[i+1 : i+end]
			n, err := strconv.Atoi(digits)
			if err != nil || n < 0 || digits == "" || digits[0] == '+' || len(digits) > 1 && digits[0] == '0' {
				return nil, fmt.Errorf("offset %d: [%s] is neither an index (0, 1, …) nor a quoted member name", i, digits)
			}
			steps = append(steps, step{index: n})
			i += end + 1
		default:
			return nil, fmt.Errorf("offset %d: %q where a '.' or '[' step was expected", i, s[i])
		}
	}
	return steps, nil
}
