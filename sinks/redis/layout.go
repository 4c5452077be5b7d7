package redis

import (
	"strconv"
	"strings"

	"github.com/kairos-es/kairos/feed"
)

// The key layout (doc.go, # Key layout, says it for readers outside Go):
//
//	<prefix>meta                    hash: live, floor, next, filling:<ns>
//	<prefix><ns>:{<escaped key>}     the document
//	<prefix><ns>:{<escaped key>}:seq the seq of the version stored (or deleted)
//
// <ns> is <generation>.<n>, n unique per namespace the sink ever opened.

const (
	metaSuffix   = "meta"
	fieldLive    = "live"
	fieldFloor   = "floor"
	fieldNext    = "next"
	fieldFilling = "filling:"
	seqSuffix    = ":seq"
)

// escapeKey makes a feed key the inside of a hash tag: '%', '{' and '}'
// become %25, %7B and %7D, so the tag holds the whole key (Redis hashes
// from the first '{' to the first '}' after it) and stays non-empty.
func escapeKey(k feed.Key) string {
	s := string(k)
	if !strings.ContainsAny(s, "%{}") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// unescapeKey reverses escapeKey; ok is false for text escapeKey never
// makes.
func unescapeKey(s string) (feed.Key, bool) {
	if !strings.Contains(s, "%") {
		return feed.Key(s), !strings.ContainsAny(s, "{}")
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '{' || c == '}' {
			return "", false
		}
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		switch s[i+1 : i+3] {
		case "25":
			b.WriteByte('%')
		case "7B":
			b.WriteByte('{')
		case "7D":
			b.WriteByte('}')
		default:
			return "", false
		}
		i += 2
	}
	return feed.Key(b.String()), true
}

// layout names the keys of one sink's prefix.
type layout struct{ prefix string }

func (l layout) meta() string { return l.prefix + metaSuffix }

// docKey is the key of k's document in namespace ns.
func (l layout) docKey(ns string, k feed.Key) string {
	return l.prefix + ns + ":{" + escapeKey(k) + "}"
}

// seqKeyOf is the seq key beside the document key dk.
func seqKeyOf(dk string) string { return dk + seqSuffix }

// parse reads a key the sink may have written under its prefix: its
// namespace's n, whether it is a seq key, and ok false for anything not of
// the layout (the meta hash, a key of another sink or of the application),
// which the collector leaves alone.
func (l layout) parse(key string) (ns string, n int64, ok bool) {
	rest, found := strings.CutPrefix(key, l.prefix)
	if !found {
		return "", 0, false
	}
	colon := strings.IndexByte(rest, ':')
	if colon < 0 {
		return "", 0, false
	}
	ns = rest[:colon]
	n, ok = parseNamespace(ns)
	if !ok {
		return "", 0, false
	}
	tag := rest[colon+1:]
	tag = strings.TrimSuffix(tag, seqSuffix)
	if len(tag) < 2 || tag[0] != '{' || tag[len(tag)-1] != '}' {
		return "", 0, false
	}
	if _, ok := unescapeKey(tag[1 : len(tag)-1]); !ok {
		return "", 0, false
	}
	return ns, n, true
}

// parseNamespace reads <generation>.<n>, returning n.
func parseNamespace(ns string) (int64, bool) {
	g, n, found := strings.Cut(ns, ".")
	if !found || !allDigits(g) || !allDigits(n) {
		return 0, false
	}
	v, err := strconv.ParseInt(n, 10, 64)
	return v, err == nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// slotOf is the Redis Cluster slot of a feed key's document and seq keys:
// CRC16 of the hash tag, modulo 16384. Both keys share the tag, so the
// slot, which is what lets one script write them together in a cluster.
func slotOf(k feed.Key) uint16 { return crc16(escapeKey(k)) & 16383 }

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
