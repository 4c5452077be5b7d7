package feedtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// StoreOptions are what a suite asks of the store it builds for one subtest.
type StoreOptions struct {
	// Lease are the lease-row timings the store must use (SuiteLease).
	Lease feed.LeaseOptions
	// Clock is the time the store must stamp and compare with (lease expiry,
	// last advance) and run its lease timers on, in place of its database's
	// clock. It starts at a whole second, so a store that keeps microseconds
	// reads back exactly what it was given.
	Clock *ManualClock
}

// StoreHarness is a store as the suites drive it.
type StoreHarness struct {
	// Store is the sync store under test. RunFeed does not use it.
	Store feed.SyncStore
	// Reader reads the same feeds Store keeps and Write writes.
	Reader feed.Reader
	// Write commits changes to a feed in one transaction of the store's kind
	// (feed.Writer inside a transaction that commits at once).
	Write func(ctx context.Context, f feed.FeedName, changes []feed.Change) (feed.WriteResult, error)
	// Rebuild moves the feed to its next generation and empties it in one
	// transaction (a rebuild's feed half), returning the new generation.
	Rebuild func(ctx context.Context, f feed.FeedName) (feed.Generation, error)
	// SetMode moves a feed to a write mode (pgfeed's and memfeed's
	// SetWriteMode), and Seal runs one sealing round on a feed, returning
	// how many rows it sealed (SealRound). With both set, and Store a
	// SealedRange (syncer.SealWaiter), the suites run every subtest a
	// second time with each feed in the concurrent mode, under
	// "Concurrent/"; nil means the store has the locked mode only, and the
	// concurrent runs skip.
	SetMode func(ctx context.Context, f feed.FeedName, mode feed.WriteMode) error
	Seal    func(ctx context.Context, f feed.FeedName) (int, error)
}

// sealRanger is syncer.SealWaiter, which feedtest cannot import.
type sealRanger interface {
	SealedRange(ctx context.Context, f feed.FeedName, keys []feed.Key) (gen feed.Generation, first, last feed.Seq, sealed bool, err error)
}

// NewStore builds a store for one subtest. It is called once per subtest,
// possibly from parallel subtests, and must return a store that no other
// subtest writes to, or one shared store: every subtest uses feed names of its
// own. It releases what it built with t.Cleanup, and fails t (rather than
// skipping) when the store cannot be built.
type NewStore func(t *testing.T, opts StoreOptions) StoreHarness

// SuiteLease are the lease timings the suites run stores with: the defaults,
// spelled out, so the subtests can compute every expiry. Usable() is 20s.
var SuiteLease = feed.LeaseOptions{TTL: 30 * time.Second, Heartbeat: 6 * time.Second, Margin: 10 * time.Second}

// suiteEpoch is where every suite's ManualClock starts: a whole second, in UTC,
// so any store's time type represents it and its multiples of a millisecond.
var suiteEpoch = time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)

// waitLimit bounds, in real time, how long a subtest waits for something
// asynchronous (a wake-up, a heartbeat goroutine) before it fails.
const waitLimit = 10 * time.Second

// env is one subtest's store, clock and names.
type env struct {
	t     *testing.T
	ctx   context.Context
	clock *ManualClock
	h     StoreHarness
	feed  feed.FeedName
	// concurrent: every feed the subtest writes is in the concurrent mode
	// (concurrentHarness); raw is then the store's own harness, whose
	// writes stay unsealed until a Seal.
	concurrent bool
	raw        StoreHarness
}

func newEnv(t *testing.T, newStore NewStore, mode feed.WriteMode) *env {
	t.Helper()
	clock := NewManualClock(suiteEpoch)
	h := newStore(t, StoreOptions{Lease: SuiteLease, Clock: clock})
	if h.Reader == nil || h.Write == nil {
		t.Fatal("feedtest: the harness has no Reader or no Write")
	}
	e := &env{t: t, ctx: t.Context(), clock: clock, h: h, feed: uniqueFeed(t)}
	if mode == feed.WriteConcurrent {
		e.concurrent, e.raw = true, h
		e.h = concurrentHarness(t, h)
	}
	return e
}

// suiteModes are the write modes every store suite runs its subtests in:
// the locked mode's at the top, the concurrent mode's under "Concurrent/".
func runModes(t *testing.T, run func(t *testing.T, mode feed.WriteMode)) {
	run(t, feed.WriteLocked)
	t.Run("Concurrent", func(t *testing.T) { run(t, feed.WriteConcurrent) })
}

// concurrentHarness wraps h so that the subtests, written for the locked
// mode's results, run unchanged on feeds in the concurrent mode: before a
// feed's first write it moves the feed to the concurrent mode; a write must
// come back with no seqs and its keys, in PrepareChanges' order, in
// Unsealed; then rounds seal until one seals nothing, and the result is
// given the seqs the write's keys then hold (SealedRange), as the locked
// mode's would be when the keys are in key order (a round seals in key
// order). A rebuild also keeps the feed in the concurrent mode.
func concurrentHarness(t *testing.T, h StoreHarness) StoreHarness {
	t.Helper()
	sr, ok := h.Store.(sealRanger)
	if h.SetMode == nil || h.Seal == nil || !ok {
		t.Skip("feedtest: the store has the locked write mode only (no SetMode, Seal or SealedRange)")
	}
	var mu sync.Mutex
	set := map[feed.FeedName]bool{}
	ensure := func(ctx context.Context, f feed.FeedName) error {
		if f.Validate() != nil {
			return nil // the store's own error is what a subtest checks
		}
		mu.Lock()
		defer mu.Unlock()
		if set[f] {
			return nil
		}
		if err := h.SetMode(ctx, f, feed.WriteConcurrent); err != nil {
			return fmt.Errorf("feedtest: SetMode(%s, concurrent): %w", f, err)
		}
		set[f] = true
		return nil
	}
	seal := func(ctx context.Context, f feed.FeedName) error {
		for {
			n, err := h.Seal(ctx, f)
			if err != nil {
				return fmt.Errorf("feedtest: Seal(%s): %w", f, err)
			}
			if n == 0 {
				return nil
			}
		}
	}
	out := h
	out.Write = func(ctx context.Context, f feed.FeedName, changes []feed.Change) (feed.WriteResult, error) {
		if err := ensure(ctx, f); err != nil {
			return feed.WriteResult{}, err
		}
		res, err := h.Write(ctx, f, changes)
		if err != nil {
			return res, err
		}
		prepared, _ := feed.PrepareChanges(changes)
		keys := make([]feed.Key, len(prepared))
		for i, c := range prepared {
			keys[i] = c.Key
		}
		if len(prepared) == 0 {
			if res.First != 0 || res.Last != 0 || len(res.Unsealed) != 0 {
				t.Errorf("an empty concurrent-mode write's result = %+v, want no seqs and no keys", res)
			}
			return res, nil
		}
		if res.First != 0 || res.Last != 0 || !slices.Equal(res.Unsealed, keys) {
			t.Errorf("a concurrent-mode write's result = %+v, want First = Last = 0 and Unsealed = %v", res, keys)
		}
		if err := seal(ctx, f); err != nil {
			return res, err
		}
		gen, first, last, sealed, err := sr.SealedRange(ctx, f, keys)
		if err != nil {
			return res, fmt.Errorf("feedtest: SealedRange: %w", err)
		}
		if !sealed {
			return res, fmt.Errorf("feedtest: keys %v unsealed after rounds that sealed everything", keys)
		}
		if gen != res.Generation {
			t.Errorf("a concurrent-mode write's generation %d; its keys were sealed in generation %d with no rebuild between", res.Generation, gen)
		}
		return feed.WriteResult{Generation: res.Generation, First: first, Last: last}, nil
	}
	if h.Rebuild != nil {
		out.Rebuild = func(ctx context.Context, f feed.FeedName) (feed.Generation, error) {
			if err := ensure(ctx, f); err != nil {
				return 0, err
			}
			return h.Rebuild(ctx, f)
		}
	}
	return out
}

// uniqueFeed returns a feed name no other subtest uses, even against one
// shared store or database.
func uniqueFeed(t *testing.T) feed.FeedName {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return feed.FeedName("ft-" + hex.EncodeToString(b[:]))
}

func (e *env) sink(name string) feed.SinkID {
	return feed.SinkID{Feed: e.feed, Sink: feed.SinkName(name)}
}

func (e *env) write(f feed.FeedName, changes ...feed.Change) feed.WriteResult {
	e.t.Helper()
	res, err := e.h.Write(e.ctx, f, changes)
	if err != nil {
		e.t.Fatalf("Write(%s, %d changes): %v", f, len(changes), err)
	}
	return res
}

// rebuild moves the env's feed to its next generation, or fails t.
func (e *env) rebuild() feed.Generation {
	e.t.Helper()
	if e.h.Rebuild == nil {
		e.t.Fatal("feedtest: the harness has no Rebuild")
	}
	g, err := e.h.Rebuild(e.ctx, e.feed)
	if err != nil {
		e.t.Fatalf("Rebuild(%s): %v", e.feed, err)
	}
	return g
}

func (e *env) readAll(f feed.FeedName, after feed.Seq) feed.Batch {
	e.t.Helper()
	b, err := e.h.Reader.ReadBatch(e.ctx, f, after, feed.BatchLimit{Records: feed.MaxBatchLimit})
	if err != nil {
		e.t.Fatalf("ReadBatch(%s, %d): %v", f, after, err)
	}
	return b
}

func (e *env) head(f feed.FeedName) feed.Seq {
	e.t.Helper()
	h, err := e.h.Reader.Head(e.ctx, f)
	if err != nil {
		e.t.Fatalf("Head(%s): %v", f, err)
	}
	return h
}

func doc(s string) json.RawMessage { return json.RawMessage(s) }

// rec is a record the suite expects; Doc nil is a tombstone.
func rec(key string, seq feed.Seq, d string) feed.Record {
	r := feed.Record{Key: feed.Key(key), Seq: seq}
	if d != "" {
		r.Doc = doc(d)
	}
	return r
}

// sameRecords reports the first difference between got and want, or "".
// Documents compare with JSONEqual; a tombstone must have a nil Doc.
func sameRecords(got, want []feed.Record) string {
	if len(got) != len(want) {
		return "got " + describeRecords(got) + ", want " + describeRecords(want)
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Key != w.Key || g.Seq != w.Seq || g.Deleted() != w.Deleted() || (!w.Deleted() && !JSONEqual(g.Doc, w.Doc)) {
			return "got " + describeRecords(got) + ", want " + describeRecords(want)
		}
	}
	return ""
}

func describeRecords(rs []feed.Record) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, r := range rs {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(string(r.Key) + "@" + strconv.FormatInt(int64(r.Seq), 10) + "=")
		if r.Doc == nil {
			b.WriteString("<tombstone>")
		} else {
			b.Write(r.Doc)
		}
	}
	b.WriteByte(']')
	return b.String()
}

// wantInvalid fails t unless err is an *feed.InvalidError matching
// feed.ErrInvalid whose Field contains field.
func wantInvalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: got nil error, want an invalid-input error naming %q", what, field)
		return
	}
	var inv *feed.InvalidError
	if !errors.Is(err, feed.ErrInvalid) || !errors.As(err, &inv) {
		t.Errorf("%s: got %v (%T), want an *feed.InvalidError matching ErrInvalid", what, err, err)
		return
	}
	if !strings.Contains(inv.Field, field) {
		t.Errorf("%s: InvalidError names field %q, want one naming %q", what, inv.Field, field)
	}
}

// JSONEqual reports whether a and b are the same JSON value: object key order,
// whitespace and number spelling ("1e2" and "100", "1.0" and "1") do not
// matter, as they do not survive PostgreSQL's jsonb. Two nil documents
// (tombstones) are equal; nil and a document are not, and invalid JSON equals
// nothing.
func JSONEqual(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	va, okA := decodeJSON(a)
	vb, okB := decodeJSON(b)
	return okA && okB && sameJSON(va, vb)
}

func decodeJSON(raw json.RawMessage) (any, bool) {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err == nil {
		return nil, false // trailing data
	}
	return v, true
}

func sameJSON(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok || !sameJSON(va, vb) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameJSON(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		ra, okA := new(big.Rat).SetString(string(a))
		rb, okB := new(big.Rat).SetString(string(b))
		return okA && okB && ra.Cmp(rb) == 0
	default: // string, bool, nil
		return a == b
	}
}
