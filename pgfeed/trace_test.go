package pgfeed_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

// Trace tells, per sink, each state a key can be in: applied, pending (with
// the rows ahead of it), parked (this version), resyncing, and absent.
func TestTraceKey(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	s := newStore(t, d, pgfeed.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := s.Trace(ctx, "orders", "k"); !errors.Is(err, feed.ErrUnknownFeed) {
		t.Fatalf("Trace of an unknown feed = %v", err)
	}
	// seqs: a=1, b=2, c=3, k=4, d=5
	for _, k := range []feed.Key{"a", "b", "c", "k", "d"} {
		if _, err := s.WriteCommitted(ctx, "orders", []feed.Change{feed.Put(k, []byte(`{"v":1}`))}); err != nil {
			t.Fatal(err)
		}
	}
	move := func(sink feed.SinkName, seq feed.Seq, park ...feed.ParkedRecord) {
		id := feed.SinkID{Feed: "orders", Sink: sink}
		l, err := s.AcquireLease(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		if seq == 0 {
			return // registered, never resynced
		}
		if err := s.CASCursor(ctx, feed.CursorMove{ID: id, Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: seq}, Parked: feed.ParkChange{Replace: true, Park: park}}); err != nil {
			t.Fatal(err)
		}
	}
	move("applied", 5)
	move("behind", 1)
	move("parked", 5, feed.ParkedRecord{Key: "k", Seq: 4, Reason: "too big", ParkedAt: time.Now()})
	move("fresh", 0)
	tr, err := s.Trace(ctx, "orders", "k")
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Found || tr.Seq != 4 || !feedtest.JSONEqual(tr.Doc, []byte(`{"v":1}`)) || tr.Head != 5 || tr.Generation != 1 || len(tr.Sinks) != 4 {
		t.Fatalf("trace = %+v", tr)
	}
	want := map[feed.SinkName]pgfeed.KeyState{"applied": pgfeed.KeyApplied, "behind": pgfeed.KeyPending, "parked": pgfeed.KeyParked, "fresh": pgfeed.KeyResyncing}
	for _, st := range tr.Sinks {
		if st.State != want[st.Sink] {
			t.Errorf("sink %s: state %s, want %s", st.Sink, st.State, want[st.Sink])
		}
		switch st.Sink {
		case "behind":
			if st.Ahead != 2 { // b and c come before k
				t.Errorf("behind: %d rows ahead, want 2", st.Ahead)
			}
		case "parked":
			if st.Parked == nil || st.Parked.Reason != "too big" {
				t.Errorf("parked: %+v", st.Parked)
			}
		}
	}
	// A newer write overtakes the parked version: the sink owes it again.
	if _, err := s.WriteCommitted(ctx, "orders", []feed.Change{feed.Delete("k")}); err != nil {
		t.Fatal(err)
	}
	tr, err = s.Trace(ctx, "orders", "k")
	if err != nil || !tr.Found || tr.Doc != nil || tr.Seq != 6 {
		t.Fatalf("trace after a delete = %+v, %v", tr, err)
	}
	for _, st := range tr.Sinks {
		if st.Sink == "parked" && (st.State != pgfeed.KeyPending || st.Parked == nil || st.Ahead != 0) {
			t.Errorf("parked sink after a newer write: %+v", st)
		}
		if st.Sink == "applied" && st.State != pgfeed.KeyPending {
			t.Errorf("applied sink after a newer write: %+v", st)
		}
	}
	tr, err = s.Trace(ctx, "orders", "never")
	if err != nil || tr.Found || len(tr.Sinks) != 4 {
		t.Fatalf("trace of a key never written = %+v, %v", tr, err)
	}
	for _, st := range tr.Sinks {
		if st.State != pgfeed.KeyAbsent {
			t.Errorf("sink %s of a key never written: %s", st.Sink, st.State)
		}
	}
}
