package feed

import (
	"bytes"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits of the validated values. They are part of the contract: every store
// and sink may rely on them (a key fits an Elasticsearch _id, a name fits a
// metric label and a NOTIFY payload, a reason fits a log line).
const (
	// MaxNameLen is the longest feed or sink name, in bytes.
	MaxNameLen = 128
	// MaxKeyLen is the longest key, in bytes (Elasticsearch's _id limit).
	MaxKeyLen = 512
	// MaxReasonLen is the longest park reason, in bytes. CleanReason cuts to it.
	MaxReasonLen = 1024
	// MaxBatchLimit is the largest batch a reader hands out at once. It bounds
	// the memory a worker needs whatever the feed's size.
	MaxBatchLimit = 100_000
)

// FeedName names a feed: 1 to MaxNameLen bytes of ASCII letters, digits, '_',
// '-', '.' and ':', starting with a letter or digit, so that it needs no
// escaping in the metric labels, log fields, NOTIFY payloads, index and key
// prefixes and file names it ends up in. Build one with ParseFeedName. The
// zero value is not a valid name.
type FeedName string

// SinkName names a sink of a feed; the same rule as FeedName.
type SinkName string

// Key identifies one document of a feed. Build one with ParseKey. A key is 1 to
// MaxKeyLen bytes of valid UTF-8 with no NUL byte; anything else a sink can
// store (spaces, slashes, non-Latin letters) is allowed.
type Key string

// SinkID is one sink of one feed: the unit a lease, a cursor and a parked list
// belong to.
type SinkID struct {
	Feed FeedName
	Sink SinkName
}

func (id SinkID) String() string { return string(id.Feed) + "/" + string(id.Sink) }

// Validate checks both names.
func (id SinkID) Validate() error {
	if err := id.Feed.Validate(); err != nil {
		return err
	}
	return id.Sink.Validate()
}

// ParseFeedName validates s as a feed name.
func ParseFeedName(s string) (FeedName, error) {
	if err := validName("feed name", s); err != nil {
		return "", err
	}
	return FeedName(s), nil
}

// ParseSinkName validates s as a sink name.
func ParseSinkName(s string) (SinkName, error) {
	if err := validName("sink name", s); err != nil {
		return "", err
	}
	return SinkName(s), nil
}

// ParseKey validates s as a key.
func ParseKey(s string) (Key, error) {
	if err := validKey("key", s); err != nil {
		return "", err
	}
	return Key(s), nil
}

// Validate reports whether n follows the name rule; stores call it on every
// name they are handed, since a FeedName can be converted from any string.
func (n FeedName) Validate() error { return validName("feed name", string(n)) }

// Validate reports whether n follows the name rule.
func (n SinkName) Validate() error { return validName("sink name", string(n)) }

// Validate reports whether k follows the key rule.
func (k Key) Validate() error { return validKey("key", string(k)) }

// validName checks the name rule, stated on FeedName.
func validName(field, s string) error {
	switch {
	case s == "":
		return Invalid(field, "must not be empty")
	case len(s) > MaxNameLen:
		return Invalid(field, "is %d bytes long, more than the %d allowed", len(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return Invalid(field, "%q must start with an ASCII letter or digit", s)
		}
		if !alnum && c != '_' && c != '-' && c != '.' && c != ':' {
			if c < 0x20 || c >= 0x7f {
				return Invalid(field, "has the byte 0x%02x at offset %d; only ASCII letters, digits, '_', '-', '.' and ':' are allowed", c, i)
			}
			return Invalid(field, "%q has %q at offset %d; only ASCII letters, digits, '_', '-', '.' and ':' are allowed", s, c, i)
		}
	}
	return nil
}

// validKey is the one home of the key rule (see Key).
func validKey(field, s string) error {
	switch {
	case s == "":
		return Invalid(field, "must not be empty")
	case len(s) > MaxKeyLen:
		return Invalid(field, "is %d bytes long, more than the %d allowed", len(s), MaxKeyLen)
	case !utf8.ValidString(s):
		return Invalid(field, "is not valid UTF-8")
	}
	if i := bytes.IndexByte([]byte(s), 0); i >= 0 {
		return Invalid(field, "has a NUL byte at offset %d", i)
	}
	return nil
}

// CleanReason makes s a park reason: one clean line that CursorMove.Validate
// accepts (valid UTF-8 without NUL, at most MaxReasonLen bytes), whatever a
// sink's error text holds. It is the one
// home of that cleaning; the driver passes every rejection's reason through
// it before it parks a record, so a rejection is never itself refused, and a
// parked list shows one line per record in a log, a terminal or a table.
//
// Invalid UTF-8 becomes U+FFFD; each run of control characters (newlines,
// tabs, NUL and the rest of Unicode's Cc, and the line and paragraph
// separators U+2028 and U+2029) becomes one space; whitespace at either end
// goes; and the result is cut at a character boundary to MaxReasonLen bytes.
// A reason left empty says the sink gave none.
func CleanReason(s string) string {
	b := make([]byte, 0, min(len(s), MaxReasonLen))
	space := false        // a run of control characters is pending as one space
	for _, r := range s { // ranging replaces invalid bytes with U+FFFD
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			space = true
			continue
		}
		n := utf8.RuneLen(r)
		if space && len(b) > 0 {
			n++
		}
		if len(b)+n > MaxReasonLen {
			break
		}
		if space && len(b) > 0 {
			b = append(b, ' ')
		}
		space = false
		b = utf8.AppendRune(b, r)
	}
	out := strings.TrimFunc(string(b), unicode.IsSpace)
	if out == "" {
		return "rejected by the sink (no reason given)"
	}
	return out
}

// validReason checks what a store needs of a park reason, which CleanReason's
// output always meets: not empty, at most MaxReasonLen bytes of UTF-8, no NUL.
func validReason(field, s string) error {
	switch {
	case s == "":
		return Invalid(field, "must not be empty")
	case len(s) > MaxReasonLen:
		return Invalid(field, "is %d bytes long, more than the %d allowed", len(s), MaxReasonLen)
	case !utf8.ValidString(s):
		return Invalid(field, "is not valid UTF-8")
	}
	if i := bytes.IndexByte([]byte(s), 0); i >= 0 {
		return Invalid(field, "has a NUL byte at offset %d", i)
	}
	return nil
}
