// Package leaserow is the one home of the lease-row kind's timekeeping: the
// heartbeat on a fixed cadence, each renewal bounded by the heartbeat, and
// EnsureHeld's age check. Every store that keeps a lease on its cursor row
// (memfeed, pgfeed) takes the row its own way and hands the rest to Start, so
// the arithmetic feed.LeaseOptions explains exists once.
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
	lost      string    // why the lease is known lost; "" while not
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

// EnsureHeld fails once the lease is known lost, or once the last renewal that
// landed started Usable() ago; see feed.LeaseOptions for why that bound is safe.
// It asks nothing of the store.
func (l *Lease) EnsureHeld(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return &feed.LeaseLostError{ID: l.cfg.ID, Reason: "released"}
	}
	if l.lost != "" {
		return &feed.LeaseLostError{ID: l.cfg.ID, Reason: l.lost}
	}
	if age := l.cfg.Clock.Now().Sub(l.renewedAt); age >= l.cfg.Timings.Usable() {
		return &feed.LeaseLostError{ID: l.cfg.ID, Reason: "last renewal started " + age.String() + " ago, at or past ttl − margin (" + l.cfg.Timings.Usable().String() + ")"}
	}
	return nil
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
// missed.
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
		l.renew(ctx)
		now := l.cfg.Clock.Now()
		next = next.Add(interval)
		if next.Before(now) {
			next = now
		}
		t = l.arm(next)
	}
}

// renew makes one renewal, bounded by the heartbeat. A renewal that fails or
// times out is not yet a lost lease: the age check decides that, a margin
// before the lease can lapse. A renewal abandoned too late to be cancelled can
// still land, but it touches only this holder's row and never moves the expiry
// back, and renewedAt stays at the last renewal seen to land, so EnsureHeld errs
// early, never late.
func (l *Lease) renew(ctx context.Context) {
	at := l.cfg.Clock.Now()
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
		l.lost = "the lease row no longer names this holder"
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
