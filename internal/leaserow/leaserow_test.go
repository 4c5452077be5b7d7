package leaserow_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/leaserow"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// row is a fake lease row: each renewal reports what the test queued for it,
// and the times renewals started are recorded.
type row struct {
	mu      sync.Mutex
	starts  []time.Time
	answers []func(ctx context.Context) (bool, error) // consumed in order; empty: held
	cleared int
	renewed chan struct{}
}

func newRow() *row { return &row{renewed: make(chan struct{}, 100)} }

func (r *row) renew(ctx context.Context, at time.Time) (bool, error) {
	r.mu.Lock()
	r.starts = append(r.starts, at)
	var answer func(context.Context) (bool, error)
	if len(r.answers) > 0 {
		answer, r.answers = r.answers[0], r.answers[1:]
	}
	r.mu.Unlock()
	defer func() { r.renewed <- struct{}{} }()
	if answer == nil {
		return true, nil
	}
	return answer(ctx)
}

func (r *row) clear(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleared++
	return nil
}

func (r *row) then(answers ...func(ctx context.Context) (bool, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers = append(r.answers, answers...)
}

func fail(context.Context) (bool, error) { return false, errors.New("connection refused") }
func hang(ctx context.Context) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}
func taken(context.Context) (bool, error) { return false, nil }

func start(t *testing.T, ctx context.Context, opts feed.LeaseOptions, r *row) (*leaserow.Lease, *feedtest.ManualClock, feed.LeaseOptions) {
	t.Helper()
	timings, err := opts.Resolve("lease")
	if err != nil {
		t.Fatal(err)
	}
	clock := feedtest.NewManualClock(t0)
	// The lease's context ends when the test does, and the release is
	// bounded: a renewal a broken engine left hanging then ends with it, and
	// a failing test fails with its message instead of waiting forever.
	ctx, cancel := context.WithCancel(ctx)
	l := leaserow.Start(ctx, leaserow.Config{
		ID: feed.SinkID{Feed: "f", Sink: "s"}, Holder: "h", Timings: timings, Clock: clock, TakenAt: t0,
		Renew: r.renew, Clear: r.clear, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	t.Cleanup(func() {
		rctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = l.Release(rctx)
	})
	t.Cleanup(cancel) // runs first
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return l, clock, timings
}

// tick advances one heartbeat and waits for the renewal it starts to finish,
// then for the heartbeat to arm its next tick.
func tick(t *testing.T, clock *feedtest.ManualClock, r *row, d time.Duration) {
	t.Helper()
	clock.Advance(d)
	select {
	case <-r.renewed:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal after a heartbeat")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal("the heartbeat did not arm its next tick:", err)
	}
}

func wantHeld(t *testing.T, l *leaserow.Lease, want bool) {
	t.Helper()
	err := l.EnsureHeld(context.Background())
	if want && err != nil {
		t.Fatalf("EnsureHeld = %v, want held", err)
	}
	if !want && !errors.Is(err, feed.ErrLeaseLost) {
		t.Fatalf("EnsureHeld = %v, want ErrLeaseLost", err)
	}
}

// Without a renewal, EnsureHeld passes until exactly ttl − margin after the
// take and fails from then on.
func TestEnsureHeldFailsAtTTLMinusMargin(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, clock, o := start(t, context.Background(), feed.LeaseOptions{}, r)
	clock.Skip(o.Usable() - time.Nanosecond)
	wantHeld(t, l, true)
	clock.Skip(time.Nanosecond)
	wantHeld(t, l, false)
}

// Renewals run on a fixed cadence from the take, each starting on its tick,
// and each landed one restarts the age EnsureHeld judges.
func TestRenewalsOnFixedCadence(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, clock, o := start(t, context.Background(), feed.LeaseOptions{}, r)
	for i := 0; i < 10; i++ {
		tick(t, clock, r, o.Heartbeat)
	}
	wantHeld(t, l, true) // 10 heartbeats = 2 ttl after the take
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, at := range r.starts {
		if want := t0.Add(time.Duration(i+1) * o.Heartbeat); !at.Equal(want) {
			t.Fatalf("renewal %d started at %v, want %v", i, at.Sub(t0), want.Sub(t0))
		}
	}
}

// Under the defaults (3×heartbeat + margin ≤ ttl), one renewal that fails does
// not fail EnsureHeld at any moment before the next renewal lands.
func TestOneFailedRenewalKeepsLease(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, clock, o := start(t, context.Background(), feed.LeaseOptions{}, r)
	tick(t, clock, r, o.Heartbeat) // lands: renewedAt = hb
	r.then(fail)
	tick(t, clock, r, o.Heartbeat) // fails at 2hb
	// Just before the third renewal lands, the last landed one started 2hb ago.
	clock.Skip(o.Heartbeat - time.Nanosecond)
	wantHeld(t, l, true)
	tick(t, clock, r, time.Nanosecond) // lands at 3hb
	clock.Skip(o.Usable() - time.Nanosecond)
	wantHeld(t, l, true)
	clock.Skip(time.Nanosecond)
	wantHeld(t, l, false)
}

// A renewal that hangs is abandoned after one heartbeat (real time here, so the
// timings are small), and is no more than a failed one: the lease survives it.
func TestHangingRenewalIsBounded(t *testing.T) {
	t.Parallel()
	r := newRow()
	o := feed.LeaseOptions{TTL: 500 * time.Millisecond, Heartbeat: 100 * time.Millisecond, Margin: 150 * time.Millisecond}
	l, clock, o := start(t, context.Background(), o, r)
	r.then(hang)
	began := time.Now()
	tick(t, clock, r, o.Heartbeat)
	if took := time.Since(began); took > 5*o.Heartbeat+time.Second {
		t.Fatalf("a hanging renewal held the heartbeat for %v", took)
	}
	wantHeld(t, l, true) // age hb since the take, < ttl − margin
	tick(t, clock, r, o.Heartbeat)
	wantHeld(t, l, true)
	r.mu.Lock()
	n := len(r.starts)
	r.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d renewals, want 2: the one after the hang must start on its own tick", n)
	}
}

// Repeated failures fail EnsureHeld a margin before the lease could lapse.
func TestFailingRenewalsLoseLeaseBeforeExpiry(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, clock, o := start(t, context.Background(), feed.LeaseOptions{}, r)
	r.then(fail, fail, fail, fail, fail)
	var at time.Duration
	for at+o.Heartbeat < o.Usable() {
		tick(t, clock, r, o.Heartbeat)
		at += o.Heartbeat
		wantHeld(t, l, true)
	}
	clock.Skip(o.Usable() - at)
	wantHeld(t, l, false)
}

// A renewal that finds the row taken marks the lease lost at once.
func TestRenewalFindingRivalLosesLease(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, clock, o := start(t, context.Background(), feed.LeaseOptions{}, r)
	r.then(taken)
	tick(t, clock, r, o.Heartbeat)
	wantHeld(t, l, false)
}

// After a pause, the heartbeat renews at once and does not replay every tick
// it missed. (A pause past ttl − margin loses the lease instead:
// TestNoRenewalOnceTrustIsGone.)
func TestPauseDoesNotReplayTicks(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, clock, o := start(t, context.Background(), feed.LeaseOptions{}, r)
	clock.Skip(2*o.Heartbeat + o.Heartbeat/2) // frozen across two ticks, within ttl − margin
	clock.Advance(0)
	deadline := time.After(10 * time.Second)
	for got := 0; got < 2; got++ { // the overdue tick, then one at once
		select {
		case <-r.renewed:
		case <-deadline:
			t.Fatal("no renewal after the pause")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	n := len(r.starts)
	r.mu.Unlock()
	if n > 2 {
		t.Fatalf("%d renewals after one pause, want at most 2", n)
	}
	wantHeld(t, l, true)
}

// Release stops the heartbeat and clears the row once; the context's end does
// the same for a lease nobody released.
func TestReleaseAndContextEnd(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, _, _ := start(t, context.Background(), feed.LeaseOptions{}, r)
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, l, false)
	if r.cleared != 1 {
		t.Fatalf("cleared %d times, want 1", r.cleared)
	}

	r2 := newRow()
	ctx, cancel := context.WithCancel(context.Background())
	l2, _, _ := start(t, ctx, feed.LeaseOptions{}, r2)
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r2.mu.Lock()
		c := r2.cleared
		r2.mu.Unlock()
		if c == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the row was not cleared when the lease's context ended")
		}
		time.Sleep(time.Millisecond) // polling a goroutine's effect, not timing logic
	}
	wantHeld(t, l2, false)
}

// The first tick's timer exists when Start returns, so time moved right after
// the take (a frozen process) cannot make the heartbeat renew early.
func TestFirstTickArmedByStart(t *testing.T) {
	t.Parallel()
	timings, _ := feed.LeaseOptions{}.Resolve("lease")
	clock := feedtest.NewManualClock(t0)
	r := newRow()
	l := leaserow.Start(context.Background(), leaserow.Config{
		ID: feed.SinkID{Feed: "f", Sink: "s"}, Holder: "h", Timings: timings, Clock: clock, TakenAt: t0,
		Renew: r.renew, Clear: r.clear, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	defer l.Release(context.Background())
	if n := clock.Timers(); n != 1 {
		t.Fatalf("%d timers armed when Start returned, want 1", n)
	}
	clock.Skip(timings.Usable())
	wantHeld(t, l, false)
}

// A renewal that lands late restarts the age from when it STARTED, not from
// when it landed: the expiry it wrote was stamped at its start (plus ttl),
// so that is when a rival may take the row again, however slowly the answer
// came back.
func TestSlowRenewalCountsFromItsStart(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, clock, o := start(t, context.Background(), feed.LeaseOptions{}, r)
	slow := o.Heartbeat / 2
	r.then(func(context.Context) (bool, error) {
		clock.Skip(slow) // the answer comes back half a heartbeat later
		return true, nil
	})
	tick(t, clock, r, o.Heartbeat)
	started := t0.Add(o.Heartbeat)
	clock.Skip(started.Add(o.Usable() - time.Nanosecond).Sub(clock.Now()))
	wantHeld(t, l, true)
	clock.Skip(time.Nanosecond)
	wantHeld(t, l, false) // ttl − margin after the renewal started, though it landed later
}

// startBubbled starts a lease on the system clock inside a synctest bubble,
// where time moves only when every goroutine of the bubble is blocked: so a
// test can let many heartbeats pass and then know the heartbeat did all it
// was going to do.
func startBubbled(t *testing.T, opts feed.LeaseOptions, r *row) (*leaserow.Lease, time.Time, feed.LeaseOptions) {
	t.Helper()
	timings, err := opts.Resolve("lease")
	if err != nil {
		t.Fatal(err)
	}
	taken := time.Now()
	l := leaserow.Start(context.Background(), leaserow.Config{
		ID: feed.SinkID{Feed: "f", Sink: "s"}, Holder: "h", Timings: timings, Clock: feed.SystemClock{}, TakenAt: taken,
		Renew: r.renew, Clear: r.clear, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	return l, taken, timings
}

// A lease a renewal found taken stays lost, and its heartbeat sends no
// renewal after that one, though the row would answer held again (as no real
// row can).
func TestLostStaysLost(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRow()
		l, _, o := startBubbled(t, feed.LeaseOptions{}, r)
		r.then(taken)
		time.Sleep(5 * o.Heartbeat)
		synctest.Wait()
		wantHeld(t, l, false)
		r.mu.Lock()
		n := len(r.starts)
		r.mu.Unlock()
		if n != 1 {
			t.Errorf("%d renewals, want 1: none after the one that found the row taken", n)
		}
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Once the last renewal seen to land started ttl − margin ago, the heartbeat
// sends no renewal more, though nobody called EnsureHeld: renewals whose
// answers never came back may still have landed and pushed the stored expiry
// on, and a heartbeat that went on sending them would keep a rival waiting
// however long the worker took to notice. The lease stays lost, and Release
// still clears the row.
func TestNoRenewalOnceTrustIsGone(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRow()
		l, taken, o := startBubbled(t, feed.LeaseOptions{}, r)
		r.then(fail, fail, fail, fail, fail, fail, fail, fail, fail, fail, fail, fail, fail, fail, fail)
		time.Sleep(3 * o.TTL)
		synctest.Wait()
		r.mu.Lock()
		starts := append([]time.Time(nil), r.starts...)
		r.mu.Unlock()
		if len(starts) == 0 {
			t.Fatal("no renewal at all: the test proves nothing")
		}
		for _, at := range starts {
			if age := at.Sub(taken); age >= o.Usable() {
				t.Errorf("a renewal started %v after the last one that landed, at or past ttl − margin (%v)", age, o.Usable())
			}
		}
		wantHeld(t, l, false)
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r.cleared != 1 {
			t.Errorf("cleared %d times, want 1", r.cleared)
		}
	})
}

// A renewal in flight when the age check fails may still land, but its answer
// cannot make EnsureHeld pass again: the failed check is final.
func TestRenewalLandingAfterTrustEndedKeepsLeaseLost(t *testing.T) {
	t.Parallel()
	r := newRow()
	l, clock, o := start(t, context.Background(), feed.LeaseOptions{}, r)
	// Renewals fail until the last tick before ttl − margin, whose renewal
	// answers only after the age check failed.
	var at time.Duration
	for at+2*o.Heartbeat < o.Usable() {
		r.then(fail)
		tick(t, clock, r, o.Heartbeat)
		at += o.Heartbeat
	}
	r.then(func(context.Context) (bool, error) {
		clock.Skip(o.Usable() - clock.Now().Sub(t0)) // the answer comes back late
		wantHeld(t, l, false)
		return true, nil // and says the renewal landed
	})
	tick(t, clock, r, o.Heartbeat)
	wantHeld(t, l, false)
}

// Release waits for a renewal in flight before it clears the row, so that no
// renewal of this holder runs after Release returned.
func TestReleaseWaitsForTheRenewalInFlight(t *testing.T) {
	t.Parallel()
	r := newRow()
	o := feed.LeaseOptions{TTL: 2 * time.Second, Heartbeat: 400 * time.Millisecond, Margin: 800 * time.Millisecond}
	l, clock, o := start(t, context.Background(), o, r)
	var inFlight atomic.Int32
	began := make(chan struct{})
	r.then(func(ctx context.Context) (bool, error) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		close(began)
		<-ctx.Done() // held up until the heartbeat's bound cuts it
		return false, ctx.Err()
	})
	clock.Advance(o.Heartbeat)
	select {
	case <-began:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal after a heartbeat")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := inFlight.Load(); n != 0 {
		t.Fatalf("Release returned with %d renewal in flight", n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cleared != 1 {
		t.Fatalf("cleared %d times, want 1", r.cleared)
	}
}
