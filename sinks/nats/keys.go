package nats

import (
	"fmt"

	"github.com/kairos-es/kairos/feed"
)

// escapeByte starts the escape of one byte in an encoded key.
const escapeByte = '='

// maxEncodedKeyLen is the longest encoded key: every byte of a
// feed.MaxKeyLen key escaped.
const maxEncodedKeyLen = 3 * feed.MaxKeyLen

// keptByte reports whether b stands for itself in an encoded key: ASCII
// letters, digits, '-', '_' and '/'. Everything else, '.' (the subject token
// separator), '*' and '>' (wildcards), spaces, control bytes, '=' itself and
// every byte of a multi-byte UTF-8 letter, is escaped.
func keptByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '_' || b == '/'
}

const hexDigits = "0123456789ABCDEF"

// EncodeKey returns the KV key (the last token of the message subject) that
// key is stored under. The package doc's # Keys says what it does and why;
// DecodeKey is its inverse.
func EncodeKey(key feed.Key) string {
	n := 0
	for i := 0; i < len(key); i++ {
		if !keptByte(key[i]) {
			n++
		}
	}
	if n == 0 {
		return string(key)
	}
	out := make([]byte, 0, len(key)+2*n)
	for i := 0; i < len(key); i++ {
		b := key[i]
		if keptByte(b) {
			out = append(out, b)
			continue
		}
		out = append(out, escapeByte, hexDigits[b>>4], hexDigits[b&0xF])
	}
	return string(out)
}

// DecodeKey returns the feed key that EncodeKey turned into s, or an error
// when s is not the encoding of any key (a KV key another writer put in the
// bucket, say).
func DecodeKey(s string) (feed.Key, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case keptByte(b):
			out = append(out, b)
		case b == escapeByte && i+2 < len(s) && isUpperHex(s[i+1]) && isUpperHex(s[i+2]):
			v := unhex(s[i+1])<<4 | unhex(s[i+2])
			if keptByte(v) {
				return "", fmt.Errorf("nats: KV key %q escapes %q, which the encoding keeps as it is", s, v)
			}
			out = append(out, v)
			i += 2
		default:
			return "", fmt.Errorf("nats: KV key %q is not the encoding of a feed key (byte %d)", s, i)
		}
	}
	if len(out) == 0 {
		return "", fmt.Errorf("nats: KV key %q is empty", s)
	}
	return feed.Key(out), nil
}

func isUpperHex(b byte) bool { return '0' <= b && b <= '9' || 'A' <= b && b <= 'F' }

func unhex(b byte) byte {
	if b <= '9' {
		return b - '0'
	}
	return b - 'A' + 10
}
