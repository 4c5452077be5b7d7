package mysql

import (
	"regexp"

	"github.com/kairos-es/kairos/feed"
)

// Defaults and limits of Options.
const (
	// DefaultTable is the table a zero Options writes to.
	DefaultTable = "kairos_docs"
	// MaxTableLen is the longest table name: MySQL's and MariaDB's 64-byte
	// identifier limit, less the room the shadow and retired copies' suffixes
	// take (see doc.go, # Resync).
	MaxTableLen = 64 - len(suffixShadow) - suffixRandLen
	// MaxRowsPerStatement caps the rows of one upsert statement: three
	// placeholders a row, and a prepared statement holds at most 65,535.
	// A batch of more rows is sent as several statements, each on its own.
	MaxRowsPerStatement = 10_000
)

// Options configure a Sink. The zero value is valid and means every default.
// The fields are plain values, so a config file can build a sink from
// `type: mysql` plus these.
type Options struct {
	// Table is the table the documents live in, in the connection's
	// database: 1 to MaxTableLen bytes of ASCII letters, digits, '_' and
	// '$', not all digits. Its columns must be `key` (VARBINARY), `seq`
	// (BIGINT) and `doc` (LONGTEXT or JSON, NULL allowed); other columns
	// and constraints are left alone. Defaults to DefaultTable.
	Table string
	// Create makes New create the table when it does not exist, with the
	// columns doc.go shows. Without it a missing table is an error, so a
	// misspelt name is not silently a new, empty table. Defaults to false.
	Create bool
	// NoJSONCheck leaves the CHECK (JSON_VALID(doc)) out of a table Create
	// makes. The check guarantees readers the column holds JSON, but the
	// server's JSON parser refuses documents nested deeper than it allows
	// (MariaDB 10.11 refuses 32 levels or more, MySQL 8 more than 100),
	// which the sink then rejects, while the feed already validated every
	// document it sends. Defaults to false (the check is made).
	NoJSONCheck bool
}

var identRe = regexp.MustCompile(`^[A-Za-z0-9_$]+$`)
var allDigits = regexp.MustCompile(`^[0-9]+$`)

// resolve fills the defaults and validates the result, naming the field.
func (o Options) resolve() (Options, error) {
	if o.Table == "" {
		o.Table = DefaultTable
	}
	switch {
	case len(o.Table) > MaxTableLen:
		return o, feed.Invalid("mysql.table", "is %d bytes long, more than the %d allowed (64 less the room of the resync suffixes)", len(o.Table), MaxTableLen)
	case !identRe.MatchString(o.Table):
		return o, feed.Invalid("mysql.table", "%q has a character other than ASCII letters, digits, '_' and '$'", o.Table)
	case allDigits.MatchString(o.Table):
		return o, feed.Invalid("mysql.table", "%q is all digits, which the servers read as a number", o.Table)
	}
	return o, nil
}
