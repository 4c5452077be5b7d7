package nats

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"

	"github.com/kairos-es/kairos/feed"
)

// kvKeyRe is the rule the jetstream package holds KV keys to; an encoded
// key must also be one subject token (no '.'), so no key is a wildcard or
// spans tokens.
var kvKeyRe = regexp.MustCompile(`^[-/_=a-zA-Z0-9]+$`)

// TestEncodeKeyRoundTrip: every feed key encodes to a valid KV key of one
// token, within maxEncodedKeyLen, that decodes back to it, and two keys
// never share an encoding.
func TestEncodeKeyRoundTrip(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		key := rapid.OneOf(
			rapid.StringN(1, -1, feed.MaxKeyLen),
			rapid.StringOfN(rapid.SampledFrom([]rune(".*> =/_-aZ9é🦀\t")), 1, -1, feed.MaxKeyLen),
		).Filter(func(s string) bool {
			return len(s) <= feed.MaxKeyLen && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
		}).Draw(t, "key")
		enc := EncodeKey(feed.Key(key))
		if !kvKeyRe.MatchString(enc) {
			t.Fatalf("EncodeKey(%q) = %q, not a KV key of one token", key, enc)
		}
		if len(enc) > maxEncodedKeyLen {
			t.Fatalf("EncodeKey(%q) is %d bytes, more than %d", key, len(enc), maxEncodedKeyLen)
		}
		back, err := DecodeKey(enc)
		if err != nil || string(back) != key {
			t.Fatalf("DecodeKey(EncodeKey(%q)) = %q, %v", key, back, err)
		}
		other := rapid.StringN(1, -1, feed.MaxKeyLen).Draw(t, "other")
		if other != key && EncodeKey(feed.Key(other)) == enc {
			t.Fatalf("%q and %q share the encoding %q", key, other, enc)
		}
	})
}

// TestDecodeKeyRefusesForeignKeys: a KV key the encoding cannot have made
// (another writer's, a lower-case or short escape, an escaped byte that is
// kept as it is) is refused, so the reader never maps two KV keys to one
// feed key.
func TestDecodeKeyRefusesForeignKeys(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "a.b", "=", "=4", "=2e", "=41", "a=zz", "x y"} {
		if k, err := DecodeKey(s); err == nil {
			t.Errorf("DecodeKey(%q) = %q, want an error", s, k)
		}
	}
	for s, want := range map[string]string{"a=2Eb": "a.b", "=3D": "=", "order/1": "order/1", "=C3=A9": "é"} {
		if k, err := DecodeKey(s); err != nil || string(k) != want {
			t.Errorf("DecodeKey(%q) = %q, %v; want %q", s, k, err, want)
		}
	}
}
