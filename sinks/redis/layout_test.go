package redis

import (
	"fmt"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kairos-es/kairos/feed"
)

// redisSlot is the slot Redis Cluster gives a whole key name, by the rule
// of its specification, written out here apart from the sink's own code:
// when the name has a '{' followed later by a '}' with at least one byte
// between them, only the bytes between the first '{' and the first '}'
// after it are hashed; otherwise the whole name is.
func redisSlot(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if close := strings.IndexByte(key[open+1:], '}'); close > 0 {
			key = key[open+1 : open+1+close]
		}
	}
	return crc16(key) % 16384
}

func TestCRC16(t *testing.T) {
	// The check value of CRC-16/XMODEM, which Redis Cluster's spec gives.
	if got := crc16("123456789"); got != 0x31c3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	// Slots Redis itself reports (CLUSTER KEYSLOT) for these names.
	for key, want := range map[string]uint16{"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443, "foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "foo{bar}{zap}": 5061} {
		if got := redisSlot(key); got != want {
			t.Errorf("slot of %q = %d, want %d", key, got, want)
		}
	}
}

// awkward are keys whose bytes fight the hash tag rule.
var awkward = []string{"plain", "{", "}", "{}", "}{", "a{b}c", "}lead", "trail{", "%", "%7B", "%7D", "%25", "{{}}", "ü{ñ}", strings.Repeat("}", 100), "a b", "emoji 🦀"}

// TestRecordAndSeqShareASlot: a record's document key and its seq key hash
// to one slot in every namespace, so one script can write both in a
// cluster, and it is the slot the sink groups the record by.
func TestRecordAndSeqShareASlot(t *testing.T) {
	for _, p := range []string{"kairos:", "orders:", "a:b:"} {
		l := layout{p}
		for _, k := range awkward {
			for _, ns := range []string{"0.1", "3.1796166065408440"} {
				dk := l.docKey(ns, feed.Key(k))
				sk := seqKeyOf(dk)
				if redisSlot(dk) != redisSlot(sk) {
					t.Errorf("%q: document key %q in slot %d, seq key %q in slot %d", k, dk, redisSlot(dk), sk, redisSlot(sk))
				}
				if redisSlot(dk) != slotOf(feed.Key(k)) {
					t.Errorf("%q: the sink groups it by slot %d, Redis puts it in %d", k, slotOf(feed.Key(k)), redisSlot(dk))
				}
				if gotNs, _, ok := l.parse(dk); !ok || gotNs != ns {
					t.Errorf("parse(%q) = %q, %v", dk, gotNs, ok)
				}
				if gotNs, _, ok := l.parse(sk); !ok || gotNs != ns {
					t.Errorf("parse(%q) = %q, %v", sk, gotNs, ok)
				}
			}
			if back, ok := unescapeKey(escapeKey(feed.Key(k))); !ok || string(back) != k {
				t.Errorf("unescape(escape(%q)) = %q, %v", k, back, ok)
			}
		}
	}
	// Keys not of the layout are never the collector's.
	l := layout{"orders:"}
	for _, k := range []string{"orders:meta", "orders:1.2", "orders:1.2:x", "orders:1.2:{a}b", "orders:1:{a}", "orders:x.2:{a}", "orders:1.2:{a{b}", "orders:1.2:3.4:{a}", "orders:1.2:{%zz}", "other:1.2:{a}", "orders:1.2:{a}:seqx"} {
		if ns, _, ok := l.parse(k); ok {
			t.Errorf("parse(%q) = %q: a key not of the layout is read as the sink's", k, ns)
		}
	}
}

// TestClusterGroups: in a cluster each script call holds records of one
// slot only (a script may touch one slot), every record once; on one
// server the batch is as few calls as the size bounds allow.
func TestClusterGroups(t *testing.T) {
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	var recs []feed.Record
	for i := range 2000 {
		k := fmt.Sprintf("k%d", i%700)
		if i >= 700 {
			k = fmt.Sprintf("{tag%d}-%d", i%5, i) // escaped, so no shared tag
		}
		recs = append(recs, feed.Record{Key: feed.Key(k), Seq: feed.Seq(i + 1), Doc: []byte(`{"i":1}`)})
	}
	for _, cluster := range []*goredis.ClusterClient{nil, cc} {
		s := &Sink{l: layout{"p:"}, cluster: cluster, opts: Options{MaxDocumentBytes: 1 << 20, Encoding: EncodingJSON}}
		groups, rej := s.groups(copyRef{ns: "1.1"}, recs)
		if len(rej) != 0 {
			t.Fatal(rej)
		}
		seen := map[int]bool{}
		for _, g := range groups {
			if len(g.keys) != 2*len(g.idx) || len(g.idx) > maxGroupRecords {
				t.Errorf("a group of %d records has %d keys", len(g.idx), len(g.keys))
			}
			for _, i := range g.idx {
				if seen[i] {
					t.Errorf("record %d is in two groups", i)
				}
				seen[i] = true
			}
			if cluster != nil {
				for _, k := range g.keys {
					if redisSlot(k) != redisSlot(g.keys[0]) {
						t.Errorf("a cluster group holds slots %d and %d", redisSlot(g.keys[0]), redisSlot(k))
					}
				}
			}
		}
		if len(seen) != len(recs) {
			t.Errorf("%d of %d records grouped", len(seen), len(recs))
		}
		if cluster == nil && len(groups) != (len(recs)+maxGroupRecords-1)/maxGroupRecords {
			t.Errorf("one server: %d groups for %d records", len(groups), len(recs))
		}
		t.Logf("cluster %v: %d records in %d script calls", cluster != nil, len(recs), len(groups))
	}
}
