package syncer_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/syncer"
)

// logged is one log record as a test reads it: its level, message and
// attributes (the logger's own included), each attribute's value resolved.
type logged struct {
	Level slog.Level
	Msg   string
	Attrs map[string]slog.Value
}

func (l logged) str(k string) string { return l.Attrs[k].String() }

// logBook is a slog.Handler that keeps every record, at every level, for a
// test to read; it also writes WARN and above to the test's output.
type logBook struct {
	mu      *sync.Mutex
	records *[]logged
	attrs   []slog.Attr
	out     slog.Handler
}

func newLogBook(t *testing.T) *logBook {
	return &logBook{
		mu:      &sync.Mutex{},
		records: new([]logged),
		out:     slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}),
	}
}

func (b *logBook) Enabled(context.Context, slog.Level) bool { return true }

func (b *logBook) Handle(ctx context.Context, r slog.Record) error {
	l := logged{Level: r.Level, Msg: r.Message, Attrs: map[string]slog.Value{}}
	for _, a := range b.attrs {
		l.Attrs[a.Key] = a.Value.Resolve()
	}
	r.Attrs(func(a slog.Attr) bool {
		l.Attrs[a.Key] = a.Value.Resolve()
		return true
	})
	b.mu.Lock()
	*b.records = append(*b.records, l)
	b.mu.Unlock()
	if r.Level >= slog.LevelWarn && b.out.Enabled(ctx, r.Level) {
		return b.out.WithAttrs(b.attrs).Handle(ctx, r)
	}
	return nil
}

func (b *logBook) WithAttrs(as []slog.Attr) slog.Handler {
	c := *b
	c.attrs = append(slices.Clone(b.attrs), as...)
	return &c
}

func (b *logBook) WithGroup(string) slog.Handler { return b }

// with returns the records whose message starts with prefix.
func (b *logBook) with(prefix string) []logged {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []logged
	for _, l := range *b.records {
		if strings.HasPrefix(l.Msg, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// TestLeaseWaitLogged holds the lease while a worker retries for it many
// times: the worker logs one INFO line naming the holder and when its lease
// can lapse (with its session, for an advisory holder), and shows both in its
// state; a new holder gets one more line; once the lease is free the worker
// logs that it took it, once, and its state no longer names a rival.
func TestLeaseWaitLogged(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		advisory := e.b.name == "pgfeed-advisory"
		w := newWorld(e, "s")
		book := newLogBook(t)
		opts := testOptions(t, e)
		opts.Logger = slog.New(book)
		retry := 100 * time.Millisecond
		opts.LeaseRetry = retry

		rctx, cancel := context.WithCancel(e.ctx)
		defer cancel()
		before := time.Now()
		first, err := e.h.Store.AcquireLease(rctx, w.id)
		if err != nil {
			t.Fatal(err)
		}
		after := time.Now()
		run, _ := one(t, e, w, "A", opts)
		// Many retries: at least 20, jittered to between half and one and a
		// half times the retry.
		time.Sleep(30 * retry)

		waits := book.with("feed lease held by another worker")
		if len(waits) != 1 {
			t.Fatalf("%d lease-wait lines over %v of retries every %v, want 1; the first: %v", len(waits), 30*retry, retry, waits[:min(1, len(waits))])
		}
		l := waits[0]
		if l.Level != slog.LevelInfo || l.str("holder") != string(first.Holder()) || l.str("sink") != "s" {
			t.Fatalf("lease-wait line %+v, want INFO naming holder %s", l, first.Holder())
		}
		st := run.r.States()[0]
		if (st.Phase != syncer.PhaseStandby && st.Phase != syncer.PhaseAcquiring) || st.LeaseHeld || st.WaitingFor != first.Holder() {
			t.Fatalf("state %s waiting for %q, want standby (or retrying) waiting for %q", st.Phase, st.WaitingFor, first.Holder())
		}
		if advisory {
			if _, ok := l.Attrs["lapses_at"]; ok || !strings.Contains(l.str("lapses"), "session") || !st.WaitingUntil.IsZero() {
				t.Fatalf("an advisory holder's lease lapses with its session; logged %+v, state until %v", l.Attrs, st.WaitingUntil)
			}
		} else {
			// The store's clock: fake time in a bubble, the database's
			// otherwise, with a second of slack for that.
			slack := time.Second
			if e.fakeNow {
				slack = 0
			}
			lapses := l.Attrs["lapses_at"].Time()
			lo, hi := before.Add(feed.DefaultLeaseTTL-slack), after.Add(feed.DefaultLeaseTTL+slack)
			if lapses.Before(lo) || lapses.After(hi) {
				t.Fatalf("lease-wait line says the lease lapses at %v, want between %v and %v (taken then, for %v)", lapses, lo, hi, feed.DefaultLeaseTTL)
			}
			if st.WaitingUntil.Before(lapses) || st.WaitingUntil.After(time.Now().Add(feed.DefaultLeaseTTL+slack)) {
				t.Fatalf("state waits until %v, want the holder's expiry, at or after %v", st.WaitingUntil, lapses)
			}
		}

		// Another holder: one more line, naming it. Only in a bubble, where
		// the worker cannot take the lease between the release and the take.
		lines, last := 1, first
		if e.fakeNow {
			if err := first.Release(e.ctx); err != nil {
				t.Fatal(err)
			}
			second, err := e.h.Store.AcquireLease(rctx, w.id)
			if err != nil {
				t.Fatalf("the second holder could not take the lease: %v", err)
			}
			time.Sleep(30 * retry)
			waits = book.with("feed lease held by another worker")
			if len(waits) != 2 || waits[1].str("holder") != string(second.Holder()) {
				t.Fatalf("lease-wait lines %v, want a second one naming %s", waits, second.Holder())
			}
			lines, last = 2, second
		}
		if len(book.with("feed lease taken")) != 0 {
			t.Fatal("the worker says it took a lease others held")
		}

		if err := last.Release(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.eventually("the lease taken", e.limit(), func() bool { return run.r.States()[0].LeaseHeld })
		e.waitCaughtUp(w.id)
		taken := book.with("feed lease taken")
		if len(taken) != 1 || taken[0].Level != slog.LevelInfo || taken[0].str("holder") != string(run.r.States()[0].Holder) {
			t.Fatalf("lease-taken lines %v, want one at INFO naming the worker's holder", taken)
		}
		if st := run.r.States()[0]; st.WaitingFor != "" || !st.WaitingUntil.IsZero() {
			t.Fatalf("state still waits for %q until %v while holding the lease", st.WaitingFor, st.WaitingUntil)
		}
		if n := len(book.with("feed lease held by another worker")); n != lines {
			t.Fatalf("%d lease-wait lines, want still %d", n, lines)
		}
	})
}

// onMem runs scenario on memfeed only, in a synctest bubble: for what does
// not depend on the store.
func onMem(t *testing.T, scenario func(t *testing.T, e *env)) {
	t.Parallel()
	synctestRun(t, func(t *testing.T) { scenario(t, newEnv(t, memBackend)) })
}

// TestProgressLogBounded runs a long resync and a long catch-up on a manual
// clock that moves a second per batch: each logs at most one progress line
// per ProgressInterval, with rows, rate and what is left, and ends with one
// line giving the total and how long it took.
func TestProgressLogBounded(t *testing.T) {
	const batches = 100
	interval := syncer.DefaultProgressInterval
	wantLines := func(t *testing.T, what string, lines []logged) {
		t.Helper()
		// A second per batch: batches seconds, a line at most every interval.
		most := int(time.Duration(batches)*time.Second/interval) + 1
		if len(lines) < most/2 || len(lines) > most {
			t.Fatalf("%d %s progress lines over %d one-second batches, want %d to %d", len(lines), what, batches, most/2, most)
		}
		for _, l := range lines {
			for _, k := range []string{"rows", "rows_per_second", "left_at_most", "eta", "elapsed"} {
				if _, ok := l.Attrs[k]; !ok || l.Level != slog.LevelInfo {
					t.Fatalf("%s progress line %+v: want INFO with %q", what, l, k)
				}
			}
		}
	}
	t.Run("resync", func(t *testing.T) {
		onMem(t, func(t *testing.T, e *env) {
			w := newWorld(e, "s")
			book := newLogBook(t)
			clock := feedtest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			opts := testOptions(t, e)
			opts.Logger, opts.Clock = slog.New(book), clock
			for i := range batches {
				changes := make([]feed.Change, opts.BatchSize)
				for j := range changes {
					changes[j] = feed.Put(key(i*opts.BatchSize+j), doc(`{}`))
				}
				e.write(changes...)
			}
			w.setHook(func(ctx context.Context, c *call) error {
				if c.Op == "target-apply" {
					clock.Skip(time.Second)
				}
				return nil
			})
			one(t, e, w, "A", opts)
			e.waitCaughtUp(w.id)
			wantLines(t, "resync", book.with("feed resync progress"))
			done := book.with("feed resync published")
			if len(done) != 1 || done[0].Attrs["rows"].Int64() != int64(batches*opts.BatchSize) || done[0].Attrs["took"].Duration() != batches*time.Second {
				t.Fatalf("resync end lines %+v, want one with rows %d and took %v", done, batches*opts.BatchSize, batches*time.Second)
			}
		})
	})
	t.Run("catch-up", func(t *testing.T) {
		onMem(t, func(t *testing.T, e *env) {
			w := newWorld(e, "s")
			book := newLogBook(t)
			clock := feedtest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			opts := testOptions(t, e)
			opts.Logger, opts.Clock = slog.New(book), clock
			var calls catchUpCalls
			w.setHook(func(ctx context.Context, c *call) error {
				if calls.next(c) > 0 {
					clock.Skip(time.Second)
				}
				return nil
			})
			_, _, res, _ := catchUpFrom(t, e, w, opts, batches*opts.BatchSize)
			e.eventually("the cursor at the head", e.limit(), func() bool { return e.cursor(w.id).Seq == res.Last })
			e.eventually("the catch-up's end line", e.limit(), func() bool { return len(book.with("feed catch-up done")) > 0 })
			wantLines(t, "catch-up", book.with("feed catch-up progress"))
			done := book.with("feed catch-up done")
			if len(done) != 1 || done[0].Attrs["rows"].Int64() != int64(batches*opts.BatchSize) || done[0].Attrs["took"].Duration() != batches*time.Second {
				t.Fatalf("catch-up end lines %+v, want one with rows %d and took %v", done, batches*opts.BatchSize, batches*time.Second)
			}
		})
	})
}

// panicHere and panicThere are two places a sink panics from.
func panicHere()  { panic("nil map here") }
func panicThere() { panic("nil map there") }

// TestSinkPanicStacks makes the sink panic on many retries at one place, then
// at another: the worker logs one stack per place and a one-line count for
// each panic after the first there.
func TestSinkPanicStacks(t *testing.T) {
	onMem(t, func(t *testing.T, e *env) {
		const each = 15
		w := newWorld(e, "s")
		book := newLogBook(t)
		opts := testOptions(t, e)
		opts.Logger = slog.New(book)
		opts.BackoffMin, opts.BackoffMax = 100*time.Millisecond, time.Second
		var panics atomic.Int32
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op != "target-apply" {
				return nil
			}
			switch n := panics.Add(1); {
			case n <= each:
				panicHere()
			case n <= 2*each:
				panicThere()
			}
			return nil
		})
		e.write(feed.Put("a", doc(`{}`)))
		one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		var stacks []logged
		counts := map[string][]int64{}
		for _, l := range book.with("sink panicked") {
			if _, ok := l.Attrs["stack"]; ok {
				stacks = append(stacks, l)
			} else {
				counts[l.str("site")] = append(counts[l.str("site")], l.Attrs["count"].Int64())
			}
		}
		if len(stacks) != 2 {
			t.Fatalf("%d stacks logged for %d panics at 2 places, want 2", len(stacks), 2*each)
		}
		here, there := stacks[0].str("site"), stacks[1].str("site")
		if !strings.Contains(here, "panicHere") || !strings.Contains(there, "panicThere") {
			t.Fatalf("panic sites %q and %q, want panicHere and panicThere", here, there)
		}
		if !strings.Contains(stacks[0].str("stack"), "panicHere") {
			t.Fatalf("the first stack does not show where it panicked: %s", stacks[0].str("stack"))
		}
		for _, site := range []string{here, there} {
			want := make([]int64, 0, each-1)
			for n := int64(2); n <= each; n++ {
				want = append(want, n)
			}
			if got := counts[site]; !slices.Equal(got, want) {
				t.Fatalf("count lines for %s: %v, want %v", site, got, want)
			}
		}
		if len(counts) != 2 {
			t.Fatalf("count lines for sites %v, want only the two", counts)
		}
	})
}

// TestRecoveredAt fails the sink twice, lets it recover, and fails it twice
// again: while a fault stands the state shows it with no recovery time; once
// a step succeeds, the recovery time follows the fault's, and it is logged.
func TestRecoveredAt(t *testing.T) {
	onMem(t, func(t *testing.T, e *env) {
		w := newWorld(e, "s")
		book := newLogBook(t)
		opts := testOptions(t, e)
		opts.Logger = slog.New(book)
		run, _ := one(t, e, w, "A", opts)
		e.waitCaughtUp(w.id)
		if st := run.r.States()[0]; st.LastError != nil || !st.RecoveredAt.IsZero() {
			t.Fatalf("state before any fault: last error %v, recovered at %v", st.LastError, st.RecoveredAt)
		}
		var fails atomic.Int32
		var mu sync.Mutex
		var during []syncer.State // the state at each failed call after the first of a burst
		w.setHook(func(ctx context.Context, c *call) error {
			if c.Op != "apply" || fails.Load() <= 0 {
				return nil
			}
			n := fails.Add(-1)
			if n%2 == 0 { // the second failure of a burst: the first stands
				mu.Lock()
				during = append(during, run.r.States()[0])
				mu.Unlock()
			}
			return fmt.Errorf("503 (%d left)", n)
		})
		for burst := range 2 {
			fails.Store(2)
			e.write(feed.Put(key(burst), doc(`{}`)))
			e.waitCaughtUp(w.id)
			e.eventually("recovered", e.limit(), func() bool { return !run.r.States()[0].RecoveredAt.IsZero() })
			st := run.r.States()[0]
			if st.LastError == nil || !strings.Contains(st.LastError.Error(), "503 (0 left)") || st.RecoveredAt.Before(st.LastErrorAt) {
				t.Fatalf("burst %d: last error %v at %v, recovered at %v; want the last failure, recovered after it", burst, st.LastError, st.LastErrorAt, st.RecoveredAt)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(during) != 2 {
			t.Fatalf("%d states seen during the bursts, want 2", len(during))
		}
		for i, st := range during {
			if st.LastError == nil || !st.RecoveredAt.IsZero() {
				t.Fatalf("burst %d, while failing: last error %v, recovered at %v; want the fault and no recovery", i, st.LastError, st.RecoveredAt)
			}
		}
		if n := len(book.with("feed sync recovered")); n != 2 {
			t.Fatalf("%d recovery lines for 2 recoveries", n)
		}
	})
}
