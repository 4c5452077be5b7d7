package feedtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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
	// AtomicPublish says ResyncTarget.Publish swaps the fresh copy in at once
	// (feed.ResyncTarget's doc). RunSink then reads Contents in a loop while
	// Publish runs and fails on a mix of the two copies or an empty one; a
	// sink that rebuilds in place leaves it false and says so in its
	// documentation.
	AtomicPublish bool
	// MaxDocumentBytes is the largest document, in bytes of its JSON, that
	// the sink stores; 0 when it has no limit of its own. RunSink stores 1 MiB
	// documents only when the limit allows them, and, when the limit is set
	// and at most 16 MiB, stores a document of exactly this size and wants one
	// a byte larger back as a rejection of that record alone, the rest of its
	// batch applied.
	MaxDocumentBytes int
	// Fault makes the sink's server unreachable for this sink (its
	// connections closed, its address pointed at a closed port, its HTTP
	// receiver answering 503 or dropping connections) until restore is
	// called. RunSink then wants Apply, a resync's Apply and Publish to
	// return an error, never a rejection, and the same batch applied again
	// after restore to leave everything in place. Each call under the fault
	// is bounded (a timeout is the error it wants), and RunSink calls restore
	// once, also when the subtest fails first. nil skips that subtest.
	Fault func(t *testing.T) (restore func())
	// Reopen returns a new sink over the same target, as after a process
	// restart, so RunSink can check that OpenResync for a generation a crashed
	// resync left half-filled starts clean. RunSink also races Apply calls of
	// Sink and of a reopened sink, as a stale worker and its rival in two
	// processes would. nil: RunSink uses Sink again.
	Reopen func(t *testing.T) feed.Sink
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
			if h.MaxDocumentBytes < 0 {
				t.Fatalf("feedtest: the sink harness's MaxDocumentBytes is %d; 0 means no limit", h.MaxDocumentBytes)
			}
			f(t, &sinkEnv{t: t, ctx: t.Context(), h: h})
		})
	}
	run("Upsert", sinkUpsert)
	run("Delete", sinkDelete)
	run("IdempotentReapply", sinkIdempotent)
	run("DeleteAbsent", sinkDeleteAbsent)
	run("AwkwardKeys", sinkAwkwardKeys)
	run("Documents", sinkDocuments)
	run("NumericEdges", sinkNumericEdges)
	run("OversizedDocument", sinkOversized)
	run("FaultIsError", sinkFault)
	run("ResyncInvisibleUntilPublish", sinkResyncPublish)
	run("PublishAtomic", sinkPublishAtomic)
	run("ResyncTombstones", sinkResyncTombstones)
	run("AbortKeepsLive", sinkAbort)
	run("ResyncAfterCrash", sinkResyncAfterCrash)
	run("ConditionalOnSeq", sinkConditional)
	run("ConditionalOnSeqAfterDelete", sinkConditionalAfterDelete)
	run("ConcurrentApply", sinkConcurrentApply)
	run("StaleGenerationAfterPublish", sinkStaleGeneration)
	run("StaleGenerationAfterEmptyPublish", sinkStaleGenerationEmpty)
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
	if diff := contentsDiff(got, docs); diff != "" {
		s.t.Errorf("%s: the sink serves %d keys, want %d:%s", what, len(got), len(docs), diff)
	}
}

// contentsDiff lists how got differs from want (key → JSON), "" when it
// does not; documents are cut short so a 1 MiB one does not flood the log.
func contentsDiff(got map[feed.Key]json.RawMessage, want map[string]string) string {
	var lines []string
	for k, d := range want {
		if g, ok := got[feed.Key(k)]; !ok {
			lines = append(lines, fmt.Sprintf("\n\tmissing %q (want %s)", k, excerpt(d)))
		} else if !JSONEqual(g, json.RawMessage(d)) {
			lines = append(lines, fmt.Sprintf("\n\t%q is %s, want %s", k, excerpt(string(g)), excerpt(d)))
		}
	}
	for k, g := range got {
		if _, ok := want[string(k)]; !ok {
			lines = append(lines, fmt.Sprintf("\n\textra %q = %s", k, excerpt(string(g))))
		}
	}
	slices.Sort(lines)
	if len(lines) > 12 {
		lines = append(lines[:12], fmt.Sprintf("\n\t… and %d more", len(lines)-12))
	}
	return strings.Join(lines, "")
}

func excerpt(d string) string {
	if len(d) <= 80 {
		return d
	}
	return fmt.Sprintf("%s… (%d bytes)", d[:60], len(d))
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

// awkwardKeys are keys targets tend to mangle: separators of paths, subjects
// and wildcards, escapes, quotes, spaces (trailing ones too, which padding
// collations ignore), letters that differ only in case or normal form, and
// keys of feed.MaxKeyLen bytes that differ only in their last byte.
func awkwardKeys() []string {
	long := strings.Repeat("k", feed.MaxKeyLen-1)
	return []string{
		"a.b", ".", "..", "a/b", "/", "/lead", "trail/", "a:b", "::",
		"*", "a*b", ">", "a.>", "%", "100%", "%2F", "%zz", "+plus",
		"with space", " lead", "trail", "trail ", "\"double\"", "'single'", "back\\slash",
		"tab\tnew\nline", "emoji 🦀🎉", "日本語のキー", "ключ", "Key", "key", "é", "e\u0301",
		long + "1", long + "2", strings.Repeat("é", feed.MaxKeyLen/2), strings.Repeat("🦀", feed.MaxKeyLen/4),
	}
}

func sinkAwkwardKeys(t *testing.T, s *sinkEnv) {
	keys := awkwardKeys()
	var batch []feed.Record
	want := map[string]string{}
	for i, k := range keys {
		d, _ := json.Marshal(map[string]any{"key": k, "i": i})
		batch = append(batch, feed.Record{Key: feed.Key(k), Seq: feed.Seq(i + 1), Doc: d})
		want[k] = string(d)
	}
	s.apply("awkward keys", batch...)
	s.want("after writing awkward keys", want)

	// Every other key deleted, the rest rewritten: each key is addressed
	// exactly, not through a pattern or a normalised form.
	batch = batch[:0]
	for i, k := range keys {
		seq := feed.Seq(len(keys) + i + 1)
		if i%2 == 0 {
			batch = append(batch, feed.Record{Key: feed.Key(k), Seq: seq})
			delete(want, k)
			continue
		}
		d, _ := json.Marshal(map[string]any{"key": k, "again": i})
		batch = append(batch, feed.Record{Key: feed.Key(k), Seq: seq, Doc: d})
		want[k] = string(d)
	}
	s.apply("deleting and rewriting awkward keys", batch...)
	s.want("after deleting every other awkward key", want)

	// A resync copy holds them too.
	r := s.open(1)
	batch = batch[:0]
	want = map[string]string{}
	for i, k := range keys {
		d, _ := json.Marshal(map[string]any{"resync": k})
		batch = append(batch, feed.Record{Key: feed.Key(k), Seq: feed.Seq(3*len(keys) + i + 1), Doc: d})
		want[k] = string(d)
	}
	s.applyTo("awkward keys in a resync", r, batch...)
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after publishing a resync of awkward keys", want)
}

// sizedDoc is a JSON object of exactly n bytes (n ≥ 16) whose padding mixes
// ASCII and multi-byte letters, so a sink that counts runes, not bytes, or
// cuts a document short shows it.
func sizedDoc(n int) string {
	const head, tail = `{"size":"`, `"}`
	pad := n - len(head) - len(tail)
	var b strings.Builder
	b.Grow(n)
	b.WriteString(head)
	for b.Len()-len(head) < pad {
		switch left := pad - (b.Len() - len(head)); {
		case left >= 64:
			b.WriteString("ü-ascii-and-ß-mixed-to-64-bytes-of-padding-0123456789abcdefghijk")
		default:
			b.WriteString(strings.Repeat("x", left))
		}
	}
	b.WriteString(tail)
	return b.String()
}

func sinkDocuments(t *testing.T, s *sinkEnv) {
	deep := "0"
	for i := range 30 { // within MariaDB's 32 levels, the shallowest target limit known
		if i%2 == 0 {
			deep = `{"d":` + deep + `,"n":` + fmt.Sprint(i) + `}`
		} else {
			deep = `[` + deep + `,"x",null]`
		}
	}
	want := map[string]string{
		"nested":  `{"a":{"b":[1,{"c":[true,false,null]},[]],"e":{}},"f":[[[["g"]]]],"h":""}`,
		"deep":    deep,
		"unicode": `{"emoji":"🦀🎉👩‍👩‍👧","cjk":"日本語","rtl":"עברית","combining":"e\u0301","escaped":"\u00e9\u2028\u2029\ud83e\udd80","ctl":"tab\tnl\ncr\r\u0001","quote":"\"'\\/","key \u00fc":"value"}`,
		"scalars": `[0,-1,1.5,"s",true,false,null,{"":""}]`,
		"string":  `"a bare string"`,
		"number":  `42`,
		"empty":   `{}`,
	}
	var batch []feed.Record
	for _, k := range slices.Sorted(maps.Keys(want)) {
		batch = append(batch, feed.Record{Key: feed.Key(k), Seq: feed.Seq(len(batch) + 1), Doc: doc(want[k])})
	}
	if max := s.h.MaxDocumentBytes; max == 0 || max >= 1<<20 {
		for _, k := range []string{"mib-1", "mib-2"} { // two in one batch
			want[k] = sizedDoc(1 << 20)
			batch = append(batch, feed.Record{Key: feed.Key(k), Seq: feed.Seq(len(batch) + 1), Doc: doc(want[k])})
		}
	}
	s.apply("documents of every shape", batch...)
	s.want("after writing documents of every shape", want)
	r := s.open(1)
	s.applyTo("documents of every shape in a resync", r, batch...)
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after publishing a resync of documents of every shape", want)
}

func sinkNumericEdges(t *testing.T, s *sinkEnv) {
	// What feed.Document accepts: numeric's range, from 131072 digits before
	// the point to 16383 after it, and integers and floats past float64.
	want := map[string]string{
		"huge":      `1e131071`,
		"-huge":     `-9.99e131070`,
		"tiny":      `1e-16383`,
		"-tiny":     `-0.` + strings.Repeat("0", 16382) + `1`,
		"long":      `{"digits":` + strings.Repeat("9", 400) + `.` + strings.Repeat("1", 400) + `}`,
		"int64+1":   `[9223372036854775808,-9223372036854775809]`,
		"float64":   `[9007199254740993,1.7976931348623157e309,4.9e-325,0.1]`,
		"zeroes":    `[0,-0,0.0,0e10,-0.0e-10]`,
		"exponents": `[1E+2,1e-2,12.5e3]`,
	}
	var batch []feed.Record
	for _, k := range slices.Sorted(maps.Keys(want)) {
		batch = append(batch, feed.Record{Key: feed.Key(k), Seq: feed.Seq(len(batch) + 1), Doc: doc(want[k])})
	}
	s.apply("numbers at numeric's edges", batch...)
	s.want("after writing numbers at numeric's edges", want)
}

func sinkOversized(t *testing.T, s *sinkEnv) {
	max := s.h.MaxDocumentBytes
	if max == 0 || max > 16<<20 {
		t.Skip("the sink has no document size limit of its own at or below 16 MiB")
	}
	if max < 16 {
		t.Fatalf("feedtest: MaxDocumentBytes is %d; a limit below 16 bytes leaves no room for a document", max)
	}
	check := func(what string, rej []feed.Rejection, err error, seq feed.Seq) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: Apply: %v; a document over the sink's limit is a rejection, not an error", what, err)
		}
		if len(rej) != 1 || rej[0].Key != "too big" || (rej[0].Seq != seq && rej[0].Seq != 0) || rej[0].Reason == "" {
			t.Fatalf("%s: rejections = %+v; want one for %q at seq %d with a reason", what, rej, "too big", seq)
		}
	}
	over := sizedDoc(max + 1)
	rej, err := s.h.Sink.Apply(s.ctx, []feed.Record{rec("before", 1, `1`), {Key: "too big", Seq: 2, Doc: doc(over)}, rec("after", 3, `3`)})
	check("a batch with a document a byte over the limit", rej, err, 2)
	s.want("after a batch with an oversized document (the rest applied)", map[string]string{"before": `1`, "after": `3`})
	atLimit := sizedDoc(max)
	s.apply("a document of exactly the limit", feed.Record{Key: "at limit", Seq: 4, Doc: doc(atLimit)})
	s.want("after a document of exactly the limit", map[string]string{"before": `1`, "after": `3`, "at limit": atLimit})

	r := s.open(1)
	rej, err = r.Apply(s.ctx, []feed.Record{rec("kept", 5, `5`), {Key: "too big", Seq: 6, Doc: doc(over)}})
	check("a resync batch with a document a byte over the limit", rej, err, 6)
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after a resync with an oversized document", map[string]string{"kept": `5`})
}

// faultCallTimeout bounds each call made while the sink's server is gone, so
// a sink that waits for it fails the call (an error, as wanted) rather than
// the test's deadline.
const faultCallTimeout = 10 * time.Second

func sinkFault(t *testing.T, s *sinkEnv) {
	if s.h.Fault == nil {
		t.Skip("the harness cannot make the sink's server unreachable")
	}
	s.apply("the live copy", rec("a", 1, `"a"`), rec("b", 2, `"b"`))
	r := s.open(1)
	s.applyTo("a resync's first batch", r, rec("r1", 3, `"r1"`))

	var once sync.Once
	restoreFn := s.h.Fault(t)
	restore := func() { once.Do(restoreFn) }
	t.Cleanup(restore)
	under := func(what string, call func(ctx context.Context) ([]feed.Rejection, error)) {
		t.Helper()
		ctx, cancel := context.WithTimeout(s.ctx, faultCallTimeout)
		defer cancel()
		rej, err := call(ctx)
		if err == nil || len(rej) != 0 {
			t.Errorf("%s while the server is gone = %v, %v; want an error and no rejection (an outage parks nothing)", what, rej, err)
		}
	}
	live := []feed.Record{rec("a", 4, `"a2"`), rec("b", 5, ""), rec("c", 6, `"c"`)}
	resync := []feed.Record{rec("r2", 7, `"r2"`), rec("a", 8, `"ra"`)}
	under("Apply", func(ctx context.Context) ([]feed.Rejection, error) { return s.h.Sink.Apply(ctx, live) })
	under("a resync's Apply", func(ctx context.Context) ([]feed.Rejection, error) { return r.Apply(ctx, resync) })
	under("Publish", func(ctx context.Context) ([]feed.Rejection, error) { return nil, r.Publish(ctx) })
	restore()

	// The worker retries the failed batch, and, its resync unable to finish,
	// aborts it and starts it over.
	s.apply("the failed batch, again", live...)
	s.want("after the failed batch was applied again", map[string]string{"a": `"a2"`, "c": `"c"`})
	if err := r.Abort(s.ctx); err != nil {
		t.Errorf("Abort of the resync the fault interrupted: %v", err)
	}
	r = s.open(1)
	s.applyTo("the resync, again", r, rec("r1", 3, `"r1"`))
	s.applyTo("the resync's failed batch, again", r, resync...)
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after the resync was published at last", map[string]string{"r1": `"r1"`, "r2": `"r2"`, "a": `"ra"`})
}

func sinkPublishAtomic(t *testing.T, s *sinkEnv) {
	if !s.h.AtomicPublish {
		t.Skip("the sink does not publish a resync at once")
	}
	// Round after round, a resync replaces the live copy: half the keys
	// carried over with other documents, half new. Each round two readers
	// read in a loop from before Publish starts until after it returns, and
	// every read must be the old copy or the new one, whole.
	const rounds, n, readers = 4, 100, 2
	copyOf := func(round int) (map[string]string, []feed.Record) {
		docs := map[string]string{}
		var batch []feed.Record
		for i := range n {
			k := fmt.Sprintf("k-%03d", i+round*n/2)
			docs[k] = fmt.Sprintf(`{"round":%d,"i":%d}`, round, i)
			batch = append(batch, feed.Record{Key: feed.Key(k), Seq: feed.Seq(round*n + i + 1), Doc: doc(docs[k])})
		}
		return docs, batch
	}
	live, batch := copyOf(0)
	s.apply("the first copy", batch...)
	for round := 1; round <= rounds; round++ {
		fresh, batch := copyOf(round)
		r := s.open(feed.Generation(round))
		s.applyTo("a new copy", r, batch...)

		var mu sync.Mutex
		var reads, mixed int
		var firstBad string
		var readErr error
		started, stop := make(chan struct{}, readers), make(chan struct{})
		var wg sync.WaitGroup
		for range readers {
			wg.Go(func() {
				for first := true; ; first = false {
					got, err := s.h.Contents(s.ctx)
					mu.Lock()
					if err != nil {
						readErr = err
						mu.Unlock()
						if first {
							started <- struct{}{}
						}
						return
					}
					reads++
					if d := contentsDiff(got, live); d != "" && contentsDiff(got, fresh) != "" {
						if mixed++; mixed == 1 {
							firstBad = fmt.Sprintf("%d keys, against the old copy:%s", len(got), d)
						}
					}
					mu.Unlock()
					if first {
						started <- struct{}{}
					}
					select {
					case <-stop:
						return // this read began after Publish returned
					default:
					}
				}
			})
		}
		for range readers {
			<-started
		}
		err := r.Publish(s.ctx)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("round %d: Publish: %v", round, err)
		}
		if readErr != nil {
			t.Fatalf("round %d: a reader during Publish: Contents: %v", round, readErr)
		}
		if mixed != 0 {
			t.Fatalf("round %d: %d of %d reads during Publish saw neither copy whole; the first: %s", round, mixed, reads, firstBad)
		}
		s.want("after Publish", fresh)
		live = fresh
	}
}

func sinkResyncAfterCrash(t *testing.T, s *sinkEnv) {
	s.apply("the live copy", rec("live", 1, `"live"`))
	r := s.open(3)
	s.applyTo("a resync that will crash half-filled", r, rec("half-1", 2, `1`), rec("live", 3, ""))
	s.applyTo("its second batch", r, rec("half-2", 4, `2`))
	// The process dies: neither Publish nor Abort. Another one starts.
	again := s.h.Sink
	if s.h.Reopen != nil {
		again = s.h.Reopen(t)
	}
	s.want("after a resync crashed", map[string]string{"live": `"live"`})
	// Bounded: a crashed resync that left a lock behind must fail here with a
	// message, not hang the test.
	ctx, cancel := context.WithTimeout(s.ctx, faultCallTimeout)
	r2, err := again.OpenResync(ctx, 3)
	cancel()
	if err != nil {
		t.Fatalf("OpenResync of the crashed resync's generation: %v", err)
	}
	if rej, err := r2.Apply(s.ctx, []feed.Record{rec("fresh", 5, `"fresh"`)}); err != nil || len(rej) != 0 {
		t.Fatalf("the resync started over: Apply = %v, %v", rej, err)
	}
	s.want("while the resync started over fills", map[string]string{"live": `"live"`})
	if err := r2.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after publishing the resync started over (nothing of the crashed one)", map[string]string{"fresh": `"fresh"`})
	if rej, err := again.Apply(s.ctx, []feed.Record{rec("next", 6, `"next"`)}); err != nil || len(rej) != 0 {
		t.Fatalf("Apply after the publish: %v, %v", rej, err)
	}
	s.want("after an incremental batch", map[string]string{"fresh": `"fresh"`, "next": `"next"`})
}

func sinkConditionalAfterDelete(t *testing.T, s *sinkEnv) {
	if !s.h.ConditionalOnSeq {
		t.Skip("the sink does not make writes conditional on seq")
	}
	// The seq guard remembers a tombstone's seq: a stale call landing after
	// a newer deletion cannot bring the document back.
	s.apply("a document", rec("a", 2, `"v2"`), rec("b", 3, `"v3"`))
	s.apply("its deletion", rec("a", 8, ""))
	rej, err := s.h.Sink.Apply(s.ctx, []feed.Record{rec("a", 5, `"v5"`), rec("b", 6, `"v6"`)})
	if err != nil || len(rej) != 0 {
		t.Fatalf("a stale batch: Apply = %v, %v; want no rejection and no error", rej, err)
	}
	s.want("after a stale write of a deleted key", map[string]string{"b": `"v6"`})
	s.apply("a newer write of the deleted key", rec("a", 9, `"v9"`))
	s.want("after a newer write of the deleted key", map[string]string{"a": `"v9"`, "b": `"v6"`})
}

func sinkConcurrentApply(t *testing.T, s *sinkEnv) {
	if !s.h.ConditionalOnSeq {
		t.Skip("the sink does not make writes conditional on seq")
	}
	// A stale worker's call and its rival's race on the same keys, round
	// after round (keys of their own each): the higher seq wins every key,
	// whichever lands last. The lower one's tombstones delete nothing.
	const rounds, keys = 12, 16
	sinks := []feed.Sink{s.h.Sink, s.h.Sink}
	if s.h.Reopen != nil {
		sinks[1] = s.h.Reopen(t)
	}
	want := map[string]string{}
	for round := range rounds {
		var low, high []feed.Record
		base := feed.Seq(round*4*keys + 1)
		for i := range keys {
			k := fmt.Sprintf("r%02d-k%02d", round, i)
			var lowDoc json.RawMessage
			if i%4 != 0 {
				lowDoc = doc(fmt.Sprintf(`{"won":"low","r":%d}`, round))
			}
			low = append(low, feed.Record{Key: feed.Key(k), Seq: base + feed.Seq(i), Doc: lowDoc})
			want[k] = fmt.Sprintf(`{"won":"high","r":%d}`, round)
			high = append(high, feed.Record{Key: feed.Key(k), Seq: base + 2*keys + feed.Seq(i), Doc: doc(want[k])})
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		gate := make(chan struct{})
		for n := range 2 {
			// Each round swaps which handle sends the older batch, and
			// which call starts first, so no scheduling order is favoured.
			j := (n + round/2) % 2
			batch, sink := [][]feed.Record{low, high}[j], sinks[(j+round)%2]
			wg.Go(func() {
				<-gate
				rej, err := sink.Apply(s.ctx, batch)
				if err == nil && len(rej) != 0 {
					err = fmt.Errorf("rejections %v", rej)
				}
				errs[j] = err
			})
		}
		close(gate)
		wg.Wait()
		for j, err := range errs {
			if err != nil {
				t.Fatalf("round %d: the %s batch: Apply: %v", round, []string{"older", "newer"}[j], err)
			}
		}
	}
	s.want("after racing Apply calls", want)
}

func sinkStaleGeneration(t *testing.T, s *sinkEnv) {
	if !s.h.ConditionalOnSeq {
		t.Skip("the sink does not make writes conditional on seq")
	}
	// A worker of generation 1, in a process of its own, holds a call in
	// flight while it loses its lease; a rival resyncs generation 2 and
	// publishes it; the stale call lands last. Seqs are not reset by a
	// rebuild, so all of it is below the new copy's first seq: the copy's
	// floor must ignore it, for the keys the copy lacks (no stored seq stops
	// those) as for the keys it holds.
	stale := s.h.Sink
	if s.h.Reopen != nil {
		stale = s.h.Reopen(t)
	}
	s.apply("generation 1's live copy", rec("a", 1, `"a1"`), rec("b", 2, `"b1"`), rec("c", 3, `"c1"`), rec("d", 4, `"d1"`))
	r := s.open(2)
	s.applyTo("generation 2's first batch", r, rec("a", 10, `"a2"`), rec("b", 11, ""), rec("e", 12, `"e2"`))
	// The stale worker's call aimed at the copy being filled (it resynced
	// too, into the same copy) is ignored there as well.
	staleBatch := []feed.Record{rec("c", 5, `"c stale"`), rec("a", 6, `"a stale"`), rec("b", 7, `"b stale"`), rec("e", 8, "")}
	if rej, err := r.Apply(s.ctx, staleBatch); err != nil || len(rej) != 0 {
		t.Fatalf("a stale batch sent to the resync target: Apply = %v, %v; want it ignored without rejection or error", rej, err)
	}
	s.applyTo("generation 2's second batch", r, rec("f", 13, `"f2"`))
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	gen2 := map[string]string{"a": `"a2"`, "e": `"e2"`, "f": `"f2"`}
	s.want("after publishing a copy sent a stale batch while it filled", gen2)
	// The same stale call, landing after the publish, through the old
	// worker's handle and through the rival's.
	staleBatch = append(staleBatch, rec("d", 9, `"d stale"`))
	for _, h := range []feed.Sink{stale, s.h.Sink} {
		if rej, err := h.Apply(s.ctx, staleBatch); err != nil || len(rej) != 0 {
			t.Fatalf("a stale batch of generation 1 after the publish: Apply = %v, %v; want it ignored without rejection or error", rej, err)
		}
		s.want("after a stale batch of generation 1 landed on the published copy", gen2)
	}
	// Generation 2's own records still land, at and above the floor.
	s.apply("generation 2's next batch", rec("c", 14, `"c2"`), rec("f", 15, ""))
	s.want("after generation 2's next batch", map[string]string{"a": `"a2"`, "c": `"c2"`, "e": `"e2"`})
}

func sinkStaleGenerationEmpty(t *testing.T, s *sinkEnv) {
	if !s.h.ConditionalOnSeq {
		t.Skip("the sink does not make writes conditional on seq")
	}
	// As StaleGenerationAfterPublish, but the rebuild left generation 2's
	// feed empty: the copy is sent no record, and the worker gives it its
	// floor, the head it saw plus one, with SetFloor (feed.FloorSetter).
	stale := s.h.Sink
	if s.h.Reopen != nil {
		stale = s.h.Reopen(t)
	}
	s.apply("generation 1's live copy", rec("a", 1, `"a1"`), rec("b", 2, `"b1"`), rec("c", 3, `"c1"`))
	r := s.open(2)
	fs, ok := r.(feed.FloorSetter)
	if !ok {
		_ = r.Abort(s.ctx)
		t.Fatalf("the sink keeps the seq guard, but its resync target (%T) is no feed.FloorSetter: it must be one, or a copy sent no record has no floor", r)
	}
	var ie *feed.InvalidError
	if err := fs.SetFloor(s.ctx, 0); !errors.As(err, &ie) || ie.Field != "floor" {
		t.Fatalf("SetFloor(0) = %v; want an *feed.InvalidError for \"floor\"", err)
	}
	if err := fs.SetFloor(s.ctx, 10); err != nil {
		t.Fatalf("SetFloor(10): %v", err)
	}
	staleBatch := []feed.Record{rec("c", 4, `"c stale"`), rec("a", 5, `"a stale"`), rec("b", 6, ""), rec("d", 9, `"d stale"`)}
	if rej, err := r.Apply(s.ctx, staleBatch); err != nil || len(rej) != 0 {
		t.Fatalf("a stale batch sent to the resync target: Apply = %v, %v; want it ignored without rejection or error", rej, err)
	}
	if err := r.Publish(s.ctx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.want("after publishing an empty copy sent a stale batch while it filled", map[string]string{})
	handles := []feed.Sink{stale, s.h.Sink}
	if s.h.Reopen != nil {
		handles = append(handles, s.h.Reopen(t))
	}
	for _, h := range handles {
		if rej, err := h.Apply(s.ctx, staleBatch); err != nil || len(rej) != 0 {
			t.Fatalf("a stale batch of generation 1 after the publish: Apply = %v, %v; want it ignored without rejection or error", rej, err)
		}
		s.want("after a stale batch of generation 1 landed on the published empty copy", map[string]string{})
	}
	// Generation 2's own records land, at and above the floor.
	s.apply("generation 2's first records", rec("a", 10, `"a2"`), rec("e", 11, `"e2"`))
	s.want("after generation 2's first records", map[string]string{"a": `"a2"`, "e": `"e2"`})
}
