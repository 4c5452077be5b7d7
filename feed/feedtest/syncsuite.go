package feedtest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// RunSyncStore runs the sync store and lease conformance suite: the store
// built by newStore must pass every subtest. Subtests run in parallel, each
// with a store and a ManualClock from newStore and feed names of its own. The
// package doc lists what each subtest proves.
func RunSyncStore(t *testing.T, newStore NewStore) {
	t.Helper()
	runModes(t, func(t *testing.T, mode feed.WriteMode) {
		run := func(name string, f func(t *testing.T, e *env)) {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, newStore, mode)
				if e.h.Store == nil {
					t.Fatal("feedtest: the harness has no Store")
				}
				f(t, e)
			})
		}
		run("LeaseHeld", syncLeaseHeld)
		run("ReleaseThenRetake", syncReleaseThenRetake)
		run("ContextEndReleases", syncContextEndReleases)
		run("ExpiryAndFencing", syncExpiryAndFencing)
		run("EnsureHeldMargin", syncEnsureHeldMargin)
		run("HeartbeatKeepsLease", syncHeartbeat)
		run("RenewalAfterTakeover", syncRenewalAfterTakeover)
		run("CASFromZero", syncCASFromZero)
		run("CASExpectedMismatch", syncCASExpectedMismatch)
		run("CASWrongHolder", syncCASWrongHolder)
		run("RefusedCASChangesNothing", syncRefusedCASChangesNothing)
		run("CASRefusesUnknownNext", syncCASRefusesUnknownNext)
		run("CursorWake", syncCursorWake)
		run("ParkChanges", syncParkChanges)
		run("RetryParked", syncRetryParked)
		run("CollectTombstones", syncCollectTombstones)
		run("CollectKeepsParked", syncCollectKeepsParked)
		run("RemoveSink", syncRemoveSink)
		run("Describe", syncDescribe)
		run("DescribeUnknown", syncDescribeUnknown)
		run("BadInput", syncBadInput)
		if mode == feed.WriteConcurrent {
			run("CollectKeepsUnsealedPut", syncCollectKeepsUnsealedPut)
			run("DescribeUnsealed", syncDescribeUnsealed)
		}
	})
}

// acquire takes id's lease or fails t; the lease is released when t ends.
func (e *env) acquire(id feed.SinkID) feed.Lease {
	e.t.Helper()
	l, err := e.h.Store.AcquireLease(e.ctx, id)
	if err != nil {
		e.t.Fatalf("AcquireLease(%s): %v", id, err)
	}
	if l == nil {
		e.t.Fatalf("AcquireLease(%s) returned a nil lease and no error", id)
	}
	e.t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// wantLeaseHeld fails t unless AcquireLease(id) is refused with a
// *feed.LeaseHeldError for id.
func (e *env) wantLeaseHeld(what string, id feed.SinkID) {
	e.t.Helper()
	l, err := e.h.Store.AcquireLease(e.ctx, id)
	if err == nil {
		_ = l.Release(context.Background())
		e.t.Errorf("%s: a rival took the lease of %s; want a LeaseHeldError", what, id)
		return
	}
	var held *feed.LeaseHeldError
	if !errors.Is(err, feed.ErrLeaseHeld) || !errors.As(err, &held) || held.ID != id {
		e.t.Errorf("%s: AcquireLease(%s) = %v; want a *feed.LeaseHeldError for it", what, id, err)
	}
}

// fill writes n documents to the env's feed, one write each, so that its head
// rises by n: a cursor may move only up to the head.
func (e *env) fill(n int) {
	e.t.Helper()
	for i := range n {
		e.write(e.feed, feed.Put(feed.Key("fill-"+strconv.Itoa(i)), doc(`{}`)))
	}
}

// wantLeaseHeldBy is wantLeaseHeld that also wants the refusal to name the
// holder and expiry the store records.
func (e *env) wantLeaseHeldBy(what string, id feed.SinkID, holder feed.LeaseHolder, expires time.Time) {
	e.t.Helper()
	l, err := e.h.Store.AcquireLease(e.ctx, id)
	if err == nil {
		_ = l.Release(context.Background())
		e.t.Errorf("%s: a rival took the lease of %s; want a LeaseHeldError", what, id)
		return
	}
	var held *feed.LeaseHeldError
	if !errors.As(err, &held) || held.ID != id || held.Holder != holder || !held.ExpiresAt.Equal(expires) {
		e.t.Errorf("%s: AcquireLease(%s) = %v; want a *feed.LeaseHeldError naming holder %s expiring at %v", what, id, err, holder, expires)
	}
}

func (e *env) cas(m feed.CursorMove) {
	e.t.Helper()
	if err := e.h.Store.CASCursor(e.ctx, m); err != nil {
		e.t.Fatalf("CASCursor(%s, holder %s, %v → %v): %v", m.ID, m.Holder, m.Expected, m.Next, err)
	}
}

// wantSuperseded fails t unless the move is refused as superseded.
func (e *env) wantSuperseded(what string, m feed.CursorMove) {
	e.t.Helper()
	err := e.h.Store.CASCursor(e.ctx, m)
	var sup *feed.CursorSupersededError
	if !errors.Is(err, feed.ErrCursorSuperseded) || !errors.As(err, &sup) || sup.ID != m.ID {
		e.t.Errorf("%s: CASCursor = %v; want a *feed.CursorSupersededError for %s", what, err, m.ID)
	}
}

func (e *env) cursor(id feed.SinkID) feed.Cursor {
	e.t.Helper()
	c, err := e.h.Store.ReadCursor(e.ctx, id)
	if err != nil {
		e.t.Fatalf("ReadCursor(%s): %v", id, err)
	}
	return c
}

func (e *env) wantCursor(what string, id feed.SinkID, want feed.Cursor) {
	e.t.Helper()
	if got := e.cursor(id); got != want {
		e.t.Errorf("%s: cursor of %s = %v, want %v", what, id, got, want)
	}
}

func (e *env) parked(id feed.SinkID) []feed.ParkedRecord {
	e.t.Helper()
	p, err := e.h.Store.ReadParked(e.ctx, id)
	if err != nil {
		e.t.Fatalf("ReadParked(%s): %v", id, err)
	}
	return p
}

func (e *env) wantParked(what string, id feed.SinkID, want ...feed.ParkedRecord) {
	e.t.Helper()
	if diff := sameParked(e.parked(id), want); diff != "" {
		e.t.Errorf("%s: parked list of %s: %s", what, id, diff)
	}
}

func sameParked(got, want []feed.ParkedRecord) string {
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		g, w := got[i], want[i]
		same = g.Key == w.Key && g.Seq == w.Seq && g.Reason == w.Reason && g.ParkedAt.Equal(w.ParkedAt)
	}
	if same {
		return ""
	}
	return "got " + describeParked(got) + ", want " + describeParked(want)
}

func describeParked(ps []feed.ParkedRecord) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(string(p.Key) + "@" + strconv.FormatInt(int64(p.Seq), 10) + "(" + p.Reason + " at " + p.ParkedAt.UTC().Format(time.RFC3339Nano) + ")")
	}
	b.WriteByte(']')
	return b.String()
}

func (e *env) park(key string, seq feed.Seq, reason string) feed.ParkedRecord {
	return feed.ParkedRecord{Key: feed.Key(key), Seq: seq, Reason: reason, ParkedAt: e.clock.Now()}
}

func (e *env) wantLost(what string, l feed.Lease) {
	e.t.Helper()
	err := l.EnsureHeld(e.ctx)
	var lost *feed.LeaseLostError
	if !errors.Is(err, feed.ErrLeaseLost) || !errors.As(err, &lost) || lost.ID != l.ID() {
		e.t.Errorf("%s: EnsureHeld = %v; want a *feed.LeaseLostError for %s", what, err, l.ID())
	}
}

func (e *env) wantHeld(what string, l feed.Lease) {
	e.t.Helper()
	if err := l.EnsureHeld(e.ctx); err != nil {
		e.t.Errorf("%s: EnsureHeld = %v; want nil", what, err)
	}
}

func (e *env) describe(f feed.FeedName) feed.Description {
	e.t.Helper()
	d, err := e.h.Store.Describe(e.ctx, f)
	if err != nil {
		e.t.Fatalf("Describe(%s): %v", f, err)
	}
	return d
}

func (e *env) collect(what string, want int) {
	e.t.Helper()
	n, err := e.h.Store.CollectTombstones(e.ctx, e.feed)
	if err != nil {
		e.t.Fatalf("%s: CollectTombstones: %v", what, err)
	}
	if n != want {
		e.t.Errorf("%s: CollectTombstones = %d, want %d", what, n, want)
	}
}

func (e *env) wantRows(what string, want ...feed.Record) {
	e.t.Helper()
	if diff := sameRecords(e.readAll(e.feed, 0).Records, want); diff != "" {
		e.t.Errorf("%s: feed rows: %s", what, diff)
	}
}

func syncLeaseHeld(t *testing.T, e *env) {
	id := e.sink("s")
	taken := e.clock.Now()
	a := e.acquire(id)
	if a.ID() != id || a.Holder() == "" {
		t.Errorf("lease ID %v holder %q; want %v and a holder", a.ID(), a.Holder(), id)
	}
	e.wantHeld("a fresh lease", a)
	e.wantLeaseHeldBy("a rival while the lease is held", id, a.Holder(), taken.Add(SuiteLease.TTL))
	e.clock.Skip(SuiteLease.TTL / 2)
	e.wantLeaseHeldBy("a rival halfway through the ttl", id, a.Holder(), taken.Add(SuiteLease.TTL))
	// Another sink of the same feed, and the same sink of another feed, are
	// leases of their own.
	e.acquire(e.sink("other"))
	e.acquire(feed.SinkID{Feed: uniqueFeed(t), Sink: id.Sink})
}

func syncReleaseThenRetake(t *testing.T, e *env) {
	id := e.sink("s")
	holders := map[feed.LeaseHolder]bool{}
	for i := range 4 {
		l := e.acquire(id)
		if holders[l.Holder()] {
			t.Errorf("take %d reused holder %q; every take needs a fresh one", i, l.Holder())
		}
		holders[l.Holder()] = true
		if err := l.Release(e.ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		e.wantLost("after Release", l)
		_ = l.Release(e.ctx) // safe more than once
	}
}

func syncContextEndReleases(t *testing.T, e *env) {
	id := e.sink("s")
	ctx, cancel := context.WithCancel(e.ctx)
	a, err := e.h.Store.AcquireLease(ctx, id)
	if err != nil {
		t.Fatalf("AcquireLease: %v", err)
	}
	t.Cleanup(func() { _ = a.Release(context.Background()) })
	e.wantLeaseHeld("a rival before the context ends", id)
	cancel()
	// The release is asynchronous; no clock move may be needed for it.
	deadline := time.Now().Add(waitLimit)
	for {
		b, err := e.h.Store.AcquireLease(e.ctx, id)
		if err == nil {
			t.Cleanup(func() { _ = b.Release(context.Background()) })
			break
		}
		if !errors.Is(err, feed.ErrLeaseHeld) {
			t.Fatalf("AcquireLease: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease was not released within %v of its context ending", waitLimit)
		}
		time.Sleep(2 * time.Millisecond)
	}
	e.wantLost("after its context ended", a)
}

func syncExpiryAndFencing(t *testing.T, e *env) {
	id := e.sink("s")
	e.fill(2)
	taken := e.clock.Now()
	a := e.acquire(id)
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Next: feed.Cursor{Generation: 1, Seq: 0}})
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Expected: feed.Cursor{Generation: 1, Seq: 0}, Next: feed.Cursor{Generation: 1, Seq: 1},
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{e.park("p", 1, "kept")}}})
	kept := e.parked(id)

	// The holder is frozen: no renewal lands.
	e.clock.Skip(SuiteLease.TTL - time.Millisecond)
	e.wantLeaseHeld("a rival 1ms before the expiry", id)
	e.clock.Skip(time.Millisecond)
	b := e.acquire(id)
	if b.Holder() == a.Holder() {
		t.Fatalf("the rival got the old holder %q", a.Holder())
	}
	e.wantLost("the old holder after a rival took over", a)
	at := feed.Cursor{Generation: 1, Seq: 1}
	e.wantSuperseded("the old holder's move", feed.CursorMove{ID: id, Holder: a.Holder(), Expected: at, Next: feed.Cursor{Generation: 1, Seq: 2}})
	e.wantSuperseded("the old holder's park change", feed.CursorMove{ID: id, Holder: a.Holder(), Expected: at, Next: at,
		Parked: feed.ParkChange{Replace: true, Park: []feed.ParkedRecord{e.park("q", 1, "stale")}}})
	e.wantCursor("after the old holder's moves", id, at)
	if diff := sameParked(e.parked(id), kept); diff != "" {
		t.Errorf("the old holder changed the parked list: %s", diff)
	}
	e.cas(feed.CursorMove{ID: id, Holder: b.Holder(), Expected: at, Next: feed.Cursor{Generation: 1, Seq: 2}})
	if d := e.describe(e.feed); len(d.Sinks) != 1 || d.Sinks[0].Lease == nil || d.Sinks[0].Lease.Holder != b.Holder() ||
		!d.Sinks[0].Lease.ExpiresAt.Equal(taken.Add(2*SuiteLease.TTL)) {
		t.Errorf("Describe after the take-over: %+v; want the new holder, expiring at %v", d.Sinks, taken.Add(2*SuiteLease.TTL))
	}
}

func syncEnsureHeldMargin(t *testing.T, e *env) {
	a := e.acquire(e.sink("s"))
	e.clock.Skip(SuiteLease.Usable() - time.Millisecond)
	e.wantHeld("1ms before ttl − margin", a)
	e.clock.Skip(time.Millisecond)
	e.wantLost("at ttl − margin after the take, with no renewal", a)
	// The lease has not lapsed: a rival is still refused.
	e.wantLeaseHeld("a rival at ttl − margin", a.ID())
}

func syncHeartbeat(t *testing.T, e *env) {
	id := e.sink("s")
	a := e.acquire(id)
	ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
	defer cancel()
	steps := int(2*SuiteLease.TTL/SuiteLease.Heartbeat) + 1
	for i := range steps {
		// The heartbeat has armed its next tick: the renewal before it landed.
		if err := e.clock.WaitForTimers(ctx, 1); err != nil {
			t.Fatalf("step %d: the heartbeat armed no timer: %v", i, err)
		}
		e.clock.Advance(SuiteLease.Heartbeat)
	}
	if err := e.clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("the heartbeat armed no timer after the last renewal: %v", err)
	}
	now := e.clock.Now()
	e.wantHeld("after heartbeats past twice the ttl", a)
	e.wantLeaseHeldBy("a rival after heartbeats past twice the ttl", id, a.Holder(), now.Add(SuiteLease.TTL))
	d := e.describe(e.feed)
	if len(d.Sinks) != 1 || d.Sinks[0].Lease == nil || d.Sinks[0].Lease.Holder != a.Holder() || !d.Sinks[0].Lease.ExpiresAt.Equal(now.Add(SuiteLease.TTL)) {
		t.Errorf("Describe after renewals: %+v; want holder %s expiring at the last renewal + ttl (%v)", d.Sinks, a.Holder(), now.Add(SuiteLease.TTL))
	}
}

// syncRenewalAfterTakeover: a holder frozen past its ttl loses the row to a
// rival; when its heartbeat wakes and renews, the renewal must find the row
// naming someone else and lose the lease, not extend the rival's expiry and
// carry on as a second holder.
func syncRenewalAfterTakeover(t *testing.T, e *env) {
	id := e.sink("s")
	a := e.acquire(id)
	ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
	defer cancel()
	if err := e.clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("the heartbeat armed no timer: %v", err)
	}
	e.clock.Skip(SuiteLease.TTL) // frozen: no renewal runs
	b := e.acquire(id)
	if err := e.clock.WaitForTimers(ctx, 2); err != nil {
		t.Fatalf("the two heartbeats armed no timers: %v", err)
	}
	e.clock.Advance(0) // the frozen holder's overdue tick fires
	// It renews (at once, twice, having fallen behind) and arms its next tick.
	if err := e.clock.WaitForTimers(ctx, 2); err != nil {
		t.Fatalf("the frozen holder's heartbeat armed no timer after renewing: %v", err)
	}
	e.wantLost("the frozen holder once its renewal met the rival", a)
	e.wantHeld("the rival", b)
	d := e.describe(e.feed)
	if len(d.Sinks) != 1 || d.Sinks[0].Lease == nil || d.Sinks[0].Lease.Holder != b.Holder() || !d.Sinks[0].Lease.ExpiresAt.Equal(e.clock.Now().Add(SuiteLease.TTL)) {
		t.Errorf("Describe after the takeover: %+v; want the rival %s expiring a ttl after its take (%v)", d.Sinks, b.Holder(), e.clock.Now().Add(SuiteLease.TTL))
	}
}

func syncCASFromZero(t *testing.T, e *env) {
	id := e.sink("s")
	a := e.acquire(id)
	e.wantCursor("a registered sink before its first move", id, feed.Cursor{})
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Next: feed.Cursor{Generation: 1, Seq: 0}})
	e.wantCursor("after the first move", id, feed.Cursor{Generation: 1, Seq: 0})
	// Two rebuilds later, with seven seqs handed out, the move may jump there.
	e.fill(3)
	e.rebuild()
	e.fill(2)
	e.rebuild()
	e.fill(2)
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Expected: feed.Cursor{Generation: 1, Seq: 0}, Next: feed.Cursor{Generation: 3, Seq: 7}})
	e.wantCursor("after the second move", id, feed.Cursor{Generation: 3, Seq: 7})
	e.wantCursor("a sink never registered", e.sink("never"), feed.Cursor{})
}

func syncCASExpectedMismatch(t *testing.T, e *env) {
	id := e.sink("s")
	e.fill(9)
	a := e.acquire(id)
	at := feed.Cursor{Generation: 1, Seq: 2}
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Next: at})
	for _, wrong := range []feed.Cursor{{}, {Generation: 1, Seq: 1}, {Generation: 2, Seq: 2}} {
		e.wantSuperseded("a move expecting "+wrong.String(), feed.CursorMove{ID: id, Holder: a.Holder(), Expected: wrong, Next: feed.Cursor{Generation: 1, Seq: 9}})
	}
	e.wantCursor("after moves from the wrong cursor", id, at)
}

func syncCASWrongHolder(t *testing.T, e *env) {
	id := e.sink("s")
	e.fill(1)
	a := e.acquire(id)
	e.wantSuperseded("a move naming another holder", feed.CursorMove{ID: id, Holder: a.Holder() + "-not", Next: feed.Cursor{Generation: 1, Seq: 1}})
	e.wantCursor("after a move naming another holder", id, feed.Cursor{})
	e.wantSuperseded("a move on an unregistered sink", feed.CursorMove{ID: e.sink("never"), Holder: a.Holder(), Next: feed.Cursor{Generation: 1, Seq: 1}})
	if err := a.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.wantSuperseded("a move by a released holder", feed.CursorMove{ID: id, Holder: a.Holder(), Next: feed.Cursor{Generation: 1, Seq: 1}})
	e.wantCursor("after a released holder's move", id, feed.Cursor{})
}

func syncRefusedCASChangesNothing(t *testing.T, e *env) {
	id := e.sink("s")
	e.fill(6)
	a := e.acquire(id)
	at := feed.Cursor{Generation: 1, Seq: 5}
	e.clock.Skip(time.Second)
	advanced := e.clock.Now()
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Next: at,
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{e.park("p1", 1, "one"), e.park("p2", 2, "two")}}})
	before := e.parked(id)
	e.clock.Skip(time.Second)
	changes := map[string]feed.ParkChange{
		"park":    {Park: []feed.ParkedRecord{e.park("p3", 3, "three")}},
		"unpark":  {Unpark: []feed.Key{"p1"}},
		"replace": {Replace: true, Park: []feed.ParkedRecord{e.park("p4", 4, "four")}},
		"clear":   {Replace: true},
	}
	for name, pc := range changes {
		e.wantSuperseded("a move from the wrong cursor that would "+name, feed.CursorMove{ID: id, Holder: a.Holder(), Expected: feed.Cursor{Generation: 1, Seq: 4}, Next: feed.Cursor{Generation: 1, Seq: 6}, Parked: pc})
		e.wantSuperseded("a move by the wrong holder that would "+name, feed.CursorMove{ID: id, Holder: "not-" + a.Holder(), Expected: at, Next: feed.Cursor{Generation: 1, Seq: 6}, Parked: pc})
	}
	e.wantCursor("after refused moves", id, at)
	if diff := sameParked(e.parked(id), before); diff != "" {
		t.Errorf("refused moves changed the parked list: %s", diff)
	}
	if d := e.describe(e.feed); len(d.Sinks) != 1 || !d.Sinks[0].LastAdvance.Equal(advanced) {
		t.Errorf("Describe after refused moves: %+v; want last advance %v", d.Sinks, advanced)
	}
}

func syncCASRefusesUnknownNext(t *testing.T, e *env) {
	st := e.h.Store
	id := e.sink("s")
	e.fill(3)
	a := e.acquire(id)
	at := feed.Cursor{Generation: 1, Seq: 2}
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Next: at, Parked: feed.ParkChange{Park: []feed.ParkedRecord{e.park("p", 1, "kept")}}})
	advanced := e.clock.Now()
	before := e.parked(id)
	e.clock.Skip(time.Second)
	changes := map[string]feed.ParkChange{
		"no park change": {},
		"a park change":  {Replace: true, Park: []feed.ParkedRecord{e.park("q", 2, "new")}},
	}
	unchanged := func(what string) {
		t.Helper()
		e.wantCursor(what, id, at)
		if diff := sameParked(e.parked(id), before); diff != "" {
			t.Errorf("%s: the parked list changed: %s", what, diff)
		}
		if d := e.describe(e.feed); len(d.Sinks) != 1 || !d.Sinks[0].LastAdvance.Equal(advanced) {
			t.Errorf("%s: Describe = %+v; want last advance %v", what, d.Sinks, advanced)
		}
	}
	// Places the feed never had are the caller's bug, refused as invalid
	// input, whoever holds the lease.
	for name, pc := range changes {
		for _, c := range []struct {
			what  string
			next  feed.Cursor
			field string
		}{
			{"a seq above the head", feed.Cursor{Generation: 1, Seq: 4}, "move.next.seq"},
			{"a generation the feed has not reached", feed.Cursor{Generation: 2, Seq: 3}, "move.next.generation"},
			{"a generation the feed has not reached, at seq 0", feed.Cursor{Generation: 2, Seq: 0}, "move.next.generation"},
		} {
			err := st.CASCursor(e.ctx, feed.CursorMove{ID: id, Holder: a.Holder(), Expected: at, Next: c.next, Parked: pc})
			wantInvalid(t, "a move to "+c.what+" with "+name, err, c.field)
		}
	}
	unchanged("after moves to places the feed never had")

	// A rebuild wins the race with a move of the generation before it.
	if g := e.rebuild(); g != 2 {
		t.Fatalf("Rebuild = generation %d, want 2", g)
	}
	for name, pc := range changes {
		err := st.CASCursor(e.ctx, feed.CursorMove{ID: id, Holder: a.Holder(), Expected: at, Next: feed.Cursor{Generation: 1, Seq: 3}, Parked: pc})
		var sup *feed.CursorSupersededError
		if !errors.Is(err, feed.ErrCursorSuperseded) || !errors.As(err, &sup) || sup.ID != id || sup.Generation != 2 {
			t.Errorf("a move of generation 1 after the rebuild, with %s: CASCursor = %v; want a *feed.CursorSupersededError for %s naming generation 2", name, err, id)
		}
	}
	unchanged("after moves of the generation before the rebuild")

	// The resync's move into the new generation lands, at seq 0 when it read
	// nothing; the head itself is a place the feed has been.
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Expected: at, Next: feed.Cursor{Generation: 2, Seq: 0}, Parked: feed.ParkChange{Replace: true}})
	e.write(e.feed, feed.Put("n", doc(`1`)))
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Expected: feed.Cursor{Generation: 2, Seq: 0}, Next: feed.Cursor{Generation: 2, Seq: 4}})
	e.wantCursor("after the moves into the new generation", id, feed.Cursor{Generation: 2, Seq: 4})
}

func syncCursorWake(t *testing.T, e *env) {
	// A harness may wrap its Store (to spy on leases, say) and hide the
	// watcher; its Reader is then the store itself.
	w, ok := e.h.Store.(feed.CursorWatcher)
	if !ok {
		w, ok = e.h.Reader.(feed.CursorWatcher)
	}
	if !ok {
		t.Skip("neither the harness's Store nor its Reader is a feed.CursorWatcher")
	}
	id := e.sink("s")
	e.fill(3)
	a := e.acquire(id)
	sub, err := w.SubscribeCursors(e.ctx, e.feed)
	if err != nil {
		t.Fatalf("SubscribeCursors: %v", err)
	}
	defer sub.Close()
	select { // a wake-up the subscription was born with is allowed
	case <-sub.C():
	default:
	}
	from := feed.Cursor{}
	for i, pc := range []feed.ParkChange{{}, {Park: []feed.ParkedRecord{e.park("p", 2, "r")}}, {}} {
		next := feed.Cursor{Generation: 1, Seq: feed.Seq(i + 1)}
		e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Expected: from, Next: next, Parked: pc})
		select {
		case <-sub.C():
		case <-time.After(waitLimit):
			t.Fatalf("move %d (to %v) woke no cursor subscriber within %v", i, next, waitLimit)
		}
		from = next
	}
	sub.Close()
	sub.Close() // safe more than once
}

func syncParkChanges(t *testing.T, e *env) {
	id := e.sink("s")
	e.fill(10)
	a := e.acquire(id)
	move := func(from, to feed.Seq, pc feed.ParkChange) {
		t.Helper()
		m := feed.CursorMove{ID: id, Holder: a.Holder(), Next: feed.Cursor{Generation: 1, Seq: to}, Parked: pc}
		if from >= 0 {
			m.Expected = feed.Cursor{Generation: 1, Seq: from}
		}
		e.cas(m)
	}
	pa, pb, pc := e.park("a", 1, "ra"), e.park("b", 2, "rb"), e.park("c", 3, "rc")
	// Parked out of key order; the list reads in key order.
	move(-1, 3, feed.ParkChange{Park: []feed.ParkedRecord{pc, pa, pb}})
	e.wantParked("after parking c, a, b", id, pa, pb, pc)

	e.clock.Skip(time.Second)
	pb2, pd, pe1, pe2 := e.park("b", 5, "rb again"), e.park("d", 4, "rd"), e.park("e", 6, "first"), e.park("e", 7, "last")
	move(3, 7, feed.ParkChange{Unpark: []feed.Key{"a", "d", "zz-never-parked"}, Park: []feed.ParkedRecord{pe1, pd, pb2, pe2}})
	e.wantParked("after unpark a, d and park d, b, e twice", id, pb2, pc, pd, pe2)

	move(7, 8, feed.ParkChange{})
	e.wantParked("after a move that changes no park", id, pb2, pc, pd, pe2)

	pz := e.park("z", 8, "rz")
	move(8, 9, feed.ParkChange{Replace: true, Park: []feed.ParkedRecord{pz}, Unpark: []feed.Key{"z"}})
	e.wantParked("after a replace", id, pz)

	move(9, 10, feed.ParkChange{Replace: true})
	e.wantParked("after a replace with nothing", id)
	e.wantCursor("after the moves", id, feed.Cursor{Generation: 1, Seq: 10})
}

func syncRetryParked(t *testing.T, e *env) {
	id := e.sink("s")
	e.write(e.feed, feed.Put("a", doc(`{"v":"a"}`)), feed.Put("b", doc(`{"v":"b"}`)))
	e.write(e.feed, feed.Delete("b"))
	a := e.acquire(id)
	at := feed.Cursor{Generation: 1, Seq: 3}
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Next: at,
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{e.park("a", 1, "too big"), e.park("b", 3, "gone")}}})
	sub, err := e.h.Reader.Subscribe(e.ctx, e.feed)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer sub.Close()

	ok, err := e.h.Store.RetryParked(e.ctx, id, "a")
	if err != nil || !ok {
		t.Fatalf("RetryParked(a) = %v, %v; want true", ok, err)
	}
	if h := e.head(e.feed); h != 4 {
		t.Fatalf("Head after a retry = %d, want 4: the row is restamped at head + 1", h)
	}
	select {
	case <-sub.C():
	case <-time.After(waitLimit):
		t.Errorf("no wake-up within %v of a retry", waitLimit)
	}
	// A reader after the sink's cursor sees the key again, at a fresh seq.
	if diff := sameRecords(e.readAll(e.feed, at.Seq).Records, []feed.Record{rec("a", 4, `{"v":"a"}`)}); diff != "" {
		t.Errorf("rows after the cursor once a is retried: %s", diff)
	}
	ok, err = e.h.Store.RetryParked(e.ctx, id, "b")
	if err != nil || !ok {
		t.Fatalf("RetryParked(b), a tombstone = %v, %v; want true", ok, err)
	}
	if diff := sameRecords(e.readAll(e.feed, at.Seq).Records, []feed.Record{rec("a", 4, `{"v":"a"}`), rec("b", 5, "")}); diff != "" {
		t.Errorf("rows after the cursor once b is retried: %s", diff)
	}
	e.wantParked("after both retries", id)
	for _, key := range []feed.Key{"a", "never"} {
		ok, err = e.h.Store.RetryParked(e.ctx, id, key)
		if err != nil || ok {
			t.Errorf("RetryParked(%s) of a key not parked = %v, %v; want false", key, ok, err)
		}
	}
	ok, err = e.h.Store.RetryParked(e.ctx, e.sink("unregistered"), "a")
	if err != nil || ok {
		t.Errorf("RetryParked on an unregistered sink = %v, %v; want false", ok, err)
	}
	if h := e.head(e.feed); h != 5 {
		t.Errorf("Head after retries of keys not parked = %d, want 5 (unchanged)", h)
	}
	e.wantCursor("after retries", id, at)
}

func syncCollectTombstones(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`1`)), feed.Put("b", doc(`2`)), feed.Put("c", doc(`3`)), feed.Put("d", doc(`4`)))
	e.write(e.feed, feed.Delete("a"))
	e.write(e.feed, feed.Delete("b"))
	all := []feed.Record{rec("c", 3, `3`), rec("d", 4, `4`), rec("a", 5, ""), rec("b", 6, "")}
	e.collect("no sink registered", 0)
	e.wantRows("no sink registered", all...)

	s1, s2 := e.sink("s1"), e.sink("s2")
	l1 := e.acquire(s1)
	e.collect("one registered sink without a cursor", 0)
	e.cas(feed.CursorMove{ID: s1, Holder: l1.Holder(), Next: feed.Cursor{Generation: 1, Seq: 6}})
	l2 := e.acquire(s2)
	e.collect("a second registered sink without a cursor", 0)
	e.wantRows("a registered sink without a cursor", all...)

	e.cas(feed.CursorMove{ID: s2, Holder: l2.Holder(), Next: feed.Cursor{Generation: 1, Seq: 4}})
	e.collect("the slower cursor below every tombstone", 0)
	e.cas(feed.CursorMove{ID: s2, Holder: l2.Holder(), Expected: feed.Cursor{Generation: 1, Seq: 4}, Next: feed.Cursor{Generation: 1, Seq: 5}})
	e.collect("the slower cursor at the first tombstone", 1)
	e.wantRows("the slower cursor at the first tombstone", rec("c", 3, `3`), rec("d", 4, `4`), rec("b", 6, ""))

	// A released lease leaves the sink registered: its cursor still counts.
	if err := l2.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.collect("again, the slower sink released", 0)
	e.write(e.feed, feed.Put("e", doc(`5`)))
	l2 = e.acquire(s2)
	e.cas(feed.CursorMove{ID: s2, Holder: l2.Holder(), Expected: feed.Cursor{Generation: 1, Seq: 5}, Next: feed.Cursor{Generation: 1, Seq: 7}})
	e.cas(feed.CursorMove{ID: s1, Holder: l1.Holder(), Expected: feed.Cursor{Generation: 1, Seq: 6}, Next: feed.Cursor{Generation: 1, Seq: 7}})
	e.collect("both cursors at the head", 1)
	e.wantRows("after collection, live documents stay", rec("c", 3, `3`), rec("d", 4, `4`), rec("e", 7, `5`))
	e.collect("nothing left to collect", 0)
}

func syncCollectKeepsParked(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`1`)), feed.Put("b", doc(`2`)), feed.Put("c", doc(`3`)))
	e.write(e.feed, feed.Delete("a"), feed.Delete("b"))
	s1, s2 := e.sink("s1"), e.sink("s2")
	l1, l2 := e.acquire(s1), e.acquire(s2)
	top := feed.Cursor{Generation: 1, Seq: 5}
	e.cas(feed.CursorMove{ID: s1, Holder: l1.Holder(), Next: top})
	e.cas(feed.CursorMove{ID: s2, Holder: l2.Holder(), Next: top,
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{e.park("a", 4, "refused the delete")}}})
	e.collect("a tombstone parked for one sink", 1)
	e.wantRows("a tombstone parked for one sink is kept", rec("c", 3, `3`), rec("a", 4, ""))

	ok, err := e.h.Store.RetryParked(e.ctx, s2, "a")
	if err != nil || !ok {
		t.Fatalf("RetryParked of the kept tombstone = %v, %v; want true", ok, err)
	}
	if diff := sameRecords(e.readAll(e.feed, top.Seq).Records, []feed.Record{rec("a", 6, "")}); diff != "" {
		t.Errorf("the retried tombstone after the cursors: %s", diff)
	}
	e.collect("the retried tombstone, above the cursors", 0)
	e.cas(feed.CursorMove{ID: s1, Holder: l1.Holder(), Expected: top, Next: feed.Cursor{Generation: 1, Seq: 6}})
	e.cas(feed.CursorMove{ID: s2, Holder: l2.Holder(), Expected: top, Next: feed.Cursor{Generation: 1, Seq: 6}})
	e.collect("the retried tombstone once both passed it", 1)
	e.wantRows("at the end", rec("c", 3, `3`))
}

func syncRemoveSink(t *testing.T, e *env) {
	id := e.sink("s")
	e.fill(2)
	if ok, err := e.h.Store.RemoveSink(e.ctx, id); err != nil || ok {
		t.Errorf("RemoveSink of a sink never registered = %v, %v; want false", ok, err)
	}
	a := e.acquire(id)
	e.cas(feed.CursorMove{ID: id, Holder: a.Holder(), Next: feed.Cursor{Generation: 1, Seq: 2},
		Parked: feed.ParkChange{Park: []feed.ParkedRecord{e.park("k", 1, "r")}}})
	ok, err := e.h.Store.RemoveSink(e.ctx, id)
	var held *feed.LeaseHeldError
	if ok || !errors.Is(err, feed.ErrLeaseHeld) || !errors.As(err, &held) || held.ID != id {
		t.Errorf("RemoveSink while the lease is held = %v, %v; want a *feed.LeaseHeldError", ok, err)
	} else if held.Holder != a.Holder() || held.ExpiresAt.IsZero() {
		t.Errorf("RemoveSink's refusal names holder %q expiring at %v; want %q and its expiry, so an operator learns who holds the sink", held.Holder, held.ExpiresAt, a.Holder())
	}
	if d := e.describe(e.feed); len(d.Sinks) != 1 || len(d.Sinks[0].Parked) != 1 {
		t.Errorf("after a refused RemoveSink, Describe = %+v; want the sink and its park kept", d.Sinks)
	}
	if err := a.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.h.Store.RemoveSink(e.ctx, id); err != nil || !ok {
		t.Errorf("RemoveSink after Release = %v, %v; want true", ok, err)
	}
	if d := e.describe(e.feed); len(d.Sinks) != 0 {
		t.Errorf("after RemoveSink, Describe = %+v; want no sink (DescribeUnknown covers a feed never written)", d.Sinks)
	}
	e.wantCursor("after RemoveSink", id, feed.Cursor{})
	e.wantParked("after RemoveSink", id)
	if ok, err := e.h.Store.RemoveSink(e.ctx, id); err != nil || ok {
		t.Errorf("a second RemoveSink = %v, %v; want false", ok, err)
	}

	// Registered again, it starts from nothing; once its holder froze past
	// the ttl it can be removed.
	b := e.acquire(id)
	e.wantCursor("registered again", id, feed.Cursor{})
	e.wantParked("registered again", id)
	e.clock.Skip(SuiteLease.TTL - time.Millisecond)
	if _, err := e.h.Store.RemoveSink(e.ctx, id); !errors.Is(err, feed.ErrLeaseHeld) {
		t.Errorf("RemoveSink 1ms before the lease lapses = %v; want ErrLeaseHeld", err)
	}
	e.clock.Skip(time.Millisecond)
	if ok, err := e.h.Store.RemoveSink(e.ctx, id); err != nil || !ok {
		t.Errorf("RemoveSink once the lease lapsed = %v, %v; want true", ok, err)
	}
	e.wantSuperseded("a move by the holder of a removed sink", feed.CursorMove{ID: id, Holder: b.Holder(), Next: feed.Cursor{Generation: 1, Seq: 1}})
}

func syncDescribe(t *testing.T, e *env) {
	e.write(e.feed, feed.Put("a", doc(`1`)), feed.Put("b", doc(`2`)), feed.Put("c", doc(`3`)))
	e.write(e.feed, feed.Delete("b"))
	t0 := e.clock.Now()
	zeta, alpha := e.sink("zeta"), e.sink("alpha")
	z := e.acquire(zeta)
	e.clock.Skip(time.Second)
	al := e.acquire(alpha)
	if err := al.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.clock.Skip(time.Second)
	pc := e.park("c", 3, "bad doc")
	e.cas(feed.CursorMove{ID: zeta, Holder: z.Holder(), Next: feed.Cursor{Generation: 1, Seq: 3}, Parked: feed.ParkChange{Park: []feed.ParkedRecord{pc}}})
	e.clock.Skip(time.Second)

	d := e.describe(e.feed)
	if d.Feed != e.feed || d.Generation != 1 || d.Head != 4 {
		t.Errorf("Describe: feed %s generation %d head %d; want %s, 1, 4", d.Feed, d.Generation, d.Head, e.feed)
	}
	if len(d.Sinks) != 2 {
		t.Fatalf("Describe lists %d sinks, want 2: %+v", len(d.Sinks), d.Sinks)
	}
	a, s := d.Sinks[0], d.Sinks[1]
	if a.Sink != "alpha" || s.Sink != "zeta" {
		t.Fatalf("Describe lists sinks %s, %s; want alpha, zeta (name order)", a.Sink, s.Sink)
	}
	if !a.Cursor.IsZero() || !a.LastAdvance.IsZero() || a.Lease != nil || len(a.Parked) != 0 || a.Pending != 3 {
		t.Errorf("alpha (registered, released, never moved) = %+v; want no cursor, no advance, no lease, no park, 3 pending", a)
	}
	if s.Cursor != (feed.Cursor{Generation: 1, Seq: 3}) || !s.LastAdvance.Equal(t0.Add(2*time.Second)) || s.Pending != 1 {
		t.Errorf("zeta = cursor %v last advance %v pending %d; want g1@3, %v, 1", s.Cursor, s.LastAdvance, s.Pending, t0.Add(2*time.Second))
	}
	if s.Lease == nil || s.Lease.Holder != z.Holder() || !s.Lease.ExpiresAt.Equal(t0.Add(SuiteLease.TTL)) {
		t.Errorf("zeta's lease = %+v; want holder %s expiring at %v", s.Lease, z.Holder(), t0.Add(SuiteLease.TTL))
	}
	if diff := sameParked(s.Parked, []feed.ParkedRecord{pc}); diff != "" {
		t.Errorf("zeta's parked list: %s", diff)
	}
}

// wantUnknown fails t unless Describe(f) is refused with a
// *feed.UnknownFeedError for f.
func (e *env) wantUnknown(what string, f feed.FeedName) {
	e.t.Helper()
	d, err := e.h.Store.Describe(e.ctx, f)
	var unknown *feed.UnknownFeedError
	if !errors.Is(err, feed.ErrUnknownFeed) || !errors.As(err, &unknown) || unknown.Feed != f {
		e.t.Errorf("%s: Describe(%s) = %+v, %v; want a *feed.UnknownFeedError for it", what, f, d, err)
	}
}

func syncDescribeUnknown(t *testing.T, e *env) {
	e.wantUnknown("a feed never touched", e.feed)
	// Reading a feed, or asking about a sink of it, does not make it known.
	e.readAll(e.feed, 0)
	e.head(e.feed)
	e.cursor(e.sink("s"))
	e.parked(e.sink("s"))
	if ok, err := e.h.Store.RetryParked(e.ctx, e.sink("s"), "k"); err != nil || ok {
		t.Fatalf("RetryParked on a feed never touched = %v, %v; want false", ok, err)
	}
	if n, err := e.h.Store.CollectTombstones(e.ctx, e.feed); err != nil || n != 0 {
		t.Fatalf("CollectTombstones on a feed never touched = %d, %v; want 0", n, err)
	}
	e.wantUnknown("a feed only read", e.feed)

	// A registered sink makes a feed never written known, at generation 1
	// and head 0; removing it makes the feed unknown again.
	id := e.sink("s")
	l := e.acquire(id)
	d := e.describe(e.feed)
	if d.Feed != e.feed || d.Generation != 1 || d.Head != 0 || len(d.Sinks) != 1 || d.Sinks[0].Sink != id.Sink {
		t.Errorf("Describe of a feed never written with one registered sink = %+v; want generation 1, head 0, sink %s", d, id.Sink)
	}
	if err := l.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.h.Store.RemoveSink(e.ctx, id); err != nil || !ok {
		t.Fatalf("RemoveSink = %v, %v; want true", ok, err)
	}
	e.wantUnknown("a feed never written whose one sink was removed", e.feed)

	// A write, or a rebuild alone, records the feed for good.
	written := uniqueFeed(t)
	e.write(written, feed.Put("a", doc(`1`)))
	if d := e.describe(written); d.Head != 1 || len(d.Sinks) != 0 {
		t.Errorf("Describe of a written feed with no sink = %+v; want head 1, no sink", d)
	}
	if e.h.Rebuild != nil {
		rebuilt := uniqueFeed(t)
		if _, err := e.h.Rebuild(e.ctx, rebuilt); err != nil {
			t.Fatalf("Rebuild: %v", err)
		}
		if d := e.describe(rebuilt); d.Generation != 2 || d.Head != 0 || len(d.Sinks) != 0 {
			t.Errorf("Describe of a feed only rebuilt = %+v; want generation 2, head 0, no sink", d)
		}
	}
}

func syncBadInput(t *testing.T, e *env) {
	st := e.h.Store
	for name, bad := range badNames {
		for _, c := range []struct {
			id    feed.SinkID
			field string
		}{
			{feed.SinkID{Feed: feed.FeedName(bad), Sink: "s"}, "feed name"},
			{feed.SinkID{Feed: e.feed, Sink: feed.SinkName(bad)}, "sink name"},
		} {
			what := " with a " + c.field + " " + name
			l, err := st.AcquireLease(e.ctx, c.id)
			wantInvalid(t, "AcquireLease"+what, err, c.field)
			if l != nil {
				_ = l.Release(context.Background())
			}
			_, err = st.ReadCursor(e.ctx, c.id)
			wantInvalid(t, "ReadCursor"+what, err, c.field)
			_, err = st.ReadParked(e.ctx, c.id)
			wantInvalid(t, "ReadParked"+what, err, c.field)
			_, err = st.RetryParked(e.ctx, c.id, "k")
			wantInvalid(t, "RetryParked"+what, err, c.field)
			_, err = st.RemoveSink(e.ctx, c.id)
			wantInvalid(t, "RemoveSink"+what, err, c.field)
			err = st.CASCursor(e.ctx, feed.CursorMove{ID: c.id, Holder: "h", Next: feed.Cursor{Generation: 1}})
			wantInvalid(t, "CASCursor"+what, err, c.field)
		}
		_, err := st.CollectTombstones(e.ctx, feed.FeedName(bad))
		wantInvalid(t, "CollectTombstones of a feed name "+name, err, "feed name")
		_, err = st.Describe(e.ctx, feed.FeedName(bad))
		wantInvalid(t, "Describe of a feed name "+name, err, "feed name")
	}
	e.wantUnknown("after refused calls, which must register no sink", e.feed)

	id := e.sink("s")
	l := e.acquire(id)
	_, err := st.RetryParked(e.ctx, id, "")
	wantInvalid(t, "RetryParked of an empty key", err, "key")
	_, err = st.RetryParked(e.ctx, id, "a\x00")
	wantInvalid(t, "RetryParked of a key with NUL", err, "key")

	good := e.park("k", 1, "reason")
	withPark := func(f func(p *feed.ParkedRecord)) feed.ParkChange {
		p := good
		f(&p)
		return feed.ParkChange{Park: []feed.ParkedRecord{good, p}}
	}
	for _, c := range []struct {
		what  string
		m     feed.CursorMove
		field string
	}{
		{"an empty holder", feed.CursorMove{Next: feed.Cursor{Generation: 1}}, "holder"},
		{"generation 0 in next", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 0, Seq: 1}}, "next.generation"},
		{"the zero next", feed.CursorMove{Holder: l.Holder()}, "next.generation"},
		{"a negative next seq", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1, Seq: -1}}, "next.seq"},
		{"generation 0 in a present expected", feed.CursorMove{Holder: l.Holder(), Expected: feed.Cursor{Seq: 3}, Next: feed.Cursor{Generation: 1, Seq: 4}}, "expected.generation"},
		{"a negative expected seq", feed.CursorMove{Holder: l.Holder(), Expected: feed.Cursor{Generation: 1, Seq: -1}, Next: feed.Cursor{Generation: 1, Seq: 4}}, "expected.seq"},
		{"an empty unpark key", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: feed.ParkChange{Unpark: []feed.Key{"ok", ""}}}, "unpark[1]"},
		{"an empty park key", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: withPark(func(p *feed.ParkedRecord) { p.Key = "" })}, "park[1].key"},
		{"park seq 0", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: withPark(func(p *feed.ParkedRecord) { p.Seq = 0 })}, "park[1].seq"},
		{"a negative park seq", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: withPark(func(p *feed.ParkedRecord) { p.Seq = -4 })}, "park[1].seq"},
		{"an empty reason", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: withPark(func(p *feed.ParkedRecord) { p.Reason = "" })}, "park[1].reason"},
		{"an over-long reason", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: withPark(func(p *feed.ParkedRecord) { p.Reason = strings.Repeat("r", feed.MaxReasonLen+1) })}, "park[1].reason"},
		{"a NUL in a reason", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: withPark(func(p *feed.ParkedRecord) { p.Reason = "a\x00b" })}, "park[1].reason"},
		{"an invalid UTF-8 reason", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: withPark(func(p *feed.ParkedRecord) { p.Reason = "a\xffb" })}, "park[1].reason"},
		{"no park time", feed.CursorMove{Holder: l.Holder(), Next: feed.Cursor{Generation: 1}, Parked: withPark(func(p *feed.ParkedRecord) { p.ParkedAt = time.Time{} })}, "park[1].parked_at"},
	} {
		c.m.ID = id
		wantInvalid(t, "CASCursor with "+c.what, st.CASCursor(e.ctx, c.m), c.field)
	}
	e.wantCursor("after refused moves", id, feed.Cursor{})
	e.wantParked("after refused moves", id)
}
