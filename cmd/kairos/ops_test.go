package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

func TestParkedListAndRetry(t *testing.T) {
	cfg, st := migrated(t)
	g := golden(t, "parked", cfg, "<config>")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := st.WriteCommitted(ctx, "orders", []feed.Change{feed.Put("a", []byte(`{}`)), feed.Put("b b", []byte(`{}`)), feed.Put("c", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	id := feed.SinkID{Feed: "orders", Sink: "cache"}
	l, err := st.AcquireLease(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := st.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: 3},
		Parked: feed.ParkChange{Replace: true, Park: []feed.ParkedRecord{{Key: "b b", Seq: 2, Reason: "too big", ParkedAt: now}, {Key: "c", Seq: 3, Reason: "bad field", ParkedAt: now}}}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := g.run("parked", "list", "orders", "cache", "-c", cfg)
	if code != exitOK || !strings.Contains(out, "KEY") || !strings.Contains(out, "b b") || !strings.Contains(out, "too big") || !strings.Contains(out, "bad field") {
		t.Fatalf("parked list = exit %d, %q, %q", code, out, stderr)
	}
	code, out, _ = g.run("parked", "list", "orders", "cache", "-o", "json", "-c", cfg)
	var pv []parkedView
	if err := json.Unmarshal([]byte(out), &pv); code != exitOK || err != nil || len(pv) != 2 || pv[0].Key != "b b" || pv[0].Seq != 2 {
		t.Fatalf("parked list -o json = exit %d, %v, %q", code, err, out)
	}
	// One key parked, one not: the parked one is retried, the other reported.
	code, out, stderr = g.run("parked", "retry", "orders", "cache", "b b", "a", "-c", cfg)
	if code != exitFailure || !strings.Contains(out, `retried "b b"`) || !strings.Contains(out, `not parked for orders/cache: "a"`) || !strings.Contains(stderr, "1 of the keys given was not parked") {
		t.Fatalf("parked retry = exit %d, %q, %q", code, out, stderr)
	}
	if head, err := st.Head(ctx, "orders"); err != nil || head != 4 {
		t.Fatalf("after a retry the head is %d, %v; want the key restamped at 4", head, err)
	}
	if code, out, _ = g.run("parked", "retry", "orders", "cache", "--all", "-c", cfg); code != exitOK || !strings.Contains(out, "1 retried, 0 not parked") {
		t.Fatalf("parked retry --all = exit %d, %q", code, out)
	}
	if code, out, _ = g.run("parked", "list", "orders", "cache", "-c", cfg); code != exitOK || out != "nothing parked for orders/cache\n" {
		t.Fatalf("parked list after retries = exit %d, %q", code, out)
	}
	for _, args := range [][]string{{"parked", "retry", "orders", "cache"}, {"parked", "retry", "orders", "cache", "k", "--all"}, {"parked", "list", "orders"}, {"parked", "list", "orders", "a b"}} {
		if code, _, _ := g.run(append(args, "-c", cfg)...); code != exitUsage {
			t.Errorf("kairos %v = exit %d, want %d", args, code, exitUsage)
		}
	}
}

func TestSinkRemoveRefusedWhileLeased(t *testing.T) {
	cfg, st := migrated(t)
	g := golden(t, "sink-remove", cfg, "<config>")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	id := feed.SinkID{Feed: "orders", Sink: "cache"}
	l, err := st.AcquireLease(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	code, _, stderr := g.run("sink", "remove", "orders", "cache", "-c", cfg)
	if code != exitLeased || !strings.Contains(stderr, string(l.Holder())) {
		t.Fatalf("sink remove while leased = exit %d, %q; want %d naming the holder", code, stderr, exitLeased)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := g.run("sink", "remove", "orders", "cache", "-c", cfg); code != exitOK || out != "removed orders/cache\n" {
		t.Fatalf("sink remove = exit %d, %q, %q", code, out, stderr)
	}
	if code, _, stderr := g.run("sink", "remove", "orders", "cache", "-c", cfg); code != exitFailure || !strings.Contains(stderr, "not registered") {
		t.Fatalf("a second sink remove = exit %d, %q", code, stderr)
	}
}

func TestCollectSaysWhatHoldsBack(t *testing.T) {
	cfg, st := migrated(t)
	g := golden(t, "collect", cfg, "<config>")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if code, out, stderr := g.run("collect", "orders", "-c", cfg); code != exitFailure || out != "" || !strings.Contains(stderr, "unknown feed") {
		t.Fatalf("collect of an unknown feed = exit %d, %q, %q; want it refused before collecting", code, out, stderr)
	}
	if _, err := st.WriteCommitted(ctx, "orders", []feed.Change{feed.Put("a", []byte(`{}`)), feed.Put("b", []byte(`{}`))}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.WriteCommitted(ctx, "orders", []feed.Change{feed.Delete("a"), feed.Delete("b")}); err != nil {
		t.Fatal(err)
	}
	// fast passed seq 3 (a's tombstone), slow only seq 2: b's tombstone at 4
	// is above both, a's is held back by slow.
	for _, s := range []struct {
		sink feed.SinkName
		seq  feed.Seq
	}{{"fast", 3}, {"slow", 2}} {
		id := feed.SinkID{Feed: "orders", Sink: s.sink}
		l, err := st.AcquireLease(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: s.seq}}); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	code, out, stderr := g.run("collect", "orders", "-c", cfg)
	if code != exitOK || !strings.Contains(out, "collected 0 tombstones") || !strings.Contains(out, "slow holds back tombstones above seq 2") {
		t.Fatalf("collect = exit %d, %q, %q", code, out, stderr)
	}
	if err := removeAndCollect(ctx, t, g, cfg, "slow"); err != nil {
		t.Fatal(err)
	}
}

// removeAndCollect drops sink and collects again: the tombstone it held
// back goes.
func removeAndCollect(ctx context.Context, t *testing.T, g *transcript, cfg string, sink string) error {
	t.Helper()
	if code, _, stderr := g.run("sink", "remove", "orders", sink, "-c", cfg); code != exitOK {
		t.Fatalf("sink remove = exit %d, %q", code, stderr)
	}
	code, out, stderr := g.run("collect", "orders", "-c", cfg)
	if code != exitOK || !strings.Contains(out, "collected 1 tombstone\n") || !strings.Contains(out, "fast holds back tombstones above seq 3") {
		t.Fatalf("collect after removing %s = exit %d, %q, %q", sink, code, out, stderr)
	}
	return ctx.Err()
}
