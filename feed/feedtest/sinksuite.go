package feedtest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kairos-es/kairos/feed"
)

// SinkHarness is a sink as RunSink drives it.
type SinkHarness struct {
	// Sink is the sink under test, empty when handed over.
	Sink feed.Sink
	// Contents reads what the sink serves now, its published copy: the live
	// documents by key. RunSink compares documents with JSONEqual.
	Contents func(ctx context.Context) (map[feed.Key]json.RawMessage, error)
	// ConditionalOnSeq says the sink keeps the seq guard (feed.Sink's doc):
	// it never replaces a key's document with an older seq's, nor deletes it
	// for an older tombstone. RunSink then checks it; a sink that cannot
	// leaves it false and says so in its documentation.
	ConditionalOnSeq bool
	// RejectKey is a key the harness configured the sink to reject, whatever
	// its document, to test rejections; empty when the sink cannot be made to
	// reject.
	RejectKey feed.Key
}

// RunSink runs the sink conformance suite: newSink builds a fresh, empty sink
// for one subtest (against the real server, in its own index, table or key
// namespace), releasing it with t.Cleanup. Subtests run in parallel. The
// package doc lists what each subtest proves.
func RunSink(t *testing.T, newSink func(t *testing.T) SinkHarness) {
	t.Helper()
	run := func(name string, f func(t *testing.T, s *sinkEnv)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newSink(t)
			if h.Sink == nil || h.Contents == nil {
				t.Fatal("feedtest: the sink harness has no Sink or no Contents")
			}
			f(t, &sinkEnv{t: t, ctx: t.Context(), h: h})
		})
	}
	run("Upsert", sinkUpsert)
	run("Delete", sinkDelete)
	run("IdempotentReapply", sinkIdempotent)
	run("DeleteAbsent", sinkDeleteAbsent)
	run("ResyncInvisibleUntilPublish", sinkResyncPublish)
	run("ResyncTombstones", sinkResyncTombstones)
	run("AbortKeepsLive", sinkAbort)
	run("ConditionalOnSeq", sinkConditional)
	run("Rejection", sinkRejection)
	run("BadInput", sinkBadInput)
}

type sinkEnv struct {
	t   *testing.T
	ctx context.Context
	h   SinkHarness
}

func (s *sinkEnv) apply(what string, records ...feed.Record) {
	s.t.Helper()
	rej, err := s.h.Sink.Apply(s.ctx, records)
	if err != nil || len(rej) != 0 {
		s.t.Fatalf("%s: Apply = %v, %v; want no rejection and no error", what, rej, err)
	}
}

func (s *sinkEnv) open(g feed.Generation) feed.ResyncTarget {
	s.t.Helper()
	r, err := s.h.Sink.OpenResync(s.ctx, g)
	if err != nil {
		s.t.Fatalf("OpenResync(%d): %v", g, err)
	}
	return r
}

func (s *sinkEnv) applyTo(what string, r feed.ResyncTarget, records ...feed.Record) {
	s.t.Helper()
	rej, err := r.Apply(s.ctx, records)
	if err != nil || len(rej) != 0 {
		s.t.Fatalf("%s: resync Apply = %v, %v; want no rejection and no error", what, rej, err)
	}
}

// want fails t unless the sink serves exactly docs (key → JSON).
func (s *sinkEnv) want(what string, docs map[string]string) {
	s.t.Helper()
	got, err := s.h.Contents(s.ctx)
	if err != nil {
		s.t.Fatalf("%s: Contents: %v", what, err)
	}
	same := len(got) == len(docs)
	for k, d := range docs {
		if g, ok := got[feed.Key(k)]; !ok || !JSONEqual(g, json.RawMessage(d)) {
			same = false
		}
	}
	if !same {
		var b strings.Builder
		for k, d := range got {
			b.WriteString(" " + string(k) + "=" + string(d))
		}
		s.t.Errorf("%s: the sink serves {%s }, want %v", what, b.String(), docs)
	}
}

func sinkUpsert(t *testing.T, s *sinkEnv) {
	s.want("a new sink", map[string]string{})
	s.apply("two upserts", rec("a", 1, `{"v":1}`), rec("b/ü ñ", 2, `{"v":[1,2]}`))
	s.want("after two upserts", map[string]string{"a": `{"v":1}`, "b/ü ñ": `{"v":[1,2]}`})
	s.apply("an update", rec("a", 3, `{"v":2,"w":"x"}`))
	s.want("after an update", map[string]string{"a": `{"v":2,"w":"x"}`, "b/ü ñ": `{"v":[1,2]}`})
}

func sinkDelete(t *testing.T, s *sinkEnv) {
	s.apply("upserts", rec("a", 1, `1`), rec("b", 2, `2`))
	s.apply("a tombstone", rec("a", 3, ""))
	s.want("after a tombstone", map[string]string{"b": `2`})
	// A batch holds records of distinct keys, in seq order: a delete and a
	// put of other keys land together.
	s.apply("a mixed batch", rec("b", 4, ""), rec("c", 5, `3`))
	s.want("after a mixed batch", map[string]string{"c": `3`})
}

func sinkIdempotent(t *testing.T, s *sinkEnv) {
	batch := []feed.Record{rec("a", 1, `{"v":1}`), rec("b", 2, `{"v":2}`), rec("c", 3, "")}
	for range 3 {
		s.apply("the same batch again", batch...)
		s.want("after applying the batch again", map[string]string{"a": `{"v":1}`, "b": `{"v":2}`})
	}
}

func sinkDeleteAbsent(t *testing.T, s *sinkEnv) {
	s.apply("a tombstone of a key the sink never had", rec("never", 1, ""))
	s.want("after deleting an absent key", map[string]string{})
	r := s.open(1)
	s.applyTo("a tombstone of an absent key in a resync", r, rec("never", 2, ""))
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after publishing a resync of one tombstone", map[string]string{})
}

func sinkResyncPublish(t *testing.T, s *sinkEnv) {
	s.apply("the live copy", rec("a", 1, `"old a"`), rec("b", 2, `"old b"`))
	r := s.open(2)
	s.applyTo("the resync's first batch", r, rec("c", 3, `"c"`))
	s.applyTo("the resync's second batch", r, rec("a", 4, `"new a"`))
	s.want("while a resync is filled", map[string]string{"a": `"old a"`, "b": `"old b"`})
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after Publish (keys absent from the resync are gone)", map[string]string{"a": `"new a"`, "c": `"c"`})
	s.apply("an incremental batch after Publish", rec("d", 5, `"d"`))
	s.want("after an incremental batch", map[string]string{"a": `"new a"`, "c": `"c"`, "d": `"d"`})
}

func sinkResyncTombstones(t *testing.T, s *sinkEnv) {
	s.apply("the live copy", rec("live-only", 1, `1`))
	r := s.open(1)
	s.applyTo("a document", r, rec("a", 2, `2`), rec("b", 3, `3`))
	s.applyTo("its deletion, later in the stream", r, rec("a", 4, ""))
	s.applyTo("a tombstone of a key only the live copy has", r, rec("live-only", 5, ""))
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after publishing a resync with tombstones", map[string]string{"b": `3`})
}

func sinkAbort(t *testing.T, s *sinkEnv) {
	s.apply("the live copy", rec("a", 1, `"a"`))
	r := s.open(2)
	s.applyTo("a resync batch", r, rec("b", 2, `"b"`), rec("a", 3, ""))
	if err := r.Abort(s.ctx); err != nil {
		t.Fatalf("Abort: %v", err)
	}
	s.want("after Abort", map[string]string{"a": `"a"`})
	// A later resync starts empty: nothing of the aborted one leaks in.
	r = s.open(2)
	s.applyTo("a second resync", r, rec("c", 4, `"c"`))
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after publishing the resync that followed an abort", map[string]string{"c": `"c"`})
}

func sinkConditional(t *testing.T, s *sinkEnv) {
	if !s.h.ConditionalOnSeq {
		t.Skip("the sink does not make writes conditional on seq")
	}
	s.apply("a newer version", rec("a", 5, `"v5"`), rec("b", 6, `"v6"`))
	// A stale call from a worker that lost its lease.
	rej, err := s.h.Sink.Apply(s.ctx, []feed.Record{rec("a", 3, `"v3"`), rec("b", 4, "")})
	if err != nil || len(rej) != 0 {
		t.Fatalf("a stale batch: Apply = %v, %v; want it ignored without rejection or error", rej, err)
	}
	s.want("after a stale batch", map[string]string{"a": `"v5"`, "b": `"v6"`})
	s.apply("a newer version still", rec("a", 7, `"v7"`))
	s.want("after a newer batch", map[string]string{"a": `"v7"`, "b": `"v6"`})
}

func sinkRejection(t *testing.T, s *sinkEnv) {
	bad := s.h.RejectKey
	if bad == "" {
		t.Skip("the sink cannot be made to reject a record")
	}
	check := func(what string, rej []feed.Rejection, err error, seq feed.Seq) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: Apply: %v; a rejection is not an error", what, err)
		}
		if len(rej) != 1 || rej[0].Key != bad || rej[0].Seq != seq || rej[0].Reason == "" {
			t.Errorf("%s: rejections = %+v; want one for %s at seq %d with a reason", what, rej, bad, seq)
		}
	}
	rej, err := s.h.Sink.Apply(s.ctx, []feed.Record{rec("ok1", 1, `1`), {Key: bad, Seq: 2, Doc: doc(`{"any":"doc"}`)}, rec("ok2", 3, `3`)})
	check("a batch with the rejected key", rej, err, 2)
	s.want("after a batch with a rejection (the rest applied)", map[string]string{"ok1": `1`, "ok2": `3`})

	r := s.open(2)
	rej, err = r.Apply(s.ctx, []feed.Record{{Key: bad, Seq: 4, Doc: doc(`2`)}, rec("ok3", 5, `5`)})
	check("a resync batch with the rejected key", rej, err, 4)
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after a resync with a rejection", map[string]string{"ok3": `5`})
}

func sinkBadInput(t *testing.T, s *sinkEnv) {
	for _, g := range []feed.Generation{0, -1} {
		r, err := s.h.Sink.OpenResync(s.ctx, g)
		wantInvalid(t, "OpenResync of a generation below 1", err, "generation")
		if r != nil {
			_ = r.Abort(s.ctx)
		}
	}
}
