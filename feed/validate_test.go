package feed_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// wantInvalid requires err to be an *InvalidError naming field.
func wantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	if !errors.Is(err, feed.ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	var inv *feed.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("err = %T, want *InvalidError", err)
	}
	if inv.Field != field {
		t.Fatalf("field = %q, want %q (err: %v)", inv.Field, field, err)
	}
}

func TestNamesRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"too long", strings.Repeat("a", feed.MaxNameLen+1)},
		{"NUL", "ord\x00ers"},
		{"invalid UTF-8", "ord\xffers"},
		{"space", "my orders"},
		{"slash", "orders/eu"},
		{"leading dash", "-orders"},
		{"leading dot", ".orders"},
		{"non-ASCII letter", "ordérs"},
		{"quote", `orders"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := feed.ParseFeedName(tc.in)
			wantInvalid(t, err, "feed name")
			_, err = feed.ParseSinkName(tc.in)
			wantInvalid(t, err, "sink name")
			wantInvalid(t, feed.SinkID{Feed: "ok", Sink: feed.SinkName(tc.in)}.Validate(), "sink name")
		})
	}
	for _, ok := range []string{"a", "orders", "orders.v2", "eu-west:orders_1", strings.Repeat("z", feed.MaxNameLen)} {
		if _, err := feed.ParseFeedName(ok); err != nil {
			t.Errorf("ParseFeedName(%q) = %v, want nil", ok, err)
		}
	}
}

func TestKeysRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"too long", strings.Repeat("k", feed.MaxKeyLen+1)},
		{"NUL", "a\x00b"},
		{"invalid UTF-8", "a\xc3\x28"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := feed.ParseKey(tc.in)
			wantInvalid(t, err, "key")
		})
	}
	for _, ok := range []string{"k", "user/42", "ключ", "with space", strings.Repeat("k", feed.MaxKeyLen)} {
		if _, err := feed.ParseKey(ok); err != nil {
			t.Errorf("ParseKey(%q) = %v, want nil", ok, err)
		}
	}
}

func TestPrepareChanges(t *testing.T) {
	t.Parallel()
	_, err := feed.PrepareChanges([]feed.Change{feed.Put("a", json.RawMessage(`1`)), feed.Put("", json.RawMessage(`1`))})
	wantInvalid(t, err, "changes[1].key")
	_, err = feed.PrepareChanges([]feed.Change{feed.Delete("a"), feed.Put("b", json.RawMessage(`{`))})
	wantInvalid(t, err, "changes[1].doc")
	// A nil document is not a deletion, whichever way it was built: only
	// Delete writes a tombstone.
	for name, nilDoc := range map[string]feed.Change{
		"Put with nil":           feed.Put("k", nil),
		"a Change with no doc":   {Key: "k"},
		"a nil json.RawMessage":  feed.Put("k", json.RawMessage(nil)),
		"a deletion given a doc": func() feed.Change { c := feed.Delete("k"); c.Doc = json.RawMessage(`1`); return c }(),
	} {
		_, err = feed.PrepareChanges([]feed.Change{feed.Put("a", json.RawMessage(`1`)), feed.Delete("b"), feed.Put("c", json.RawMessage(`2`)), nilDoc})
		wantInvalid(t, err, "changes[3].doc")
		if !strings.Contains(err.Error(), "feed.Delete") && !strings.Contains(err.Error(), "deletion") {
			t.Errorf("%s: %v does not say how to delete", name, err)
		}
	}
	if !feed.Delete("k").Deleted() || feed.Put("k", json.RawMessage(`1`)).Deleted() {
		t.Error("Deleted() must report exactly the changes Delete made")
	}

	got, err := feed.PrepareChanges([]feed.Change{
		feed.Put("a", json.RawMessage(`1`)),
		feed.Put("b", json.RawMessage(`2`)),
		feed.Delete("a"),
		feed.Put("c", json.RawMessage(`3`)),
		feed.Put("b", json.RawMessage(`4`)),
	})
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, c := range got {
		s = append(s, string(c.Key)+"="+string(c.Doc))
	}
	if want := "a=,c=3,b=4"; strings.Join(s, ",") != want {
		t.Fatalf("compacted = %s, want %s", strings.Join(s, ","), want)
	}
}

func TestLeaseOptions(t *testing.T) {
	t.Parallel()
	def, err := feed.LeaseOptions{}.Resolve("lease")
	if err != nil {
		t.Fatal(err)
	}
	if def.TTL != 30*time.Second || def.Heartbeat != 6*time.Second || def.Margin != 10*time.Second {
		t.Fatalf("defaults = %v", def)
	}
	if 3*def.Heartbeat+def.Margin > def.TTL {
		t.Fatalf("defaults do not tolerate one failed renewal: %v", def)
	}
	if got, _ := (feed.LeaseOptions{TTL: 10 * time.Second}).Resolve("lease"); got.Heartbeat != 2*time.Second || got.Margin != 10*time.Second/3 {
		t.Fatalf("derived from ttl = %v", got)
	}
	for _, tc := range []struct {
		name  string
		opts  feed.LeaseOptions
		field string
	}{
		{"negative ttl", feed.LeaseOptions{TTL: -time.Second}, "lease.ttl"},
		{"negative heartbeat", feed.LeaseOptions{Heartbeat: -1}, "lease.heartbeat"},
		{"negative margin", feed.LeaseOptions{Margin: -1}, "lease.margin"},
		{"heartbeat = ttl", feed.LeaseOptions{TTL: time.Second, Heartbeat: time.Second}, "lease.heartbeat"},
		{"heartbeat > ttl", feed.LeaseOptions{TTL: time.Second, Heartbeat: 2 * time.Second}, "lease.heartbeat"},
		{"heartbeat + margin = ttl", feed.LeaseOptions{TTL: 3 * time.Second, Heartbeat: time.Second, Margin: 2 * time.Second}, "lease.margin"},
		{"heartbeat + margin > ttl", feed.LeaseOptions{TTL: 3 * time.Second, Heartbeat: 2 * time.Second, Margin: 2 * time.Second}, "lease.margin"},
		{"ttl too short to derive", feed.LeaseOptions{TTL: 2}, "lease.heartbeat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.opts.Resolve("lease")
			wantInvalid(t, err, tc.field)
		})
	}
}

func TestCursorMoveRefused(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ok := feed.CursorMove{ID: feed.SinkID{Feed: "f", Sink: "s"}, Holder: "h", Next: feed.Cursor{Generation: 1, Seq: 0}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	park := func(p feed.ParkedRecord) feed.CursorMove {
		m := ok
		m.Parked.Park = []feed.ParkedRecord{p}
		return m
	}
	for _, tc := range []struct {
		name  string
		move  feed.CursorMove
		field string
	}{
		{"bad feed", feed.CursorMove{ID: feed.SinkID{Feed: "", Sink: "s"}, Holder: "h", Next: ok.Next}, "feed name"},
		{"no holder", feed.CursorMove{ID: ok.ID, Next: ok.Next}, "move.holder"},
		{"generation 0", feed.CursorMove{ID: ok.ID, Holder: "h", Next: feed.Cursor{Seq: 3}}, "move.next.generation"},
		{"negative seq", feed.CursorMove{ID: ok.ID, Holder: "h", Next: feed.Cursor{Generation: 1, Seq: -1}}, "move.next.seq"},
		{"expected generation 0", feed.CursorMove{ID: ok.ID, Holder: "h", Expected: feed.Cursor{Seq: 1}, Next: ok.Next}, "move.expected.generation"},
		{"bad unpark key", feed.CursorMove{ID: ok.ID, Holder: "h", Next: ok.Next, Parked: feed.ParkChange{Unpark: []feed.Key{""}}}, "move.parked.unpark[0]"},
		{"empty reason", park(feed.ParkedRecord{Key: "k", Seq: 1, ParkedAt: now}), "move.parked.park[0].reason"},
		{"long reason", park(feed.ParkedRecord{Key: "k", Seq: 1, Reason: strings.Repeat("x", feed.MaxReasonLen+1), ParkedAt: now}), "move.parked.park[0].reason"},
		{"NUL reason", park(feed.ParkedRecord{Key: "k", Seq: 1, Reason: "a\x00", ParkedAt: now}), "move.parked.park[0].reason"},
		{"park seq 0", park(feed.ParkedRecord{Key: "k", Reason: "r", ParkedAt: now}), "move.parked.park[0].seq"},
		{"no parked_at", park(feed.ParkedRecord{Key: "k", Seq: 1, Reason: "r"}), "move.parked.park[0].parked_at"},
	} {
		t.Run(tc.name, func(t *testing.T) { wantInvalid(t, tc.move.Validate(), tc.field) })
	}
}

func TestCleanReason(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", feed.MaxReasonLen)
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "plain", "plain"},
		{"empty", "", "rejected by the sink (no reason given)"},
		{"only whitespace and controls", " \n\t\r\n ", "rejected by the sink (no reason given)"},
		{"trailing newline", "mapping error\n", "mapping error"},
		{"trailing whitespace and newlines", "mapping error \t\r\n\n  ", "mapping error"},
		{"leading whitespace", "\n  mapping error", "mapping error"},
		{"a newline inside", "line one\nline two", "line one line two"},
		{"a run of controls is one space", "a\r\n\t\x00\x1bb", "a b"},
		{"spaces beside a control stay", "a \n b", "a   b"},
		{"NUL", "nul\x00inside", "nul inside"},
		{"DEL and C1 controls", "a\x7fb\u0085c\u009bd", "a b c d"},
		{"line and paragraph separators", "a\u2028b\u2029c", "a b c"},
		{"invalid UTF-8", "bad\xffutf8", "bad\uFFFDutf8"},
		{"tabs inside", "col1\tcol2", "col1 col2"},
		{"non-Latin text is kept", "ключ ✓ 😀", "ключ ✓ 😀"},
		{"cut at a character boundary", "x" + long, "x" + strings.Repeat("é", feed.MaxReasonLen/2-1)},
		{"a collapsed space does not pass the limit", strings.Repeat("x", feed.MaxReasonLen-1) + "\nyz", strings.Repeat("x", feed.MaxReasonLen-1)},
		{"cut, then trimmed", strings.Repeat("x", feed.MaxReasonLen-1) + " y", strings.Repeat("x", feed.MaxReasonLen-1)},
	} {
		if got := feed.CleanReason(tc.in); got != tc.want {
			t.Errorf("%s: CleanReason(%.40q) = %.60q, want %.60q", tc.name, tc.in, got, tc.want)
		}
	}
	for _, in := range []string{"", "plain", "nul\x00inside", "bad\xffutf8", long, "a\nb", strings.Repeat("\n", 3000)} {
		out := feed.CleanReason(in)
		m := feed.CursorMove{ID: feed.SinkID{Feed: "f", Sink: "s"}, Holder: "h", Next: feed.Cursor{Generation: 1},
			Parked: feed.ParkChange{Park: []feed.ParkedRecord{{Key: "k", Seq: 1, Reason: out, ParkedAt: time.Now()}}}}
		if err := m.Validate(); err != nil {
			t.Errorf("CleanReason(%q) = %q, still refused: %v", in, out, err)
		}
	}
}

func TestErrorsMatch(t *testing.T) {
	t.Parallel()
	cause := errors.New("connection reset")
	id := feed.SinkID{Feed: "f", Sink: "s"}
	for _, tc := range []struct {
		err  error
		want error
	}{
		{&feed.LeaseHeldError{ID: id}, feed.ErrLeaseHeld},
		{&feed.LeaseLostError{ID: id, Err: cause}, feed.ErrLeaseLost},
		{&feed.CursorSupersededError{ID: id}, feed.ErrCursorSuperseded},
		{feed.Unreadable("reading", cause), feed.ErrUnreadable},
		{feed.WriteFailed("writing", cause), feed.ErrWriteFailed},
		{feed.Invalid("x", "bad"), feed.ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%v does not match %v", tc.err, tc.want)
		}
	}
	if !errors.Is(feed.Unreadable("reading", cause), cause) || !errors.Is(feed.WriteFailed("w", cause), cause) {
		t.Error("infrastructure errors must wrap their cause")
	}
	// A condition passes through the wrappers unchanged.
	lost := &feed.LeaseLostError{ID: id}
	if feed.WriteFailed("w", lost) != error(lost) {
		t.Error("WriteFailed must not hide a lost lease")
	}
}

// TestLeaseHeldErrorSaysWho: a refusal's message names the holder and when
// its lease can lapse, or that it lasts with its session, when the store said.
func TestLeaseHeldErrorSaysWho(t *testing.T) {
	t.Parallel()
	id := feed.SinkID{Feed: "f", Sink: "s"}
	at := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, tc := range []struct {
		err  *feed.LeaseHeldError
		want []string
	}{
		{&feed.LeaseHeldError{ID: id}, []string{`feed "f" sink "s": lease held by another worker`}},
		{&feed.LeaseHeldError{ID: id, Holder: "pg-row:ab", ExpiresAt: at}, []string{"holder pg-row:ab", "lapsing at 2031-05-06T07:08:09Z"}},
		{&feed.LeaseHeldError{ID: id, Holder: "pg-advisory:cd"}, []string{"holder pg-advisory:cd", "session"}},
	} {
		msg := tc.err.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%q does not say %q", msg, w)
			}
		}
	}
}
