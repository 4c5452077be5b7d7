package pgfeed_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/feedtest"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
)

var leaseEpoch = time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want %v", what, err, target)
	}
}

// wantHeldBy fails t unless err is a refusal that names holder and expires
// (zero for an advisory holder).
func wantHeldBy(t *testing.T, what string, err error, holder feed.LeaseHolder, expires time.Time) {
	t.Helper()
	var held *feed.LeaseHeldError
	if !errors.As(err, &held) || held.Holder != holder || !held.ExpiresAt.Equal(expires) {
		t.Fatalf("%s: got %v, want a refusal naming holder %s expiring at %v", what, err, holder, expires)
	}
}

func mustAcquire(t *testing.T, s *pgfeed.Store, ctx context.Context, id feed.SinkID) feed.Lease {
	t.Helper()
	l, err := s.AcquireLease(ctx, id)
	if err != nil {
		t.Fatalf("AcquireLease(%s): %v", id, err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// TestLeaseRowDatabaseClock runs the lease row on the database's clock, with
// short real timings: a holder whose renewals all fail (its pool is gone)
// keeps EnsureHeld for ttl − margin, a rival is refused until the stored
// expiry passes and takes the lease after it, and by then the old holder's
// EnsureHeld fails and its cursor moves are fenced out.
func TestLeaseRowDatabaseClock(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	timings := feed.LeaseOptions{TTL: 2 * time.Second, Heartbeat: 300 * time.Millisecond, Margin: 700 * time.Millisecond}
	holderPool := pgtest.Pool(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	a, err := pgfeed.New(t.Context(), holderPool, pgfeed.Options{Schema: d.schema, Lease: timings, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	b := newStore(t, d, pgfeed.Options{Lease: timings})
	ctx := t.Context()
	id := feed.SinkID{Feed: "dbclock", Sink: "s"}

	la := mustAcquire(t, a, ctx, id)
	if err := a.CASCursor(ctx, feed.CursorMove{ID: id, Holder: la.Holder(), Next: feed.Cursor{Generation: 1, Seq: 0}}); err != nil {
		t.Fatalf("the holder's first move: %v", err)
	}
	// Renewals land for a while: the lease outlives its ttl.
	time.Sleep(timings.TTL + 300*time.Millisecond)
	if err := la.EnsureHeld(ctx); err != nil {
		t.Fatalf("EnsureHeld with renewals landing, past one ttl: %v", err)
	}
	_, err = b.AcquireLease(ctx, id)
	wantErr(t, "a rival while the holder renews", err, feed.ErrLeaseHeld)

	// Every renewal fails from now on.
	cut := time.Now()
	holderPool.Close()
	var lostAt time.Time
	for {
		if err := la.EnsureHeld(ctx); err != nil {
			wantErr(t, "EnsureHeld after the renewals stopped", err, feed.ErrLeaseLost)
			lostAt = time.Now()
			break
		}
		if time.Since(cut) > timings.TTL {
			t.Fatal("EnsureHeld still passes a whole ttl after the last renewal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The last renewal that landed started at most a heartbeat (plus its
	// latency) before the cut, so EnsureHeld may not fail earlier than
	// usable − heartbeat − slack after it, and must fail by usable after it.
	if got, floor := lostAt.Sub(cut), timings.Usable()-timings.Heartbeat-100*time.Millisecond; got < floor || got > timings.Usable()+100*time.Millisecond {
		t.Errorf("EnsureHeld failed %v after the renewals stopped; want between %v and %v", got, floor, timings.Usable())
	}
	for {
		lb, err := b.AcquireLease(ctx, id)
		if err == nil {
			t.Cleanup(func() { _ = lb.Release(context.Background()) })
			if err := la.EnsureHeld(ctx); !errors.Is(err, feed.ErrLeaseLost) {
				t.Fatalf("the rival took the lease while the old holder's EnsureHeld = %v", err)
			}
			if since := time.Since(lostAt); since < timings.Margin-200*time.Millisecond {
				t.Errorf("the rival took the lease %v after the holder's EnsureHeld failed; want about a margin (%v) later", since, timings.Margin)
			}
			if _, err := b.WriteCommitted(ctx, id.Feed, []feed.Change{feed.Put("k", []byte(`1`))}); err != nil {
				t.Fatal(err) // seq 1, for the moves below
			}
			err = b.CASCursor(ctx, feed.CursorMove{ID: id, Holder: la.Holder(), Expected: feed.Cursor{Generation: 1}, Next: feed.Cursor{Generation: 1, Seq: 1}})
			wantErr(t, "a move by the fenced-out holder", err, feed.ErrCursorSuperseded)
			if err := b.CASCursor(ctx, feed.CursorMove{ID: id, Holder: lb.Holder(), Expected: feed.Cursor{Generation: 1}, Next: feed.Cursor{Generation: 1, Seq: 1}}); err != nil {
				t.Fatalf("the new holder's move: %v", err)
			}
			return
		}
		wantErr(t, "a rival before the expiry", err, feed.ErrLeaseHeld)
		if time.Since(cut) > 2*timings.TTL {
			t.Fatal("no rival could take the lease two ttls after the holder's renewals stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// faultyDB wraps a pool and makes the lease renewal statement fail or hang
// on demand, the way a network fault would.
type faultyDB struct {
	*pgxpool.Pool
	mu    sync.Mutex
	fault string // "", "fail" or "hang"
	seen  chan string
	// renewals records every renewal statement that reached the database.
	renewals []call
}

type call struct {
	sql  string
	args []any
}

func (f *faultyDB) set(fault string) { f.mu.Lock(); f.fault = fault; f.mu.Unlock() }

func (f *faultyDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if isRenewal(sql) {
		f.mu.Lock()
		fault := f.fault
		f.mu.Unlock()
		defer func() { f.seen <- fault }()
		switch fault {
		case "fail":
			return pgconn.CommandTag{}, errors.New("injected: connection reset")
		case "hang":
			<-ctx.Done()
			return pgconn.CommandTag{}, ctx.Err()
		}
	}
	if isRenewal(sql) {
		f.mu.Lock()
		f.renewals = append(f.renewals, call{sql, args})
		f.mu.Unlock()
	}
	return f.Pool.Exec(ctx, sql, args...)
}

// TestLeaseRowRenewalFaults drives the default timings on a manual clock with
// renewals that fail or hang: one lost renewal never fails EnsureHeld (3 ×
// heartbeat + margin ≤ ttl), two in a row make it fail exactly ttl − margin
// after the last renewal that landed started, and by then the stored expiry
// is still a margin away, so no rival holds the lease yet. The heartbeat then
// renews no more.
func TestLeaseRowRenewalFaults(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	clock := feedtest.NewManualClock(leaseEpoch)
	fdb := &faultyDB{Pool: d.pool, seen: make(chan string, 16)}
	s, err := pgfeed.New(t.Context(), fdb, pgfeed.Options{Schema: d.schema, Clock: clock, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	rival := newStore(t, d, pgfeed.Options{Clock: clock})
	ctx := t.Context()
	id := feed.SinkID{Feed: "faults", Sink: "s"}
	hb, usable := feed.DefaultLeaseHeartbeat, feed.LeaseOptions{TTL: feed.DefaultLeaseTTL, Margin: feed.DefaultLeaseTTL / 3}.Usable()

	l := mustAcquire(t, s, ctx, id)
	waitArmed := func() {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := clock.WaitForTimers(wctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	// tick moves the clock one heartbeat, lets the renewal run with fault,
	// and waits for the heartbeat to arm its next timer.
	tick := func(fault string) {
		t.Helper()
		waitArmed()
		fdb.set(fault)
		clock.Advance(hb)
		if got := <-fdb.seen; got != fault {
			t.Fatalf("the renewal ran with fault %q, want %q", got, fault)
		}
		waitArmed()
	}
	ensure := func(what string, want error) {
		t.Helper()
		err := l.EnsureHeld(ctx)
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Fatalf("EnsureHeld %s: got %v, want %v", what, err, want)
		}
	}

	tick("")     // the T+6 renewal lands
	tick("hang") // the T+12 one hangs a heartbeat (real time), then is abandoned
	// Frozen until just before the T+18 tick: the last renewal that landed
	// started at T+6, 12s − 1ms ago.
	clock.Skip(hb - time.Millisecond)
	ensure("with one renewal hung", nil)
	tick("") // the T+18 timer fires late, at T+24 − 1ms: lands
	ensure("after a hung renewal and a landed one", nil)
	landed := clock.Now()
	tick("fail")
	ensure("with one renewal failed", nil)
	tick("fail")
	// Two lost in a row: EnsureHeld fails once the age since the last landed
	// renewal reaches ttl − margin (20s).
	clock.Skip(landed.Add(usable - time.Millisecond).Sub(clock.Now()))
	ensure("1ms before ttl − margin", nil)
	clock.Skip(time.Millisecond)
	ensure("at ttl − margin", feed.ErrLeaseLost)
	// The stored expiry (landed + ttl) is a margin away: no rival yet, one
	// once it passes.
	_, err = rival.AcquireLease(ctx, id)
	wantErr(t, "a rival when the holder's EnsureHeld just failed", err, feed.ErrLeaseHeld)
	clock.Skip(feed.DefaultLeaseTTL/3 - time.Millisecond)
	_, err = rival.AcquireLease(ctx, id)
	wantErr(t, "a rival 1ms before the expiry", err, feed.ErrLeaseHeld)
	clock.Skip(time.Millisecond)
	r := mustAcquire(t, rival, ctx, id)
	if r.Holder() == l.Holder() {
		t.Fatal("the rival got the same holder id")
	}
	// The old holder's trust ended at ttl − margin, so its heartbeat renews
	// nothing more: its next ticks pass (each arms the next, beside the
	// rival's timer) without a renewal, and the rival's expiry stays put.
	fdb.set("")
	clock.Advance(0)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(wctx, 2); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-fdb.seen:
		t.Fatalf("the old holder renewed (fault %q) after its EnsureHeld failed", got)
	default:
	}
	ensure("after the rival took over", feed.ErrLeaseLost)
	desc, err := rival.Describe(ctx, id.Feed)
	if err != nil {
		t.Fatal(err)
	}
	if len(desc.Sinks) != 1 || desc.Sinks[0].Lease == nil || desc.Sinks[0].Lease.Holder != r.Holder() || !desc.Sinks[0].Lease.ExpiresAt.Equal(clock.Now().Add(feed.DefaultLeaseTTL)) {
		t.Fatalf("Describe after the takeover = %+v; want the rival's lease expiring a ttl from now", desc.Sinks)
	}
}

// advisoryPool is a direct pool for advisory leases whose sessions carry an
// application name, so a test can find and terminate them.
func advisoryPool(t *testing.T, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func terminate(t *testing.T, pool *pgxpool.Pool, app string) {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatalf("no session named %s to terminate", app)
	}
	// pg_terminate_backend only signals; the backend (and its locks) goes a
	// moment later.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminated session %s is still there after 10s", app)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestAdvisoryLease covers the advisory kind on real PostgreSQL: a rival is
// refused while the session lives; pg_terminate_backend of the session makes
// EnsureHeld fail and lets a rival of either kind take over; the crashed
// holder's record on the row does not block lease-row workers; a live lease
// row refuses an advisory worker and the reverse; RemoveSink is refused
// while the session lives and allowed once it crashed; a free row is taken
// even while some session holds the sink's lock; and a claim records the
// holder only from a session that holds the lock.
func TestAdvisoryLease(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	ctx := t.Context()
	clock := feedtest.NewManualClock(leaseEpoch)
	appA, appB := "kairos-adv-a-"+d.schema, "kairos-adv-b-"+d.schema
	advA := newStore(t, d, pgfeed.Options{AdvisoryLock: advisoryPool(t, appA), Clock: clock})
	advB := newStore(t, d, pgfeed.Options{AdvisoryLock: advisoryPool(t, appB), Clock: clock})
	row := newStore(t, d, pgfeed.Options{Clock: clock})

	t.Run("terminated session", func(t *testing.T) {
		id := feed.SinkID{Feed: "adv", Sink: "killed"}
		a := mustAcquire(t, advA, ctx, id)
		if err := a.EnsureHeld(ctx); err != nil {
			t.Fatalf("EnsureHeld of a live session: %v", err)
		}
		_, err := advB.AcquireLease(ctx, id)
		wantErr(t, "an advisory rival", err, feed.ErrLeaseHeld)
		wantHeldBy(t, "an advisory rival", err, a.Holder(), time.Time{})
		_, err = row.AcquireLease(ctx, id)
		wantErr(t, "a lease-row rival of a live advisory holder", err, feed.ErrLeaseHeld)
		wantHeldBy(t, "a lease-row rival of a live advisory holder", err, a.Holder(), time.Time{})
		_, err = row.RemoveSink(ctx, id)
		wantErr(t, "RemoveSink while the session lives", err, feed.ErrLeaseHeld)
		if err := advA.CASCursor(ctx, feed.CursorMove{ID: id, Holder: a.Holder(), Next: feed.Cursor{Generation: 1, Seq: 0}}); err != nil {
			t.Fatalf("the advisory holder's move: %v", err)
		}
		terminate(t, d.pool, appA)
		wantErr(t, "EnsureHeld after pg_terminate_backend", a.EnsureHeld(ctx), feed.ErrLeaseLost)
		wantErr(t, "EnsureHeld again", a.EnsureHeld(ctx), feed.ErrLeaseLost)
		b := mustAcquire(t, advB, ctx, id)
		if err := b.EnsureHeld(ctx); err != nil {
			t.Fatalf("the rival's EnsureHeld: %v", err)
		}
		if _, err := row.WriteCommitted(ctx, id.Feed, []feed.Change{feed.Put("k", []byte(`1`))}); err != nil {
			t.Fatal(err) // seq 1, for the move below
		}
		err = advA.CASCursor(ctx, feed.CursorMove{ID: id, Holder: a.Holder(), Expected: feed.Cursor{Generation: 1}, Next: feed.Cursor{Generation: 1, Seq: 1}})
		wantErr(t, "a move by the terminated holder", err, feed.ErrCursorSuperseded)
	})

	t.Run("crashed advisory holder does not block lease rows", func(t *testing.T) {
		id := feed.SinkID{Feed: "adv", Sink: "crashed"}
		a := mustAcquire(t, advA, ctx, id)
		terminate(t, d.pool, appA) // the holder stays recorded on the row
		desc, err := row.Describe(ctx, id.Feed)
		if err != nil {
			t.Fatal(err)
		}
		var recorded bool
		for _, s := range desc.Sinks {
			recorded = recorded || s.Sink == id.Sink && s.Lease != nil && s.Lease.Holder == a.Holder() && s.Lease.ExpiresAt.IsZero()
		}
		if !recorded {
			t.Fatalf("the crashed advisory holder is not on the row: %+v", desc.Sinks)
		}
		takenAt := clock.Now()
		r := mustAcquire(t, row, ctx, id)
		// Now a live lease row refuses every advisory worker, until it lapses.
		_, err = advB.AcquireLease(ctx, id)
		wantErr(t, "an advisory worker against a live lease row", err, feed.ErrLeaseHeld)
		wantHeldBy(t, "an advisory worker against a live lease row", err, r.Holder(), takenAt.Add(feed.DefaultLeaseTTL))
		// The refused worker let its lock go at once: a lease-row take still
		// gets the transaction lock, which the RemoveSink of a lapsed row needs.
		clock.Skip(feed.DefaultLeaseTTL)
		wantErr(t, "the frozen row holder", r.EnsureHeld(ctx), feed.ErrLeaseLost)
		b := mustAcquire(t, advB, ctx, id)
		err = row.CASCursor(ctx, feed.CursorMove{ID: id, Holder: r.Holder(), Next: feed.Cursor{Generation: 1}})
		wantErr(t, "a move by the lapsed row holder", err, feed.ErrCursorSuperseded)
		if err := b.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wantErr(t, "EnsureHeld after Release", b.EnsureHeld(ctx), feed.ErrLeaseLost)
		if ok, err := row.RemoveSink(ctx, id); err != nil || !ok {
			t.Fatalf("RemoveSink after the advisory holder released = %v, %v", ok, err)
		}
	})

	t.Run("crashed advisory holder does not block RemoveSink", func(t *testing.T) {
		// Its record has no expiry, so only the sink's advisory lock, free
		// once the session is gone, tells it is dead.
		id := feed.SinkID{Feed: "adv", Sink: "crashed-removed"}
		mustAcquire(t, advA, ctx, id)
		terminate(t, d.pool, appA)
		if ok, err := row.RemoveSink(ctx, id); err != nil || !ok {
			t.Fatalf("RemoveSink of a sink whose advisory holder crashed = %v, %v; want true", ok, err)
		}
	})

	t.Run("free row taken while the advisory lock is held", func(t *testing.T) {
		// An advisory worker that has the sink's lock but has not recorded
		// itself yet (or has cleared itself and not unlocked yet) holds no
		// lease: the row is free, and a lease-row take must get it.
		id := feed.SinkID{Feed: "adv", Sink: "between"}
		conn, err := d.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		for _, registered := range []bool{false, true} {
			var locked bool
			if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, pgfeed.SinkLockKey(row, id)).Scan(&locked); err != nil || !locked {
				t.Fatalf("taking the sink's advisory lock = %v, %v", locked, err)
			}
			r, err := row.AcquireLease(ctx, id)
			if err != nil {
				t.Fatalf("a lease-row take of a free row (registered %v) while the advisory lock is held = %v; want it taken", registered, err)
			}
			if err := r.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, pgfeed.SinkLockKey(row, id)); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("claim only from the session that holds the lock", func(t *testing.T) {
		// The holder is recorded from the lock's own session and only while
		// it holds the lock: a session that lost it (or never had it, as
		// behind a pooler that handed the statement to another one) records
		// nothing.
		id := feed.SinkID{Feed: "adv", Sink: "claim"}
		conn, err := d.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if ok, err := pgfeed.ClaimAdvisory(ctx, advA, conn.Conn(), id, "pg-advisory:nolock"); err != nil || ok {
			t.Fatalf("a claim from a session without the lock = %v, %v; want nothing recorded", ok, err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, pgfeed.SinkLockKey(advA, id)); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, pgfeed.SinkLockKey(advA, id))
		}()
		if ok, err := pgfeed.ClaimAdvisory(ctx, advA, conn.Conn(), id, "pg-advisory:locked"); err != nil || !ok {
			t.Fatalf("a claim from the session that holds the lock = %v, %v; want it recorded", ok, err)
		}
	})

	t.Run("release clears the holder", func(t *testing.T) {
		id := feed.SinkID{Feed: "adv-released", Sink: "s"}
		a := mustAcquire(t, advA, ctx, id)
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		desc, err := row.Describe(ctx, id.Feed)
		if err != nil {
			t.Fatal(err)
		}
		if len(desc.Sinks) != 1 || desc.Sinks[0].Lease != nil {
			t.Fatalf("after Release, Describe shows %+v; want the sink with no lease recorded", desc.Sinks)
		}
	})

	t.Run("context end releases", func(t *testing.T) {
		id := feed.SinkID{Feed: "adv", Sink: "ctx"}
		lctx, cancel := context.WithCancel(ctx)
		a, err := advA.AcquireLease(lctx, id)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, err := advB.AcquireLease(ctx, id)
			if err == nil {
				_ = b.Release(ctx)
				break
			}
			wantErr(t, "a rival after the context ended", err, feed.ErrLeaseHeld)
			if time.Now().After(deadline) {
				t.Fatal("the advisory lease outlived its context by 10s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		wantErr(t, "EnsureHeld after the context ended", a.EnsureHeld(ctx), feed.ErrLeaseLost)
		_ = a.Release(ctx)
	})
}

// TestRenewalNeverMovesExpiryBack: a renewal that lands late (abandoned by
// its heartbeat, then delivered by the network after a newer one landed) must
// not move the stored expiry back, or a rival could take the lease while the
// holder's EnsureHeld, judged from the newer renewal, still passes.
func TestRenewalNeverMovesExpiryBack(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	clock := feedtest.NewManualClock(leaseEpoch)
	fdb := &faultyDB{Pool: d.pool, seen: make(chan string, 16)}
	s, err := pgfeed.New(t.Context(), fdb, pgfeed.Options{Schema: d.schema, Clock: clock, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := t.Context()
	id := feed.SinkID{Feed: "back", Sink: "s"}
	l := mustAcquire(t, s, ctx, id)
	for range 2 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := clock.WaitForTimers(wctx, 1); err != nil {
			cancel()
			t.Fatal(err)
		}
		cancel()
		clock.Advance(feed.DefaultLeaseHeartbeat)
		<-fdb.seen
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(wctx, 1); err != nil {
		t.Fatal(err)
	}
	expiry := func() time.Time {
		t.Helper()
		desc, err := s.Describe(ctx, id.Feed)
		if err != nil || len(desc.Sinks) != 1 || desc.Sinks[0].Lease == nil || desc.Sinks[0].Lease.Holder != l.Holder() {
			t.Fatalf("Describe = %+v, %v", desc.Sinks, err)
		}
		return desc.Sinks[0].Lease.ExpiresAt
	}
	want := clock.Now().Add(feed.DefaultLeaseTTL) // the second renewal's
	if got := expiry(); !got.Equal(want) {
		t.Fatalf("expiry after two renewals = %v; want %v", got, want)
	}
	fdb.mu.Lock()
	first := fdb.renewals[0]
	fdb.mu.Unlock()
	if _, err := d.pool.Exec(ctx, first.sql, first.args...); err != nil {
		t.Fatalf("replaying the first renewal: %v", err)
	}
	if got := expiry(); !got.Equal(want) {
		t.Fatalf("a late first renewal moved the expiry from %v to %v", want, got)
	}
}

// isRenewal recognises the lease-row renewal statement.
func isRenewal(sql string) bool {
	return strings.HasPrefix(sql, "UPDATE") && strings.Contains(sql, "SET lease_expires_at =")
}

// TestLeaseRowAgeFromTheTakeStart: the expiry a take stores is stamped when
// its statement runs, so the lease's age must run from before the take, not
// from when its commit came back. The take is held up here on the cursor
// row's lock while the clock moves on; EnsureHeld must still fail ttl −
// margin after the take started, however late the take returned.
func TestLeaseRowAgeFromTheTakeStart(t *testing.T) {
	t.Parallel()
	d := setup(t, pgtest.URL(), pgx.QueryExecModeCacheStatement)
	clock := feedtest.NewManualClock(leaseEpoch)
	s := newStore(t, d, pgfeed.Options{Clock: clock})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	id := feed.SinkID{Feed: "slow-take", Sink: "s"}
	first := mustAcquire(t, s, ctx, id) // registers the sink: its row exists
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	blocker, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(context.Background()) }()
	var pid int32
	if err := blocker.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM "`+d.schema+`".feed_cursors WHERE feed = $1 AND sink = $2 FOR UPDATE`, string(id.Feed), string(id.Sink)); err != nil {
		t.Fatal(err)
	}
	started := clock.Now()
	type taken struct {
		l   feed.Lease
		err error
	}
	done := make(chan taken, 1)
	go func() {
		l, err := s.AcquireLease(ctx, id)
		done <- taken{l, err}
	}()
	blockedBy(t, ctx, d, pid, nil, "the take")
	clock.Skip(feed.DefaultLeaseTTL / 3) // the take is slow
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatalf("AcquireLease: %v", got.err)
	}
	defer func() { _ = got.l.Release(context.Background()) }()
	timings, _ := feed.LeaseOptions{}.Resolve("lease")
	clock.Skip(started.Add(timings.Usable() - time.Nanosecond).Sub(clock.Now()))
	if err := got.l.EnsureHeld(ctx); err != nil {
		t.Fatalf("EnsureHeld just before ttl − margin after the take started: %v", err)
	}
	clock.Skip(time.Nanosecond)
	wantErr(t, "EnsureHeld ttl − margin after the take started, though it returned later", got.l.EnsureHeld(ctx), feed.ErrLeaseLost)
}
