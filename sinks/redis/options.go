package redis

import (
	"strings"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Defaults and limits of Options.
const (
	// DefaultPrefix is the prefix a zero Options keeps its keys under.
	DefaultPrefix = "kairos:"
	// MaxPrefixLen is the longest prefix, in bytes.
	MaxPrefixLen = 128
	// EncodingJSON stores each document as one string, its JSON text.
	EncodingJSON = "json"
	// EncodingHash stores each document, a JSON object, as a hash with one
	// field per top-level member (see doc.go, # Key layout).
	EncodingHash = "hash"
	// DefaultEncoding is the encoding of a zero Options.
	DefaultEncoding = EncodingJSON
	// MinTTL is the shortest TTL a document may be given.
	MinTTL = time.Second
	// MinTombstoneTTL is the shortest time a deleted key's seq may be
	// remembered when it is not kept until the next resync: longer than any
	// sink call of a worker that lost its lease can still take to land
	// (the lease's ttl, 30 s by default), with room to spare.
	MinTombstoneTTL = time.Minute
	// DefaultMaxDocumentBytes is the largest document a zero Options
	// stores; a larger one is rejected.
	DefaultMaxDocumentBytes = 16 << 20
	// MaxMaxDocumentBytes is the most MaxDocumentBytes may be: Redis's
	// default proto-max-bulk-len, the largest string it accepts.
	MaxMaxDocumentBytes = 512 << 20
	// MinMaxDocumentBytes is the least MaxDocumentBytes may be.
	MinMaxDocumentBytes = 16
	// DefaultClientName is the name Open gives its connections (CLIENT
	// SETNAME), so an operator sees in CLIENT LIST which are the sink's.
	DefaultClientName = "kairos-sink"
)

// Options configure a Sink (and, for Prefix and Encoding, a Reader). The
// zero value is valid and means every default. The fields are plain values,
// so a config file can build a sink from `type: redis` plus these.
type Options struct {
	// Prefix starts every key the sink writes: 1 to MaxPrefixLen bytes of
	// printable ASCII without spaces, braces (which would break the cluster
	// hash tags) or glob characters (* ? [ ] \, which would make the
	// collector's SCAN pattern match more than the sink's keys), ending
	// with ':' (so that one sink's keys can never be read as another's
	// whose prefix extends it). Two sinks need two prefixes. Defaults to
	// DefaultPrefix.
	Prefix string
	// Encoding is EncodingJSON (each document one string) or EncodingHash
	// (each document, which must then be a non-empty JSON object, a hash of
	// its top-level members). Defaults to DefaultEncoding.
	Encoding string
	// TTL, when set, makes each document expire TTL after its last write
	// (its seq with it); at least MinTTL. Defaults to 0: documents never
	// expire.
	TTL time.Duration
	// TombstoneTTL, when set, makes a deleted key's remembered seq (see
	// doc.go, # The seq guard) expire after that long; at least
	// MinTombstoneTTL. Defaults to 0: it is kept until the next resync
	// publishes a fresh copy.
	TombstoneTTL time.Duration
	// MaxDocumentBytes is the largest document stored, in bytes of its
	// JSON; a larger one is rejected, alone. MinMaxDocumentBytes to
	// MaxMaxDocumentBytes; keep it at or below the server's
	// proto-max-bulk-len. Defaults to DefaultMaxDocumentBytes.
	MaxDocumentBytes int
	// ClientName is the connection name Open sets (CLIENT SETNAME); New
	// keeps the name the caller's client was given. Letters, digits and
	// "-_.:" only (Redis refuses spaces). Defaults to DefaultClientName.
	ClientName string
}

// resolve fills the defaults and validates the result, naming the field.
func (o Options) resolve() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Encoding == "" {
		o.Encoding = DefaultEncoding
	}
	if o.MaxDocumentBytes == 0 {
		o.MaxDocumentBytes = DefaultMaxDocumentBytes
	}
	if o.ClientName == "" {
		o.ClientName = DefaultClientName
	}
	if err := validPrefix("redis.prefix", o.Prefix); err != nil {
		return o, err
	}
	switch {
	case o.Encoding != EncodingJSON && o.Encoding != EncodingHash:
		return o, feed.Invalid("redis.encoding", "is %q; it must be %q or %q", o.Encoding, EncodingJSON, EncodingHash)
	case o.TTL < 0 || o.TTL > 0 && o.TTL < MinTTL:
		return o, feed.Invalid("redis.ttl", "is %s; it must be 0 (no expiry) or at least %s", o.TTL, MinTTL)
	case o.TTL%time.Millisecond != 0:
		return o, feed.Invalid("redis.ttl", "is %s; Redis counts expiries in whole milliseconds", o.TTL)
	case o.TombstoneTTL < 0 || o.TombstoneTTL > 0 && o.TombstoneTTL < MinTombstoneTTL:
		return o, feed.Invalid("redis.tombstone_ttl", "is %s; it must be 0 (kept until the next resync) or at least %s, so that a late call of a worker that lost its lease still finds it", o.TombstoneTTL, MinTombstoneTTL)
	case o.TombstoneTTL%time.Millisecond != 0:
		return o, feed.Invalid("redis.tombstone_ttl", "is %s; Redis counts expiries in whole milliseconds", o.TombstoneTTL)
	case o.MaxDocumentBytes < MinMaxDocumentBytes || o.MaxDocumentBytes > MaxMaxDocumentBytes:
		return o, feed.Invalid("redis.max_document_bytes", "is %d; it must be %d to %d", o.MaxDocumentBytes, MinMaxDocumentBytes, MaxMaxDocumentBytes)
	case strings.Trim(o.ClientName, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:") != "":
		return o, feed.Invalid("redis.client_name", "is %q; only ASCII letters, digits and -_.: are allowed", o.ClientName)
	}
	return o, nil
}

// validPrefix checks Options.Prefix's rule.
func validPrefix(field, p string) error {
	switch {
	case len(p) > MaxPrefixLen:
		return feed.Invalid(field, "is %d bytes long, more than the %d allowed", len(p), MaxPrefixLen)
	case !strings.HasSuffix(p, ":"):
		return feed.Invalid(field, "%q does not end with ':'; the sink's keys follow it as <prefix><namespace>:{<key>}", p)
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c <= ' ' || c >= 0x7f:
			return feed.Invalid(field, "%q has a byte (0x%02x at %d) other than printable ASCII without spaces", p, c, i)
		case strings.IndexByte("{}*?[]\\", c) >= 0:
			return feed.Invalid(field, "%q has %q at %d; braces would break the cluster hash tags and glob characters the collector's SCAN pattern", p, c, i)
		}
	}
	return nil
}
