package feed_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
)

// nameRule is the name rule as FeedName's doc states it, written the other
// way (a regular expression) so that the two can be held to each other.
var nameRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// keyRule is the key rule as Key's doc states it.
func keyRule(s string) bool {
	return s != "" && len(s) <= feed.MaxKeyLen && utf8.ValidString(s) && !strings.Contains(s, "\x00")
}

// wantCleanInvalid requires err to be an *InvalidError naming field whose
// text is one printable line: a name or key that breaks its rule may hold
// any byte, and an error that repeated it raw would break the log line or
// terminal it lands on.
func wantCleanInvalid(t *testing.T, err error, field string) {
	t.Helper()
	var inv *feed.InvalidError
	if !errors.As(err, &inv) || !errors.Is(err, feed.ErrInvalid) || inv.Field != field {
		t.Fatalf("err = %#v; want an *InvalidError for %q", err, field)
	}
	msg := err.Error()
	if !strings.Contains(msg, field+": ") {
		t.Fatalf("err = %q does not name the field %q", msg, field)
	}
	if !utf8.ValidString(msg) || strings.ContainsFunc(msg, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) {
		t.Fatalf("err = %q is not one printable line", msg)
	}
}

// FuzzNames holds ParseFeedName, ParseSinkName and both Validate methods to
// the name rule: each accepts exactly what the rule allows, refuses the
// rest with a clean error naming its field, and an accepted pair of names
// comes back unchanged from the oracle store (a feed written and described,
// a sink registered by its lease).
func FuzzNames(f *testing.F) {
	for _, s := range []string{
		"orders", "a", "0", "orders.v2", "eu-west:orders_1", "A-Z.09:_",
		"", "-x", ".x", "_x", ":x", "my orders", "orders/eu", "ordérs", "x\x00", "x\n", "x\x7f", "x\xff", `x"`, "x\u00a0",
		strings.Repeat("n", feed.MaxNameLen), strings.Repeat("n", feed.MaxNameLen+1),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := nameRule.MatchString(s) && len(s) <= feed.MaxNameLen
		fn, ferr := feed.ParseFeedName(s)
		sn, serr := feed.ParseSinkName(s)
		if (ferr == nil) != want || (serr == nil) != want {
			t.Fatalf("ParseFeedName(%q) = %v, ParseSinkName = %v; the rule says valid = %v", s, ferr, serr, want)
		}
		if (feed.FeedName(s).Validate() == nil) != want || (feed.SinkName(s).Validate() == nil) != want {
			t.Fatalf("Validate(%q) disagrees with Parse", s)
		}
		if !want {
			wantCleanInvalid(t, ferr, "feed name")
			wantCleanInvalid(t, serr, "sink name")
			wantCleanInvalid(t, feed.SinkID{Feed: "ok", Sink: feed.SinkName(s)}.Validate(), "sink name")
			return
		}
		if string(fn) != s || string(sn) != s {
			t.Fatalf("parsed %q as %q and %q", s, fn, sn)
		}
		ctx := context.Background()
		st, err := memfeed.New(memfeed.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.WriteCommitted(ctx, fn, []feed.Change{feed.Put("k", json.RawMessage(`1`))}); err != nil {
			t.Fatalf("write to feed %q: %v", s, err)
		}
		l, err := st.AcquireLease(ctx, feed.SinkID{Feed: fn, Sink: sn})
		if err != nil {
			t.Fatalf("lease of sink %q: %v", s, err)
		}
		defer l.Release(ctx)
		d, err := st.Describe(ctx, fn)
		if err != nil || d.Feed != fn || d.Head != 1 || len(d.Sinks) != 1 || d.Sinks[0].Sink != sn {
			t.Fatalf("Describe(%q) = %+v, %v", s, d, err)
		}
	})
}

// FuzzKey holds ParseKey and Key.Validate to the key rule, refusals to a
// clean error naming "key" (which never repeats the key: it may be a
// customer's data), and an accepted key to a round trip through the oracle
// store's write and read paths, a put then a delete. pgfeed's
// TestKeysRoundTrip sends this corpus through PostgreSQL.
func FuzzKey(f *testing.F) {
	for _, s := range []string{
		"k", "user/42", "ключ", "with space", "tab\tand\nnewline", "😀", "\x7f", "\u2028", "a\u0301", "%s%d", `{"json":1}`,
		"", "a\x00b", "\x00", "a\xc3\x28", "\xed\xa0\x80", "\xff",
		strings.Repeat("k", feed.MaxKeyLen), strings.Repeat("k", feed.MaxKeyLen+1), strings.Repeat("é", feed.MaxKeyLen/2),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := keyRule(s)
		k, err := feed.ParseKey(s)
		if (err == nil) != want || (feed.Key(s).Validate() == nil) != want {
			t.Fatalf("ParseKey(%q) = %v; the rule says valid = %v", s, err, want)
		}
		if !want {
			wantCleanInvalid(t, err, "key")
			if len(s) > 3 && strings.Contains(err.Error(), s) {
				t.Fatalf("err = %q repeats the key", err)
			}
			return
		}
		ctx := context.Background()
		st, err := memfeed.New(memfeed.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []feed.Change{feed.Put(k, json.RawMessage(`{"a":1}`)), feed.Delete(k)} {
			res, err := st.WriteCommitted(ctx, "f", []feed.Change{c})
			if err != nil {
				t.Fatalf("write %q: %v", s, err)
			}
			b, err := st.ReadBatch(ctx, "f", res.First-1, feed.BatchLimit{Records: 10})
			if err != nil || len(b.Records) != 1 || b.Records[0].Key != k || (b.Records[0].Doc == nil) != c.Deleted() {
				t.Fatalf("read back %q: %+v, %v", s, b.Records, err)
			}
		}
	})
}
