package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

func TestTrace(t *testing.T) {
	cfg, st := migrated(t)
	g := golden(t, "trace", cfg, "<config>")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, k := range []feed.Key{"a", "b", "k"} {
		if _, err := st.WriteCommitted(ctx, "orders", []feed.Change{feed.Put(k, []byte(`{"name":"`+string(k)+`"}`))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct {
		sink feed.SinkName
		seq  feed.Seq
		park []feed.ParkedRecord
	}{{"cache", 3, nil}, {"search", 1, nil}, {"table", 3, []feed.ParkedRecord{{Key: "k", Seq: 3, Reason: "column name: too long", ParkedAt: time.Now()}}}} {
		id := feed.SinkID{Feed: "orders", Sink: s.sink}
		l, err := st.AcquireLease(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: s.seq}, Parked: feed.ParkChange{Replace: true, Park: s.park}}); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	code, out, stderr := g.run("trace", "orders", "k", "-c", cfg)
	if code != exitOK {
		t.Fatalf("trace = exit %d, %q", code, stderr)
	}
	for _, want := range []string{`key "k" at seq 3`, `{"name": "k"}`, "cache   1/3     applied", "search  1/1     pending  1 row ahead of it", "table   1/3     parked   column name: too long"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace's table lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = g.run("trace", "orders", "k", "-o", "json", "-c", cfg)
	var v traceView
	if err := json.Unmarshal([]byte(out), &v); code != exitOK || err != nil || !v.Found || v.Seq != 3 || len(v.Sinks) != 3 || v.Sinks[2].State != "parked" {
		t.Fatalf("trace -o json = exit %d, %v, %s", code, err, out)
	}
	if code, out, _ := g.run("trace", "orders", "nope", "-c", cfg); code != exitOK || !strings.Contains(out, "has no row for key \"nope\"") || !strings.Contains(out, "absent") {
		t.Fatalf("trace of an absent key = exit %d, %q", code, out)
	}
	if code, _, stderr := g.run("trace", "nosuch", "k", "-c", cfg); code != exitFailure || !strings.Contains(stderr, "unknown feed") {
		t.Fatalf("trace of an unknown feed = exit %d, %q", code, stderr)
	}
	if code, _, _ := g.run("trace", "orders", "-c", cfg); code != exitUsage {
		t.Fatalf("trace without a key = exit %d", code)
	}
}
