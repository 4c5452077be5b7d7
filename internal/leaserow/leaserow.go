// Package leaserow is the one home of the lease-row kind's timekeeping: the
// heartbeat on a fixed cadence, each renewal bounded by the heartbeat, and
// EnsureHeld's age check. Every store that keeps a lease on its cursor row
// (memfeed, pgfeed) takes the row its own way and hands the rest to Start, so
// the arithmetic feed.LeaseOptions explains exists once.
//
// # Lost for good
//
// Once the last renewal seen to land started ttl − margin ago, the lease is
// lost for good, whoever notices first: EnsureHeld, or the heartbeat before it
// sends a renewal. From then on EnsureHeld fails and the heartbeat sends
// nothing more; only Release (or the lease's context ending) still clears the
// row. The reason is the rival's wait. A renewal the worker could not see land
// (it timed out, or its answer was lost) may still have landed and pushed the
// stored expiry on; a heartbeat that went on sending them after trust was gone
// would keep a rival out for as long as the worker took to release, though the
// worker could send nothing under the lease. Stopping at the age check bounds
// the stored expiry by the last renewal started before it: at most ttl, plus
// that renewal's one-way trip to the store, after trust ended. A renewal
// already in flight when trust ends is not called back and may still land;
// it can only push the expiry within that bound, and its answer can no longer
// make EnsureHeld pass. The same holds once a renewal finds the row taken.
package leaserow

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/kairos-es/kairos/feed"
)

// Config is what Start needs from the store that took the row.
type Config struct {
	ID     feed.SinkID
	Holder feed.LeaseHolder
	// Timings are resolved (feed.LeaseOptions.Resolve).
	Timings feed.LeaseOptions
	Clock   feed.Clock
	// TakenAt is the Clock's time when the take STARTED: the first renewal.
	TakenAt time.Time
	// Renew extends the row's expiry to at+ttl for this holder, never moving it
	// back. It reports false when the row no longer names this holder (a rival
	// took it, or it was removed), and an error when it could not tell.
	Renew func(ctx context.Context, at time.Time) (bool, error)
	// Clear clears this holder from the row, when the row still names it.
	Clear  func(ctx context.Context) error
	Logger *slog.Logger
}

// Lease is a held lease row. It implements feed.Lease.
type Lease struct {
	cfg Config

	mu        sync.Mutex
	renewedAt time.Time // when the last renewal that landed started
	lost      string    // why the lease is lost for good; "" while not
	released  bool

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	clearErr error
}

// releaseTimeout bounds the best-effort clear when the lease's context ended
// and no caller context is at hand.
const releaseTimeout = 5 * time.Second

// Start begins the heartbeat of a row this worker has just taken. The lease
// lives until Release or until ctx ends; either stops the heartbeat and clears
// the row.
func Start(ctx context.Context, cfg Config) *Lease {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l := &Lease{
		cfg:       cfg,
		renewedAt: cfg.TakenAt,
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	// The first tick's timer is armed here, not in the goroutine, so the
	// cadence starts at the take: a caller (or a test moving a manual clock)
	// acting right after Start cannot slip in before the timer exists.
	first := l.arm(cfg.TakenAt.Add(cfg.Timings.Heartbeat))
	go l.heartbeat(ctx, first)
	return l
}

// arm returns a timer for the tick at next, or nil when it is already due.
func (l *Lease) arm(next time.Time) feed.Timer {
	if wait := next.Sub(l.cfg.Clock.Now()); wait > 0 {
		return l.cfg.Clock.NewTimer(wait)
	}
	return nil
}

// ID returns the sink the lease is for.
func (l *Lease) ID() feed.SinkID { return l.cfg.ID }

// Holder returns the lease's holder id.
func (l *Lease) Holder() feed.LeaseHolder { return l.cfg.Holder }

// Margin is the lease row's margin: a call EnsureHeld let through that ends
// within it lands before any rival can take the row.
func (l *Lease) Margin() (time.Duration, bool) { return l.cfg.Timings.Margin, true }

// EnsureHeld fails once the lease is lost, or once the last renewal that
// landed started Usable() ago; see feed.LeaseOptions for why that bound is safe.
// The failed age check is final (see the package doc). It asks nothing of the
// store.
func (l *Lease) EnsureHeld(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return &feed.LeaseLostError{ID: l.cfg.ID, Reason: "released"}
	}
	if l.trustedLocked(l.cfg.Clock.Now()) {
		return nil
	}
	return &feed.LeaseLostError{ID: l.cfg.ID, Reason: l.lost}
}

// trustedLocked is the age check, made at now with l.mu held: it reports
// whether the lease may still be counted on, and marks it lost for good the
// first time it may not.
func (l *Lease) trustedLocked(now time.Time) bool {
	if l.lost != "" {
		return false
	}
	if age := now.Sub(l.renewedAt); age >= l.cfg.Timings.Usable() {
		l.lost = "last renewal started " + age.String() + " ago, at or past ttl − margin (" + l.cfg.Timings.Usable().String() + ")"
		return false
	}
	return true
}

// Release stops the heartbeat, waits for it, and clears the row. Safe to call
// more than once; later calls return the first one's result.
func (l *Lease) Release(ctx context.Context) error {
	l.stopOnce.Do(func() { close(l.stop) })
	select {
	case <-l.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.released {
		l.released = true
		l.clearErr = l.cfg.Clear(ctx)
	}
	return l.clearErr
}

// heartbeat renews on a fixed cadence from the take. A renewal never outlasts
// the interval, so each one starts on its own tick whatever became of the one
// before. A worker that fell behind (a pause) renews at once, and once more at
// once if that renewal also ended past its tick, but never replays the ticks it
// missed. Each tick makes the age check first, and once the lease is lost the
// heartbeat sends nothing more (package doc): a pause past ttl − margin
// therefore loses the lease, as EnsureHeld would. A lost lease's heartbeat
// keeps its cadence, renewing nothing, until Release or the context's end
// (which still clears the row): an idle timer costs nothing, and the heartbeat
// keeps the one shape that the store suites, stepping a manual clock from
// timer to timer, rely on.
func (l *Lease) heartbeat(ctx context.Context, t feed.Timer) {
	defer close(l.done)
	interval := l.cfg.Timings.Heartbeat
	next := l.cfg.TakenAt.Add(interval)
	for {
		if t != nil {
			select {
			case <-t.C():
			case <-l.stop:
				t.Stop()
				return
			case <-ctx.Done():
				t.Stop()
				l.releaseOnContextEnd()
				return
			}
		}
		select {
		case <-l.stop:
			return
		case <-ctx.Done():
			l.releaseOnContextEnd()
			return
		default:
		}
		at := l.cfg.Clock.Now()
		l.mu.Lock()
		trusted := l.trustedLocked(at)
		l.mu.Unlock()
		if trusted {
			l.renew(ctx, at)
		}
		now := l.cfg.Clock.Now()
		next = next.Add(interval)
		if next.Before(now) {
			next = now
		}
		t = l.arm(next)
	}
}

// renew makes one renewal started at at, bounded by the heartbeat. A renewal
// that fails or times out is not yet a lost lease: the age check decides that,
// a margin before the lease can lapse. A renewal abandoned too late to be
// cancelled can still land, but it touches only this holder's row and never
// moves the expiry back, and renewedAt stays at the last renewal seen to land,
// so EnsureHeld errs early, never late.
func (l *Lease) renew(ctx context.Context, at time.Time) {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.Timings.Heartbeat)
	held, err := l.cfg.Renew(rctx, at)
	cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			level := slog.LevelWarn
			if errors.Is(err, context.DeadlineExceeded) {
				err = errors.New("renewal timed out after one heartbeat")
			}
			l.cfg.Logger.Log(ctx, level, "feed lease renewal failed", "feed", l.cfg.ID.Feed, "sink", l.cfg.ID.Sink, "error", err)
		}
	case !held:
		if l.lost == "" {
			l.lost = "the lease row no longer names this holder"
		}
	case at.After(l.renewedAt):
		l.renewedAt = at
	}
}

// releaseOnContextEnd clears the row when the lease's context ended: the lease
// lives until its context ends, and a worker shutting down gives it up at once
// rather than leave it to lapse.
func (l *Lease) releaseOnContextEnd() {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.released {
		l.released = true
		l.clearErr = l.cfg.Clear(ctx)
	}
}
