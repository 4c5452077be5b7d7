package faults_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/feed/memfeed"
	"github.com/kairos-es/kairos/internal/pgtest"
	"github.com/kairos-es/kairos/pgfeed"
	"github.com/kairos-es/kairos/syncer"
)

// writeLoad writes changes to the feed until stopped: puts over a set of
// keys, every fifth change a delete, a few changes per commit.
type writeLoad struct {
	stop    chan struct{}
	done    chan struct{}
	commits atomic.Int64
}

func (e *env) writeLoad(keys int, every time.Duration) *writeLoad {
	l := &writeLoad{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for n := 0; ; n++ {
			select {
			case <-l.stop:
				return
			case <-time.After(every):
			}
			var changes []feed.Change
			for j := range 4 {
				i := (n*7 + j*13) % keys
				if (n+j)%5 == 0 {
					changes = append(changes, feed.Delete(key(i)))
				} else {
					changes = append(changes, feed.Put(key(i), doc(i, n)))
				}
			}
			if _, err := e.writer.WriteCommitted(context.Background(), e.feed, changes); err == nil {
				l.commits.Add(1)
			}
		}
	}()
	e.t.Cleanup(l.halt)
	return l
}

func (l *writeLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// seed writes n keys in one commit.
func (e *env) seed(n int) {
	var changes []feed.Change
	for i := range n {
		changes = append(changes, feed.Put(key(i), doc(i, 0)))
	}
	e.write(changes...)
}

// holderOf returns the worker whose current lease the database names as the
// holder of sink, or nil.
func (e *env) holderOf(sink string, workers ...*worker) *worker {
	var h string
	q := `"` + e.schema + `"`
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.direct.QueryRow(ctx, `SELECT coalesce(lease_holder, '') FROM `+q+`.feed_cursors WHERE feed = $1 AND sink = $2`, string(e.feed), sink).Scan(&h); err != nil || h == "" {
		return nil
	}
	for _, w := range workers {
		if string(w.spy.holder()) == h {
			return w
		}
	}
	return nil
}

// finalChecks stops the load, lets the workers catch up, and checks I1, I2,
// I4 and the lease audit (I5; no take of a lease still live by the database
// clock).
func (e *env) finalChecks(sink string, load *writeLoad, mem *memfeed.Sink, limit time.Duration) (handovers int) {
	e.t.Helper()
	load.halt()
	e.caughtUp(sink, limit)
	want, _ := e.liveDocs()
	sameDocs(e.t, "sink", mem.Documents(), want)
	stale, handovers := checkI4(e.t, e.rec)
	n := checkI2(e.t, e.rec, stale)
	takes := e.checkLeaseAudit()
	moves := e.checkCursorAudit(sink)
	e.t.Logf("%d commits written, %d keys live; %d records sent, %d lease takes (%d recorded in the database), %d stale calls, %d cursor moves",
		load.commits.Load(), len(want), n, handovers+1, takes, len(stale), moves)
	return handovers
}

// TestAdvisoryBlackHole is fault 2: the holder of an advisory lease loses its
// lock session to a network that stops forwarding it, both ways. A rival
// takes the sink over within a bound, and meanwhile the cut-off worker starts
// no sink call after the rival took over, has at most one call under way
// when it does, and its cursor moves fail (I4). The sink ends with the feed's
// live documents (I1) and no key ever went back (I2).
//
// The lock is freed when the server ends the session, and two subtests give
// it the two ways that happens:
//   - server-gives-up: the proxy closes a connection that has carried nothing
//     for 3 s, standing for the server's TCP keepalive giving up on a dead
//     peer (pgfeed sets the lock session's keepalives so that this takes
//     about half a minute in production; the test shortens it). The rival
//     takes over within that and its retry, whether or not the holder has
//     noticed yet; the holder notices at its next EnsureHeld.
//   - never-closed: the proxy closes nothing, and the server would keep the
//     session for good. Only the holder can end it: its EnsureHeld gets no
//     answer within pgfeed's 5 s bound and closes the session's socket at
//     once (not waiting for pgx's cancel request, which could take 15 s
//     more over the dead path), the proxy closes the server's end in turn,
//     and the rival takes over.
func TestAdvisoryBlackHole(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		closeAfter time.Duration
		bound      time.Duration // from the cut to the rival's take, without the rival's retry and slack
	}{
		{"server-gives-up", 3 * time.Second, 3 * time.Second},
		{"never-closed", 0, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			advisoryBlackHole(t, tc.closeAfter, tc.bound, false)
		})
	}
}

func advisoryBlackHole(t *testing.T, closeAfter, bound time.Duration, blind bool) {
	e := newEnv(t)
	e.seed(200)
	load := e.writeLoad(200, 5*time.Millisecond)
	mon := e.monitorI3("s")
	mem := memfeed.NewSink(memfeed.SinkOptions{})

	p := newProxy(t, upstreamHost(t))
	data := e.pool("", pgx.QueryExecModeCacheStatement, 4)
	// A's lock session goes through the proxy; its reads, writes and cursor
	// moves go straight to the server, so a move A makes after losing the
	// lease reaches the database and must be refused there, by the fence.
	storeA := e.store(data, pgfeed.Options{AdvisoryLock: e.pool(p.addr, pgx.QueryExecModeCacheStatement, 2)})
	storeB := e.store(data, pgfeed.Options{AdvisoryLock: e.pool("", pgx.QueryExecModeCacheStatement, 2)})
	opts := testOptions()
	a := e.startWorker("A", storeA, "s", mem, opts, blind)
	e.caughtUp("s", 30*time.Second)
	b := e.startWorker("B", storeB, "s", mem, opts, false)
	e.eventually("B in standby", 10*time.Second, func() bool { return b.w.State().Phase == syncer.PhaseStandby })
	if e.holderOf("s", a, b) != a {
		t.Fatal("A does not hold the lease before the fault")
	}

	cut := time.Now()
	p.blackHole(closeAfter)
	e.eventually("B to take the lease over", bound+30*time.Second, func() bool { return e.holderOf("s", a, b) == b })
	took := time.Since(cut)
	if limit := bound + opts.LeaseRetry*3/2 + 3*time.Second; took > limit {
		t.Errorf("B took the lease over %v after the session was cut off; the bound is %v (with B's retry and 3 s of slack for a loaded machine)", took, limit)
	}
	time.Sleep(500 * time.Millisecond) // B sends under its lease while A is cut off
	p.heal()
	handovers := e.finalChecks("s", load, mem, 30*time.Second)
	if handovers < 1 {
		t.Fatal("no lease changed hands: the test proves nothing")
	}
	t.Logf("B took over %v after the cut; %d I3 checks", took.Round(time.Millisecond), mon.checks.Load())
}

// upstreamHost is the test database's host:port.
func upstreamHost(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// rowLease are the lease-row timings of the tests: short, so that a lease
// lapses within seconds, and heartbeat + margin < ttl as validation wants.
var rowLease = feed.LeaseOptions{TTL: 3 * time.Second, Heartbeat: 500 * time.Millisecond, Margin: time.Second}

// TestLeaseRowSlowRenewals is fault 3: once the holder's connection to the
// database turns slow (every round trip takes ttl/2, three heartbeats), no
// renewal can answer within its heartbeat bound, though they still land in
// the database and push the stored expiry on. The worker's trust is not
// extended by them: EnsureHeld fails no later than ttl − margin after the
// last renewal that could have answered started (before the slowdown), and
// never passes again on that lease. A rival takes over only once the lease
// lapsed or was cleared, by the database's clock (the audit), and the slow
// worker starts no sink call after that (I4).
func TestLeaseRowSlowRenewals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seed(200)
	load := e.writeLoad(200, 5*time.Millisecond)
	mon := e.monitorI3("s")
	mem := memfeed.NewSink(memfeed.SinkOptions{})

	p := newProxy(t, upstreamHost(t))
	storeA := e.store(e.pool(p.addr, pgx.QueryExecModeCacheStatement, 4), pgfeed.Options{Lease: rowLease})
	storeB := e.store(e.pool("", pgx.QueryExecModeCacheStatement, 4), pgfeed.Options{Lease: rowLease})
	opts := testOptions()
	a := e.startWorker("A", storeA, "s", mem, opts, false)
	e.caughtUp("s", 30*time.Second)
	b := e.startWorker("B", storeB, "s", mem, opts, false)
	e.eventually("B in standby", 10*time.Second, func() bool { return b.w.State().Phase == syncer.PhaseStandby })
	if e.holderOf("s", a, b) != a {
		t.Fatal("A does not hold the lease before the fault")
	}
	a.spy.mu.Lock()
	lease := a.spy.lease
	a.spy.mu.Unlock()

	slow := time.Now()
	half := rowLease.TTL / 4 // each way: a round trip of ttl/2
	p.toxic("slow_up", "latency", "upstream", map[string]any{"latency": half.Milliseconds()})
	p.toxic("slow_down", "latency", "downstream", map[string]any{"latency": half.Milliseconds()})

	// No renewal that started after the slowdown can answer within its
	// heartbeat bound, so the last one the worker may count started before
	// it: EnsureHeld must fail from slow + ttl − margin on, and stay failed.
	must := slow.Add(rowLease.Usable())
	var firstFail time.Time
	var passedLate []time.Duration
	for time.Since(slow) < rowLease.TTL+time.Second {
		now := time.Now()
		err := lease.EnsureHeld(e.ctx)
		switch {
		case err != nil && !errors.Is(err, feed.ErrLeaseLost):
			t.Fatalf("EnsureHeld: %v, want nil or a lost lease", err)
		case err != nil && firstFail.IsZero():
			firstFail = now
		case err == nil && now.After(must):
			passedLate = append(passedLate, now.Sub(slow))
		case err == nil && !firstFail.IsZero():
			t.Errorf("EnsureHeld passed again at %v after failing at %v", now.Sub(slow), firstFail.Sub(slow))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(passedLate) > 0 {
		t.Errorf("trust extended: EnsureHeld passed %d times after ttl − margin (%v) since the slowdown, the last %v after it", len(passedLate), rowLease.Usable(), passedLate[len(passedLate)-1])
	}
	if firstFail.IsZero() {
		t.Fatal("EnsureHeld never failed on the slowed lease")
	}
	e.eventually("B to take the lease over", 30*time.Second, func() bool { return e.holderOf("s", a, b) == b })
	took := time.Since(slow)
	// A liveness bound, looser than the safety above (which the audit
	// checks). Trust ended by slow + ttl − margin, and from then on A's
	// heartbeat sends no renewal, whether or not A has called EnsureHeld
	// since. The last renewal it sent started before that, went out within
	// its heartbeat bound (a wait for a pool connection included) and
	// reached the database half a round trip later, where it set the expiry
	// to the database's now + ttl. So the row lapses by then at the latest
	// (sooner if A's release lands), and B takes over at its next retry.
	bound := rowLease.Usable() + rowLease.Heartbeat + half + rowLease.TTL + opts.LeaseRetry*3/2 + 2*time.Second
	if took > bound {
		t.Errorf("B took the lease over %v after the slowdown; the bound is %v", took, bound)
	}
	p.remove("slow_up")
	p.remove("slow_down")
	handovers := e.finalChecks("s", load, mem, 30*time.Second)
	if handovers < 1 {
		t.Fatal("no lease changed hands: the test proves nothing")
	}
	t.Logf("EnsureHeld failed %v after the slowdown (must by %v); B took over after %v; %d I3 checks",
		firstFail.Sub(slow).Round(time.Millisecond), rowLease.Usable(), took.Round(time.Millisecond), mon.checks.Load())
}

// skewClock is a worker's wall clock off by skew, with real timers.
type skewClock struct{ skew time.Duration }

func (c skewClock) Now() time.Time                      { return time.Now().Add(c.skew) }
func (c skewClock) NewTimer(d time.Duration) feed.Timer { return feed.SystemClock{}.NewTimer(d) }

// TestSkewedWorkerClocks is fault 7: three workers whose clocks are off by
// −ttl, 0 and +ttl compete for one sink while the holder is cut off from the
// database again and again, so that the lease changes hands by lapsing. The
// database's clock judges every expiry, so the audit never shows a take of a
// lease still live, however far apart the workers' clocks are; I4, I2 and I1
// hold as everywhere.
func TestSkewedWorkerClocks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seed(100)
	load := e.writeLoad(100, 10*time.Millisecond)
	mon := e.monitorI3("s")
	mem := memfeed.NewSink(memfeed.SinkOptions{})

	var workers []*worker
	proxies := map[*worker]*proxy{}
	for i, skew := range []time.Duration{-rowLease.TTL, 0, rowLease.TTL} {
		p := newProxy(t, upstreamHost(t))
		opts := testOptions()
		opts.Clock = skewClock{skew}
		// The store keeps the system clock: expiry stamped and compared by
		// the database, lease ages by Go's monotonic clock.
		s := e.store(e.pool(p.addr, pgx.QueryExecModeCacheStatement, 4), pgfeed.Options{Lease: rowLease})
		w := e.startWorker(fmt.Sprintf("W%d(%+v)", i, skew), s, "s", mem, opts, false)
		workers = append(workers, w)
		proxies[w] = p
	}
	e.caughtUp("s", 30*time.Second)
	var mu sync.Mutex
	holders := map[string]int{}
	for round := range 3 {
		h := e.holderOf("s", workers...)
		if h == nil {
			e.eventually("a holder", 10*time.Second, func() bool { h = e.holderOf("s", workers...); return h != nil })
		}
		mu.Lock()
		holders[h.name]++
		mu.Unlock()
		p := proxies[h]
		p.blackHole(time.Second)
		e.eventually(fmt.Sprintf("round %d: another worker to take over from %s", round, h.name), 20*time.Second, func() bool {
			n := e.holderOf("s", workers...)
			return n != nil && n != h
		})
		p.heal()
		// The new holder sends under its lease before the next cut.
		e.caughtUp("s", 20*time.Second)
	}
	handovers := e.finalChecks("s", load, mem, 30*time.Second)
	if handovers < 3 {
		t.Fatalf("%d handovers; the test wanted 3 at least", handovers)
	}
	t.Logf("holders cut off: %v; %d I3 checks", holders, mon.checks.Load())
}
