package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// migrated returns a configuration file over a fresh, migrated schema, and
// a feed store on it.
func migrated(t *testing.T) (cfg string, st *pgfeed.Store) {
	t.Helper()
	return migratedOn(t, pgtest.Schema(t))
}

// migratedOn is migrated for a schema the test named.
func migratedOn(t *testing.T, schema string) (cfg string, st *pgfeed.Store) {
	t.Helper()
	cfg = writeConfig(t, "database:\n  url: "+pgtest.URL()+"\n  schema: "+schema+"\n")
	if code, out, stderr := kairos(t, "migrate", "-c", cfg); code != exitOK {
		t.Fatalf("migrate = exit %d, %q, %q", code, out, stderr)
	}
	pool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	st, err := pgfeed.New(t.Context(), pool, pgfeed.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return cfg, st
}

func TestDescribe(t *testing.T) {
	cfg, st := migrated(t)
	g := golden(t, "describe", cfg, "<config>")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if code, out, _ := g.run("describe", "-c", cfg); code != exitOK || out != "no feeds yet\n" {
		t.Fatalf("describe of an empty schema = exit %d, %q", code, out)
	}
	if _, err := st.WriteCommitted(ctx, "orders", []feed.Change{feed.Put("a", []byte(`{}`)), feed.Put("b", []byte(`{}`)), feed.Delete("c")}); err != nil {
		t.Fatal(err)
	}
	id := feed.SinkID{Feed: "orders", Sink: "cache"}
	l, err := st.AcquireLease(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if err := st.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: 2},
		Parked: feed.ParkChange{Replace: true, Park: []feed.ParkedRecord{{Key: "b", Seq: 2, Reason: "too big", ParkedAt: time.Now()}}}}); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := g.run("describe", "orders", "-c", cfg)
	if code != exitOK {
		t.Fatalf("describe = exit %d, %q", code, stderr)
	}
	for _, want := range []string{"feed orders  generation 1  head 3  oldest tombstone ", "SINK", "cache", "1/2", string(l.Holder()), "left)", "ago"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe's table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("colour codes in output that is not a terminal:\n%q", out)
	}
	code, out, _ = g.run("describe", "-o", "json", "-c", cfg)
	var views []feedView
	if err := json.Unmarshal([]byte(out), &views); code != exitOK || err != nil {
		t.Fatalf("describe -o json = exit %d, %v:\n%s", code, err, out)
	}
	if len(views) != 1 || len(views[0].Sinks) != 1 {
		t.Fatalf("json views = %+v", views)
	}
	s := views[0].Sinks[0]
	if views[0].Head != 3 || s.CursorSeq != 2 || s.Pending != 1 || s.Parked != 1 || s.Resyncing || s.LeaseHolder != string(l.Holder()) ||
		s.LeaseExpiresInSeconds == nil || *s.LeaseExpiresInSeconds <= 0 || *s.LeaseExpiresInSeconds > feed.DefaultLeaseTTL.Seconds()+1 {
		t.Fatalf("json sink = %+v", s)
	}
	if v := views[0]; v.OldestTombstoneAt == nil || v.OldestTombstoneAgeSeconds == nil || *v.OldestTombstoneAgeSeconds < 0 || *v.OldestTombstoneAgeSeconds > 30 {
		t.Fatalf("json feed = %+v; want c's tombstone, made within the test", v)
	}
	code, out, _ = g.run("describe", "orders", "-o", "yaml", "-c", cfg)
	var yv []feedView
	if err := yaml.Unmarshal([]byte(out), &yv); code != exitOK || err != nil || len(yv) != 1 || yv[0].Sinks[0].Pending != 1 {
		t.Fatalf("describe -o yaml = exit %d, %v:\n%s", code, err, out)
	}
	if code, _, stderr := g.run("describe", "nosuch", "-c", cfg); code != exitFailure || !strings.Contains(stderr, "nosuch") {
		t.Errorf("describe of an unknown feed = exit %d, %q", code, stderr)
	}
	if code, _, _ := g.run("describe", "-o", "xml", "-c", cfg); code != exitUsage {
		t.Errorf("describe -o xml = exit %d, want %d", code, exitUsage)
	}
	if code, _, _ := g.run("describe", "a b", "-c", cfg); code != exitUsage {
		t.Errorf("describe of a bad feed name = exit %d, want %d", code, exitUsage)
	}
}

// describe on a schema never migrated says so and how to fix it.
func TestDescribeNotMigrated(t *testing.T) {
	cfg := writeConfig(t, "database:\n  url: "+pgtest.URL()+"\n  schema: "+pgtest.Schema(t)+"\n")
	code, _, stderr := kairos(t, "describe", "-c", cfg)
	if code != exitFailure || !strings.Contains(stderr, "kairos migrate") {
		t.Fatalf("describe before migrate = exit %d, %q", code, stderr)
	}
}

func TestAge(t *testing.T) {
	for sec, want := range map[float64]string{0: "0s", 12.4: "12s", 184: "3m04s", 7500: "2h05m", 3*86400 + 4*3600: "3d4h"} {
		if got := age(sec); got != want {
			t.Errorf("age(%v) = %q, want %q", sec, got, want)
		}
	}
}

// TestDescribeAndTraceConcurrentMode: in the concurrent write mode describe
// shows the mode, the writes waiting for the sealer and the sealer's lease,
// and trace a key's write that no sink can see yet, so an operator can tell
// "not sealed" from "not sent".
func TestDescribeAndTraceConcurrentMode(t *testing.T) {
	cfg, st := migrated(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := st.SetWriteMode(ctx, "outbox", feed.WriteConcurrent); err != nil {
		t.Fatal(err)
	}
	if _, err := st.WriteCommitted(ctx, "outbox", []feed.Change{feed.Put("a", []byte(`{"v":1}`))}); err != nil {
		t.Fatal(err)
	}
	if n, err := st.SealRound(ctx, "outbox"); err != nil || n != 1 {
		t.Fatalf("SealRound = %d, %v; want 1", n, err)
	}
	if _, err := st.WriteCommitted(ctx, "outbox", []feed.Change{feed.Put("a", []byte(`{"v":2}`)), feed.Put("b", []byte(`{"v":1}`)), feed.Delete("c")}); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := kairos(t, "describe", "outbox", "-c", cfg)
	if code != exitOK || !strings.Contains(out, "concurrent write mode  unsealed 3  sealer none") {
		t.Fatalf("describe = exit %d, %q, %q; want the mode, 3 unsealed and no sealer", code, out, stderr)
	}
	code, out, _ = kairos(t, "describe", "-o", "json", "-c", cfg)
	var views []feedView
	if err := json.Unmarshal([]byte(out), &views); code != exitOK || err != nil || len(views) != 1 ||
		views[0].Mode != "concurrent" || views[0].Unsealed != 3 || views[0].Head != 1 || views[0].SealerHolder != "" {
		t.Fatalf("describe -o json = exit %d, %v: %s", code, err, out)
	}
	code, out, _ = kairos(t, "trace", "outbox", "a", "-c", cfg)
	if code != exitOK || !strings.Contains(out, `key "a" at seq 1`) || !strings.Contains(out, "a newer write waits for the sealer") || !strings.Contains(out, `{"v": 2}`) {
		t.Fatalf("trace of a sealed key with a newer unsealed write = exit %d:\n%s", code, out)
	}
	code, out, _ = kairos(t, "trace", "outbox", "b", "-c", cfg)
	if code != exitOK || !strings.Contains(out, `key "b" has no sealed row yet`) {
		t.Fatalf("trace of a key never sealed = exit %d:\n%s", code, out)
	}
	code, out, _ = kairos(t, "trace", "outbox", "c", "-o", "json", "-c", cfg)
	var tv traceView
	if err := json.Unmarshal([]byte(out), &tv); code != exitOK || err != nil || !tv.Unsealed || !tv.UnsealedDeleted || tv.Found {
		t.Fatalf("trace -o json of an unsealed delete = exit %d, %v: %s", code, err, out)
	}
	// A sealer that holds its lease shows in describe.
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- st.RunSealer(sctx, "outbox") }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, out, _ = kairos(t, "describe", "outbox", "-o", "json", "-c", cfg)
		views = nil
		if err := json.Unmarshal([]byte(out), &views); err == nil && len(views) == 1 && views[0].SealerHolder != "" && views[0].Unsealed == 0 {
			if s := views[0].SealerExpiresInSeconds; s == nil || *s <= 0 {
				t.Fatalf("the sealer's lease shows no time left: %s", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("describe never showed the running sealer with nothing unsealed: exit %d, %s", code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("RunSealer: %v", err)
	}
}
